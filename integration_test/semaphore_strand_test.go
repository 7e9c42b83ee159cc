//go:build unix

package integration_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/internal/workerproc"
	"github.com/pgcoord/pgcoord/semaphore"
)

// Fair admission never strands a job, with real worker processes SIGKILLed at every point of
// the documented worker pattern (package semaphore, "The worker"):
//
//	admitted    after Next, before taking a job
//	taken       after marking a job with the permit's token, before running it
//	running     in the middle of the job's work
//	ran         after the job's work (recorded), before the transaction that finishes it
//	committing  inside that transaction, after its DELETE and semaphore.Done, before COMMIT
//
// Each worker stops at every point and says so; the test kills the first semStrandKills
// workers that reach each point, starting a replacement each time, and lets every other
// one go on. Every queued job must still run to completion (at least once), the queue must
// empty, and every tenant's demand must end at 0. Before a permit of Next only reserved its
// unit of demand, a worker killed after Next had spent the unit: its job stayed queued with
// no demand, and Next answered ErrNoWork for it forever.

const (
	semStrandRole    = "semaphore.jobworker"
	semStrandTenants = 3
	semStrandJobs    = 8 // per tenant
	semStrandLimit   = 2
	semStrandWorkers = 4
	semStrandKills   = 2 // per point
	// semStrandTTL is the workers' permit TTL: a killed worker's permit, its unit of demand
	// and its job come back after it.
	semStrandTTL = time.Second
	// semStrandWork is how long a job's work takes.
	semStrandWork = 20 * time.Millisecond
)

var semStrandPoints = []string{"admitted", "taken", "running", "ran", "committing"}

func init() { workerRoles[semStrandRole] = semStrandWorker }

// semStrandSchema is the application's queue and the record of the jobs' runs.
const semStrandSchema = `
CREATE TABLE sem_jobs (
	id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	tenant       text NOT NULL,
	permit_token bigint -- the permit it was taken under; NULL if never
);
CREATE TABLE sem_job_runs (
	job_id      bigint      NOT NULL,
	token       bigint      NOT NULL,
	worker      text        NOT NULL,
	finished_at timestamptz NOT NULL DEFAULT clock_timestamp()
);`

// semStrandWorker runs jobs with the documented pattern until its stdin closes. Parameter:
// NAME. It says "ready" once it runs; at each point of the pattern "at <point> <key> <token>
// <job>" (job 0 before it took one), after which it waits for "go"; "done <key> <token>
// <job>" when the job's transaction committed; "lost <key> <token> <job>" when its permit
// expired before that.
func semStrandWorker(ctx context.Context, w *workerproc.Worker) error {
	name := w.Param("NAME")
	w.Say("ready")
	for ctx.Err() == nil {
		ran, err := semStrandJob(ctx, w, name)
		if ctx.Err() != nil {
			return nil // stdin closed: the test is over
		}
		if err != nil {
			return err
		}
		if !ran {
			select { // no tenant has a job this worker may run now
			case <-ctx.Done():
			case <-time.After(10 * time.Millisecond):
			}
		}
	}
	return nil
}

// semStrandJob runs one job and reports whether it found one.
func semStrandJob(ctx context.Context, w *workerproc.Worker, name string) (bool, error) {
	p, err := semaphore.Next(ctx, w.Pool, semStrandTTL, nil)
	if errors.Is(err, semaphore.ErrNoWork) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	defer semaphore.Release(context.WithoutCancel(ctx), w.Pool, p) //nolint:errcheck // ErrLost after Done
	var job int64
	pause := func(point string) error {
		w.Say("at %s %s %d %d", point, p.Key, p.Token, job)
		return w.Await("go")
	}
	if err := pause("admitted"); err != nil {
		return false, err
	}
	err = w.Pool.QueryRow(ctx, `UPDATE sem_jobs SET permit_token = $2 WHERE id = (
			SELECT id FROM sem_jobs WHERE tenant = $1
			   AND (permit_token IS NULL OR NOT pgcoord_semaphore_held(tenant, permit_token))
			 ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED)
		RETURNING id`, p.Key, p.Token).Scan(&job)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil // the deferred Release gives the unit back
	}
	if err != nil {
		return false, err
	}
	if err := pause("taken"); err != nil {
		return false, err
	}
	time.Sleep(semStrandWork / 2) // the job's work
	if err := pause("running"); err != nil {
		return false, err
	}
	time.Sleep(semStrandWork / 2)
	if _, err := w.Pool.Exec(ctx, `INSERT INTO sem_job_runs (job_id, token, worker) VALUES ($1, $2, $3)`, job, p.Token, name); err != nil {
		return false, err
	}
	if err := pause("ran"); err != nil {
		return false, err
	}
	err = pgx.BeginFunc(ctx, w.Pool, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `DELETE FROM sem_jobs WHERE id = $1 AND permit_token = $2`, job, p.Token)
		if err == nil && tag.RowsAffected() == 0 {
			err = semaphore.ErrLost // taken again under a later permit: ours expired
		}
		if err != nil {
			return err
		}
		if err := semaphore.Done(ctx, tx, p); err != nil {
			return err
		}
		return pause("committing")
	})
	if errors.Is(err, semaphore.ErrLost) {
		w.Say("lost %s %d %d", p.Key, p.Token, job)
		return true, nil
	}
	if err != nil {
		return false, err
	}
	w.Say("done %s %d %d", p.Key, p.Token, job)
	return true, nil
}

// semStrandLine is a line said by worker name; a closed line means its output ended.
type semStrandLine struct {
	name, text string
}

// semStrandKill is a worker the test killed at a point, holding the permit (key, token) and,
// from "taken" on, job.
type semStrandKill struct {
	point, key string
	token, job int64
}

func TestSemaphoreWorkersKilledAtEveryPointStrandNoJob(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool, schema := workerDB(t, semStrandSchema)
	var tenants []string
	for i := range semStrandTenants {
		tenant := fmt.Sprintf("tenant-%d", i)
		tenants = append(tenants, tenant)
		if err := semaphore.SetLimit(ctx, pool, tenant, semStrandLimit, nil); err != nil {
			t.Fatal(err)
		}
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { // the jobs and their demand commit together
			if _, err := tx.Exec(ctx, `INSERT INTO sem_jobs (tenant) SELECT $1 FROM generate_series(1, $2::int)`, tenant, semStrandJobs); err != nil {
				return err
			}
			return semaphore.AddDemand(ctx, tx, tenant, semStrandJobs, nil)
		})
		if err != nil {
			t.Fatal(err)
		}
	}

	lines := make(chan semStrandLine, 256)
	procs := map[string]*workerproc.Proc{}
	seq := 0
	start := func() {
		t.Helper()
		seq++
		name := fmt.Sprintf("jw%02d", seq)
		p, err := startWorker(t, name, semStrandRole, pgtest.URL(t), schema, map[string]string{"NAME": name})
		if err != nil {
			t.Fatal(err)
		}
		procs[name] = p
		go func() {
			for l := range p.Lines() {
				select {
				case lines <- semStrandLine{name, l}:
				case <-ctx.Done():
					return
				}
			}
		}()
	}
	for range semStrandWorkers {
		start()
	}

	kills := map[string]int{}
	var killed []semStrandKill
	var done, lost int
	remaining, progressAt := -1, time.Now()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for finished := false; !finished; {
		select {
		case l := <-lines:
			f := strings.Fields(l.text)
			switch {
			case len(f) == 0:
			case f[0] == "error":
				t.Fatalf("worker %s: %s; stderr: %s", l.name, l.text, procs[l.name].Stderr())
			case f[0] == "done":
				done++
			case f[0] == "lost":
				lost++
			case f[0] == "at" && len(f) == 5:
				point, key := f[1], f[2]
				token, _ := strconv.ParseInt(f[3], 10, 64)
				job, _ := strconv.ParseInt(f[4], 10, 64)
				p := procs[l.name]
				if kills[point] >= semStrandKills {
					if err := p.Send("go"); err != nil {
						t.Fatal(err)
					}
					continue
				}
				if err := p.Signal(syscall.SIGKILL); err != nil {
					t.Fatal(err)
				}
				if err := p.Wait(pgtest.WaitLimit); err == nil {
					t.Fatalf("worker %s exited cleanly after SIGKILL", l.name)
				}
				kills[point]++
				killed = append(killed, semStrandKill{point: point, key: key, token: token, job: job})
				start()
			}
		case <-tick.C:
			var n int
			if err := pool.QueryRow(ctx, `SELECT count(*) FROM sem_jobs`).Scan(&n); err != nil {
				t.Fatal(err)
			}
			if n != remaining {
				remaining, progressAt = n, time.Now()
			}
			if n == 0 {
				finished = true
				break
			}
			// A job finishes every few tens of milliseconds, and a killed worker's job comes
			// back after semStrandTTL: this long without one finishing is a stranded job.
			if time.Since(progressAt) > pgtest.WaitLimit {
				t.Fatalf("%d jobs still queued, none finished for %v (kills %v):\n%s", n, pgtest.WaitLimit, kills,
					semStrandState(t, pool, tenants))
			}
		}
	}

	for _, point := range semStrandPoints {
		if kills[point] != semStrandKills {
			t.Errorf("%d workers killed at %q, want %d: the test did not kill at every point", kills[point], point, semStrandKills)
		}
	}
	// Every job ran to completion, at least once; a job whose worker was killed after taking
	// it ran (again) under a later permit.
	var missing []int64
	rows, err := pool.Query(ctx, `SELECT j.id FROM generate_series(1, $1::int) AS j(id)
		WHERE NOT EXISTS (SELECT FROM sem_job_runs r WHERE r.job_id = j.id) ORDER BY j.id`, semStrandTenants*semStrandJobs)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		missing = append(missing, id)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if len(missing) > 0 {
		t.Errorf("jobs %v never ran to completion", missing)
	}
	for _, k := range killed {
		if k.job == 0 {
			continue
		}
		var later bool
		if err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT FROM sem_job_runs WHERE job_id = $1 AND token > $2)`, k.job, k.token).Scan(&later); err != nil {
			t.Fatal(err)
		}
		if !later {
			t.Errorf("job %d, whose worker was killed at %q under token %d, never ran under a later permit", k.job, k.point, k.token)
		}
	}
	for _, tenant := range tenants {
		s, err := semaphore.Get(ctx, pool, tenant)
		if err != nil {
			t.Fatal(err)
		}
		if s.Demand != 0 {
			t.Errorf("%s: demand %d after every job was done, want 0", tenant, s.Demand)
		}
	}
	var runs int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM sem_job_runs`).Scan(&runs); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d jobs, %d runs to completion (%d done, %d found their permit lost), %d workers killed: %v",
		semStrandTenants*semStrandJobs, runs, done, lost, len(killed), kills)
}

// semStrandState describes the queue and the tenants' semaphores, for a failure message.
func semStrandState(t *testing.T, pool *pgxpool.Pool, tenants []string) string {
	t.Helper()
	var b strings.Builder
	rows, err := pool.Query(t.Context(), `SELECT id, tenant, coalesce(permit_token, 0),
		permit_token IS NOT NULL AND pgcoord_semaphore_held(tenant, permit_token) FROM sem_jobs ORDER BY id`)
	if err != nil {
		return err.Error()
	}
	defer rows.Close()
	for rows.Next() {
		var id, token int64
		var tenant string
		var held bool
		if err := rows.Scan(&id, &tenant, &token, &held); err != nil {
			return err.Error()
		}
		fmt.Fprintf(&b, "  job %d of %s: taken under token %d (held: %v)\n", id, tenant, token, held)
	}
	for _, tenant := range tenants {
		s, err := semaphore.Get(t.Context(), pool, tenant)
		if err != nil {
			return err.Error()
		}
		fmt.Fprintf(&b, "  %s: demand %d, held %d, expired %d\n", tenant, s.Demand, s.Held, s.Expired)
	}
	return b.String()
}
