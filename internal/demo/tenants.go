//go:build unix

package demo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgcoord/pgcoord/internal/workerproc"
	"github.com/pgcoord/pgcoord/semaphore"
)

// Incident 3, tenant starvation. Four workers share one job queue. Tenant "big" queues
// tenantBigJobs jobs, and a moment later tenant "small" queues tenantSmallJobs.
//
//   - fifo: workers take the oldest job. Small's jobs wait behind all of big's.
//   - fair: each tenant may hold at most tenantLimit of the workers (a semaphore per
//     tenant), and a free worker asks semaphore.Next which tenant to serve: the one with
//     work, under its limit, furthest behind its share. Small's jobs start at once.

const (
	tenantRole      = "tenants"
	tenantWorkers   = 4
	tenantLimit     = 2
	tenantBigJobs   = 120
	tenantSmallJobs = 8
	// tenantJob is how long one job takes.
	tenantJob = 30 * time.Millisecond
	// tenantIdle is how long a worker pauses when there is no work.
	tenantIdle = 5 * time.Millisecond
)

// Tenant modes.
const (
	queueFIFO = "fifo"
	queueFair = "fair"
)

// TenantResult is incident 3's outcome per mode.
type TenantResult struct {
	// SmallMaxWait is the longest a job of the small tenant waited to start.
	SmallMaxWait map[string]time.Duration
	// BigShare is big's share of the worker time while small had work (queued or running).
	BigShare map[string]float64
	// BigMaxConcurrent is the most jobs of big that ran at once.
	BigMaxConcurrent map[string]int
	// SmallStartedBeforeBigDrained is whether small's first job started before big's last.
	SmallStartedBeforeBigDrained map[string]bool
}

func (d *demo) tenants(ctx context.Context) (TenantResult, error) {
	res := TenantResult{SmallMaxWait: map[string]time.Duration{}, BigShare: map[string]float64{},
		BigMaxConcurrent: map[string]int{}, SmallStartedBeforeBigDrained: map[string]bool{}}
	for _, mode := range []string{queueFIFO, queueFair} {
		d.step("incident 3, %s: tenant big queues %d jobs, then small queues %d, for %d workers",
			mode, tenantBigJobs, tenantSmallJobs, tenantWorkers)
		if err := d.tenantRound(ctx, mode); err != nil {
			return res, fmt.Errorf("%s: %w", mode, err)
		}
		var wait, share float64
		var concurrent int
		var before bool
		err := d.pool.QueryRow(ctx, `
			WITH runs AS (SELECT * FROM demo_job_runs WHERE mode = $1),
			small AS (SELECT min(enqueued_at) AS s, max(finished_at) AS e, min(started_at) AS first_start
			          FROM runs WHERE tenant = 'small'),
			busy AS (SELECT r.tenant, extract(epoch FROM least(r.finished_at, small.e) - greatest(r.started_at, small.s)) AS secs
			         FROM runs r, small WHERE r.finished_at > small.s AND r.started_at < small.e)
			SELECT
				(SELECT extract(epoch FROM max(started_at - enqueued_at)) FROM runs WHERE tenant = 'small')::float8,
				(SELECT coalesce(sum(secs) FILTER (WHERE tenant = 'big') / nullif(sum(secs), 0), 0) FROM busy)::float8,
				(SELECT max((SELECT count(*) FROM runs o WHERE o.tenant = 'big'
				             AND o.started_at <= r.started_at AND o.finished_at > r.started_at))
				 FROM runs r WHERE r.tenant = 'big')::int,
				(SELECT first_start FROM small) < (SELECT max(started_at) FROM runs WHERE tenant = 'big')`,
			mode).Scan(&wait, &share, &concurrent, &before)
		if err != nil {
			return res, err
		}
		res.SmallMaxWait[mode], res.BigShare[mode] = time.Duration(wait*float64(time.Second)), share
		res.BigMaxConcurrent[mode], res.SmallStartedBeforeBigDrained[mode] = concurrent, before
	}
	return res, nil
}

// tenantRound runs the workers in one mode until both tenants' jobs are done.
func (d *demo) tenantRound(ctx context.Context, mode string) error {
	var procs []*workerproc.Proc
	for i := 1; i <= tenantWorkers; i++ {
		name := "worker-" + strconv.Itoa(i)
		p, err := d.start(name, tenantRole, map[string]string{"MODE": mode, "NAME": name})
		if err != nil {
			return err
		}
		defer p.Stop(5 * time.Second)
		procs = append(procs, p)
	}
	g := workerproc.NewGroup(procs...)
	for range procs {
		if _, err := g.Next(stepTimeout, "ready"); err != nil {
			return err
		}
	}
	if mode == queueFair {
		for _, tenant := range []string{"big", "small"} {
			if err := semaphore.SetLimit(ctx, d.pool, tenant, tenantLimit, nil); err != nil {
				return err
			}
		}
	}
	for _, t := range []struct {
		tenant string
		jobs   int
	}{{"big", tenantBigJobs}, {"small", tenantSmallJobs}} {
		err := pgx.BeginFunc(ctx, d.pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `INSERT INTO demo_jobs (mode, tenant) SELECT $1, $2 FROM generate_series(1, $3::int)`,
				mode, t.tenant, t.jobs); err != nil {
				return err
			}
			if mode == queueFair { // the semaphore learns of the work in the same transaction
				return semaphore.AddDemand(ctx, tx, t.tenant, int64(t.jobs), nil)
			}
			return nil
		})
		if err != nil {
			return err
		}
		time.Sleep(2 * tenantJob) // small arrives a moment later: big's jobs are older
	}
	deadline := time.Now().Add(stepTimeout)
	for {
		var done int
		if err := d.pool.QueryRow(ctx, `SELECT count(*) FROM demo_job_runs WHERE mode = $1`, mode).Scan(&done); err != nil {
			return err
		}
		if done == tenantBigJobs+tenantSmallJobs {
			g.Send("stop")
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d of %d jobs done after %v", done, tenantBigJobs+tenantSmallJobs, stepTimeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// tenantWorker is one worker: it says "ready", then runs jobs until "stop". fifo: the
// oldest job of the queue. fair: a permit from semaphore.Next, then the oldest job of the
// permit's tenant, done with semaphore.Done.
func tenantWorker(ctx context.Context, w *workerproc.Worker) error {
	mode, name := w.Param("MODE"), w.Param("NAME")
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		_ = w.Await("stop")
		cancel()
	}()
	w.Say("ready")
	for ctx.Err() == nil {
		var ran bool
		var err error
		if mode == queueFair {
			ran, err = runFairJob(ctx, w, name)
		} else {
			ran, err = runJob(ctx, w, mode, "", name, nil)
		}
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			return err
		}
		if !ran {
			time.Sleep(tenantIdle)
		}
	}
	return nil
}

// runFairJob runs one job of the tenant semaphore.Next chooses, under its permit: the
// permit reserves one unit of the tenant's demand, which Done consumes in the transaction
// that removes the job; the deferred Release gives it back if the job was not done.
func runFairJob(ctx context.Context, w *workerproc.Worker, name string) (bool, error) {
	p, err := semaphore.Next(ctx, w.Pool, 10*time.Second, nil)
	if errors.Is(err, semaphore.ErrNoWork) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	defer func() { _ = semaphore.Release(context.WithoutCancel(ctx), w.Pool, p) }() // ErrLost after Done
	return runJob(ctx, w, queueFair, p.Key, name, func(tx pgx.Tx) error { return semaphore.Done(ctx, tx, p) })
}

// runJob takes the oldest job of the mode's queue (of tenant, if not empty), runs it and
// records it, with done (if not nil), in one transaction that holds the job's row lock
// while it runs (the jobs are short): a worker that dies mid-job leaves it queued. It
// returns false if there was no job.
func runJob(ctx context.Context, w *workerproc.Worker, mode, tenant, name string, done func(pgx.Tx) error) (bool, error) {
	ran := false
	err := pgx.BeginFunc(ctx, w.Pool, func(tx pgx.Tx) error {
		var id int64
		var jobTenant string
		var enqueued, started time.Time
		err := tx.QueryRow(ctx, `SELECT id, tenant, enqueued_at, clock_timestamp() FROM demo_jobs
			WHERE mode = $1 AND ($2 = '' OR tenant = $2)
			ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED`, mode, tenant).Scan(&id, &jobTenant, &enqueued, &started)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		if err != nil {
			return err
		}
		time.Sleep(tenantJob) // the job's work
		if _, err := tx.Exec(ctx, `DELETE FROM demo_jobs WHERE id = $1`, id); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO demo_job_runs (mode, tenant, job_id, worker, enqueued_at, started_at, finished_at)
			VALUES ($1, $2, $3, $4, $5, $6, clock_timestamp())`, mode, jobTenant, id, name, enqueued, started); err != nil {
			return err
		}
		if done != nil {
			if err := done(tx); err != nil {
				return err
			}
		}
		ran = true
		return nil
	})
	return ran, err
}

func (r TenantResult) print(out io.Writer) {
	fmt.Fprintf(out, `
3. Tenant starvation: %d workers; tenant big queues %d jobs of %v, then small queues %d.

                                      one FIFO queue    semaphore (%d per tenant) + fair admission
   small's longest wait for a worker  %-17s %s
   big's share of the workers         %-17s %s
   (while small had work)
`, tenantWorkers, tenantBigJobs, tenantJob, tenantSmallJobs, tenantLimit,
		r.SmallMaxWait[queueFIFO].Round(time.Millisecond), r.SmallMaxWait[queueFair].Round(time.Millisecond),
		fmt.Sprintf("%.0f%%", 100*r.BigShare[queueFIFO]), fmt.Sprintf("%.0f%%", 100*r.BigShare[queueFair]))
}
