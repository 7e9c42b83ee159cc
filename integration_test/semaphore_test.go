//go:build unix

package integration_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/internal/workerproc"
	"github.com/pgcoord/pgcoord/semaphore"
)

// Per-tenant semaphores with real processes and crashes. Worker processes loop over two
// keys of limit 2: take a permit (TryAcquire of either key; when both are full, Acquire on
// one), hold it for a random time with heartbeats (Renew every third of the TTL), release
// it. Meanwhile the test SIGKILLs a worker that holds a permit every second or so, and
// starts a replacement. After about 7 seconds the survivors are told to quit.
//
// Two histories are kept, both by the database clock:
//
//   - The workers' own (sem_history): each grant, renewal and release is recorded in the
//     same transaction as the semaphore call (TryAcquire, Renew and Release take the
//     worker's pgx.Tx), so a SIGKILL cannot separate a permit from its record. A permit
//     from Acquire, which waits on a connection of its own, is recorded with its first
//     renewal, a moment later.
//   - The database's (sem_audit): a trigger on pgcoord_semaphore_permits, installed by the
//     test in its schema, records every permit row's insert, renewal and delete with
//     clock_timestamp(), whatever path made it — including the reclaim of a dead worker's
//     permit by another worker's admission attempt.
//
// A permit's life is [inserted_at, min(deleted_at, expires_at)): inserted_at is read inside
// the admitting transaction after the permits were counted, deleted_at inside the
// releasing transaction before it committed, and expires_at is the last renewed expiry. So
// the admission that came last among overlapping lives counted all the others as live, and
// a correct semaphore can never show more than 2 overlapping lives per key. The test proves
// from the audit that it did not; that every permit a killed worker had not released was
// deleted only after its expiry, as expired, by another worker's admission attempt, and —
// while workers were running — within a bound of its expiry; and that the workers' history
// agrees with the audit.

const (
	semRole    = "semaphore.worker"
	semLimit   = 2
	semTTL     = 500 * time.Millisecond
	semRun     = 7 * time.Second
	semWorkers = 5
	// semReclaimBound bounds how long a dead worker's slot stays unused after its expiry
	// while live workers want it: one Acquire timeout (semTTL) to move to the other key,
	// plus slack for a loaded machine.
	semReclaimBound = semTTL + 2*time.Second
)

var semKeys = []string{"tenant-a", "tenant-b"}

func init() { workerRoles[semRole] = semaphoreWorker }

// semSchema is the test's own tables and the audit trigger, in the test's schema.
const semSchema = `
CREATE TABLE sem_history (
	key        text        NOT NULL,
	token      bigint      NOT NULL,
	holder     text        NOT NULL,
	worker     text        NOT NULL,
	started_at timestamptz NOT NULL,
	expires_at timestamptz NOT NULL,
	ended_at   timestamptz,
	PRIMARY KEY (key, token)
);

CREATE TABLE sem_audit (
	key         text        NOT NULL,
	token       bigint      NOT NULL,
	holder      text        NOT NULL,
	inserted_at timestamptz NOT NULL,
	expires_at  timestamptz NOT NULL,
	deleted_at  timestamptz,
	-- Deleted as expired by the deleting transaction's clock: a reclaim by an admission
	-- attempt (a release deletes a live permit).
	reclaimed   boolean,
	PRIMARY KEY (key, token)
);

CREATE FUNCTION sem_audit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	IF TG_OP = 'INSERT' THEN
		INSERT INTO sem_audit (key, token, holder, inserted_at, expires_at)
		VALUES (NEW.key, NEW.fence_token, NEW.holder, clock_timestamp(), NEW.expires_at);
	ELSIF TG_OP = 'UPDATE' THEN
		UPDATE sem_audit SET expires_at = NEW.expires_at WHERE key = NEW.key AND token = NEW.fence_token;
	ELSE
		UPDATE sem_audit SET deleted_at = clock_timestamp(), reclaimed = OLD.expires_at <= now()
		 WHERE key = OLD.key AND token = OLD.fence_token;
	END IF;
	RETURN NULL;
END
$$;

CREATE TRIGGER sem_audit AFTER INSERT OR UPDATE OR DELETE ON pgcoord_semaphore_permits
	FOR EACH ROW EXECUTE FUNCTION sem_audit();
`

// semaphoreWorker loops taking, holding and releasing permits of semKeys until told "quit"
// on stdin (or stdin closes). Parameters: NAME (its name; its holders are NAME/1, NAME/2,
// ...), SEED.
//
// It says:
//   - "ready" once it runs;
//   - "acquired <key> <token>" when a permit and its record committed;
//   - "released <key> <token>" when the release and its record committed;
//   - "lost <key> <token>" when a renewal or release found the permit gone;
//   - "bye" when it stops after "quit", holding nothing.
func semaphoreWorker(ctx context.Context, w *workerproc.Worker) error {
	name := w.Param("NAME")
	seed, err := strconv.ParseUint(w.Param("SEED"), 10, 64)
	if err != nil {
		return err
	}
	rng := rand.New(rand.NewPCG(seed, 7))
	quit := make(chan struct{})
	go func() {
		defer close(quit)
		for {
			if cmd, err := w.Next(); err != nil || cmd == "quit" {
				return
			}
		}
	}()
	w.Say("ready")
	for n := 1; ; n++ {
		select {
		case <-quit:
			w.Say("bye")
			return nil
		default:
		}
		holder := fmt.Sprintf("%s/%d", name, n)
		p, ok, err := semTake(ctx, w.Pool, holder, rng)
		if err != nil {
			return err
		}
		if !ok {
			continue
		}
		w.Say("acquired %s %d", p.Key, p.Token)
		if err := semHold(ctx, w, p, time.Duration(rng.Int64N(int64(2*semTTL))), quit); err != nil {
			return err
		}
	}
}

// semTake takes a permit of one of semKeys and records it, or reports that it got none
// this time.
func semTake(ctx context.Context, pool *pgxpool.Pool, holder string, rng *rand.Rand) (semaphore.Permit, bool, error) {
	opts := &semaphore.AcquireOpts{Holder: holder, PollInterval: 100 * time.Millisecond}
	order := rng.Perm(len(semKeys))
	for _, i := range order {
		var p semaphore.Permit
		granted := false
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			var err error
			p, err = semaphore.TryAcquire(ctx, tx, semKeys[i], semLimit, semTTL, opts)
			if errors.Is(err, semaphore.ErrFull) {
				return nil
			}
			if err != nil {
				return err
			}
			granted = true
			return semRecord(ctx, tx, p)
		})
		if err != nil || granted {
			return p, granted, err
		}
	}
	// Both full: wait in line for one, at most a TTL, then look at both again.
	actx, cancel := context.WithTimeout(ctx, semTTL)
	defer cancel()
	p, err := semaphore.Acquire(actx, pool, semKeys[order[0]], semLimit, semTTL, opts)
	if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
		return p, false, nil
	}
	if err != nil {
		return p, false, err
	}
	// Record it with a renewal, which also proves it is still held.
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		r, err := semaphore.Renew(ctx, tx, p, semTTL, nil)
		if err != nil {
			return err
		}
		p = r
		return semRecord(ctx, tx, p)
	})
	if errors.Is(err, semaphore.ErrLost) {
		return p, false, nil
	}
	return p, err == nil, err
}

func semRecord(ctx context.Context, tx pgx.Tx, p semaphore.Permit) error {
	worker, _, _ := strings.Cut(p.Holder, "/")
	_, err := tx.Exec(ctx, `INSERT INTO sem_history (key, token, holder, worker, started_at, expires_at)
		VALUES ($1, $2, $3, $4, clock_timestamp(), $5)`, p.Key, p.Token, p.Holder, worker, p.ExpiresAt)
	return err
}

// semHold works for d, renewing every third of the TTL, then releases. Each renewal and the
// release commit with their record.
func semHold(ctx context.Context, w *workerproc.Worker, p semaphore.Permit, d time.Duration, quit <-chan struct{}) error {
	done := time.After(d)
	tick := time.NewTicker(semTTL / 3)
	defer tick.Stop()
	for {
		select {
		case <-done:
		case <-quit:
		case <-tick.C:
			err := pgx.BeginFunc(ctx, w.Pool, func(tx pgx.Tx) error {
				r, err := semaphore.Renew(ctx, tx, p, semTTL, nil)
				if err != nil {
					return err
				}
				p = r
				_, err = tx.Exec(ctx, `UPDATE sem_history SET expires_at = $3 WHERE key = $1 AND token = $2`, p.Key, p.Token, p.ExpiresAt)
				return err
			})
			if errors.Is(err, semaphore.ErrLost) {
				w.Say("lost %s %d", p.Key, p.Token)
				return nil
			}
			if err != nil {
				return err
			}
			continue
		}
		break
	}
	err := pgx.BeginFunc(ctx, w.Pool, func(tx pgx.Tx) error {
		if err := semaphore.Release(ctx, tx, p); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `UPDATE sem_history SET ended_at = clock_timestamp() WHERE key = $1 AND token = $2`, p.Key, p.Token)
		return err
	})
	switch {
	case errors.Is(err, semaphore.ErrLost):
		w.Say("lost %s %d", p.Key, p.Token)
		return nil
	case err != nil:
		return err
	}
	w.Say("released %s %d", p.Key, p.Token)
	return nil
}

// semRig is the test's view of the worker processes.
type semRig struct {
	t           *testing.T
	pool        *pgxpool.Pool
	url, schema string
	mu          sync.Mutex
	procs       map[string]*workerproc.Proc
	holding     map[string]string // worker -> "key token" it said it holds
	killed      map[string]bool
	errs        []string
	seq         int
}

func (r *semRig) start() string {
	r.t.Helper()
	r.mu.Lock()
	r.seq++
	name := fmt.Sprintf("w%02d", r.seq)
	r.mu.Unlock()
	p, err := startWorker(r.t, name, semRole, r.url, r.schema, map[string]string{"NAME": name, "SEED": strconv.Itoa(r.seq)})
	if err != nil {
		r.t.Fatal(err)
	}
	if _, err := p.Expect(pgtest.WaitLimit, "ready"); err != nil {
		r.t.Fatal(err)
	}
	r.mu.Lock()
	r.procs[name] = p
	r.mu.Unlock()
	go func() {
		for line := range p.Lines() {
			f := strings.Fields(line)
			r.mu.Lock()
			switch {
			case len(f) == 3 && f[0] == "acquired":
				r.holding[name] = f[1] + " " + f[2]
			case len(f) == 3 && (f[0] == "released" || f[0] == "lost"):
				delete(r.holding, name)
			case f[0] == "error":
				r.errs = append(r.errs, name+": "+line+"; stderr: "+p.Stderr())
			}
			r.mu.Unlock()
		}
	}()
	return name
}

// victim returns a worker that holds a permit (as far as its lines tell), or "".
func (r *semRig) victim(rng *rand.Rand) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var names []string
	for n := range r.holding {
		if !r.killed[n] {
			names = append(names, n)
		}
	}
	if len(names) == 0 {
		return ""
	}
	slices.Sort(names)
	return names[rng.IntN(len(names))]
}

// auditRow is one permit's life as the database recorded it.
type auditRow struct {
	key, holder           string
	token                 int64
	inserted, expires     time.Time
	deleted               *time.Time
	reclaimed             bool // deleted as expired, by an admission attempt
	worker                string
	recorded, releasedRec bool // in the worker's history; released there
}

func (a auditRow) end() time.Time {
	if a.deleted != nil && a.deleted.Before(a.expires) {
		return *a.deleted
	}
	return a.expires
}

func TestSemaphoreWithRealProcessesAndKills(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pgtest.Pool(t)
	r := &semRig{t: t, pool: pool, url: pgtest.URL(t), procs: map[string]*workerproc.Proc{}, holding: map[string]string{}, killed: map[string]bool{}}
	if err := pool.QueryRow(ctx, "SELECT current_schema()").Scan(&r.schema); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, semSchema); err != nil {
		t.Fatal(err)
	}
	for range semWorkers {
		r.start()
	}

	// The run: kill a worker that holds a permit every 0.6-1.2s, and replace it.
	rng := rand.New(rand.NewPCG(1, 2))
	runEnd := time.Now().Add(semRun)
	var kills int
	for time.Now().Before(runEnd) {
		time.Sleep(time.Duration(600+rng.IntN(600)) * time.Millisecond) // the scenario's pace
		v := r.victim(rng)
		if v == "" {
			continue
		}
		r.mu.Lock()
		p := r.procs[v]
		r.killed[v] = true
		r.mu.Unlock()
		if err := p.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		if err := p.Wait(pgtest.WaitLimit); err == nil {
			t.Fatalf("worker %s exited cleanly after SIGKILL", v)
		}
		kills++
		r.start()
	}
	var quitAt time.Time
	if err := pool.QueryRow(ctx, "SELECT clock_timestamp()").Scan(&quitAt); err != nil {
		t.Fatal(err)
	}
	r.mu.Lock()
	var survivors []*workerproc.Proc
	for n, p := range r.procs {
		if !r.killed[n] {
			survivors = append(survivors, p)
		}
	}
	r.mu.Unlock()
	for _, p := range survivors {
		if err := p.Send("quit"); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range survivors {
		if err := p.Wait(pgtest.WaitLimit); err != nil {
			t.Fatalf("worker %s: %v; stderr: %s", p.Name(), err, p.Stderr())
		}
	}
	r.mu.Lock()
	if len(r.errs) > 0 {
		t.Fatalf("worker errors: %v", r.errs)
	}
	r.mu.Unlock()

	// The killed workers' last permits are still in the table. Once they expired, each
	// key gives all its slots again, reclaiming them.
	deadline := time.Now().Add(pgtest.WaitLimit)
	for _, k := range semKeys {
		for {
			s, err := semaphore.Get(ctx, pool, k)
			if err != nil {
				t.Fatal(err)
			}
			if s.Held == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s still has %d live permits after every worker is gone", k, s.Held)
			}
			time.Sleep(10 * time.Millisecond)
		}
		for range semLimit {
			p, err := semaphore.TryAcquire(ctx, pool, k, semLimit, time.Minute, &semaphore.AcquireOpts{Holder: "final/" + strconv.FormatInt(time.Now().UnixNano(), 10)})
			if err != nil {
				t.Fatalf("%s: a slot did not come back: %v", k, err)
			}
			if err := semaphore.Release(ctx, pool, p); err != nil {
				t.Fatal(err)
			}
		}
	}

	checkSemaphoreHistory(t, r, quitAt, kills)
}

func checkSemaphoreHistory(t *testing.T, r *semRig, quitAt time.Time, kills int) {
	t.Helper()
	ctx := t.Context()
	rows, err := r.pool.Query(ctx, `
		SELECT a.key, a.holder, a.token, a.inserted_at, a.expires_at, a.deleted_at, coalesce(a.reclaimed, false),
		       coalesce(h.worker, ''), h.key IS NOT NULL, h.ended_at IS NOT NULL,
		       h.key IS NULL OR (h.holder = a.holder AND h.started_at >= a.inserted_at)
		  FROM sem_audit a LEFT JOIN sem_history h USING (key, token)
		 ORDER BY a.key, a.token`)
	if err != nil {
		t.Fatal(err)
	}
	var audit []auditRow
	for rows.Next() {
		var a auditRow
		var consistent bool
		if err := rows.Scan(&a.key, &a.holder, &a.token, &a.inserted, &a.expires, &a.deleted, &a.reclaimed, &a.worker, &a.recorded, &a.releasedRec, &consistent); err != nil {
			t.Fatal(err)
		}
		if !consistent {
			t.Errorf("%s token %d: the worker's record disagrees with the audit (holder %s)", a.key, a.token, a.holder)
		}
		audit = append(audit, a)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	var orphans int
	if err := r.pool.QueryRow(ctx, `SELECT count(*) FROM sem_history h WHERE NOT EXISTS (SELECT FROM sem_audit a WHERE a.key = h.key AND a.token = h.token)`).Scan(&orphans); err != nil {
		t.Fatal(err)
	}
	if orphans > 0 {
		t.Errorf("%d permits in the workers' history were never granted", orphans)
	}

	byKey := map[string][]auditRow{}
	for _, a := range audit {
		byKey[a.key] = append(byKey[a.key], a)
	}
	var deadPermits, promptlyChecked int
	var worstLag time.Duration
	for _, k := range semKeys {
		as := byKey[k]
		// Tokens increase in admission order.
		for i := 1; i < len(as); i++ {
			if as[i].inserted.Before(as[i-1].inserted) {
				t.Errorf("%s: token %d admitted at %v, before token %d at %v", k, as[i].token, as[i].inserted, as[i-1].token, as[i-1].inserted)
			}
		}
		// At most semLimit live at any instant.
		type event struct {
			at    time.Time
			delta int
		}
		var evs []event
		for _, a := range as {
			evs = append(evs, event{a.inserted, +1}, event{a.end(), -1})
		}
		slices.SortFunc(evs, func(x, y event) int {
			if c := x.at.Compare(y.at); c != 0 {
				return c
			}
			return x.delta - y.delta
		})
		live, most := 0, 0
		for _, e := range evs {
			live += e.delta
			if live > semLimit {
				t.Errorf("%s: %d permits live at %v, limit %d", k, live, e.at, semLimit)
			}
			most = max(most, live)
		}
		if most < semLimit {
			t.Errorf("%s: never reached its limit: the run did not contend", k)
		}
		// Every permit of a killed worker that it had not released came back after its
		// TTL: deleted after its expiry, as expired, by another worker's admission attempt.
		for _, a := range as {
			worker, _, _ := strings.Cut(a.holder, "/")
			if !r.killed[worker] || a.releasedRec {
				continue
			}
			deadPermits++
			if a.deleted != nil && !a.reclaimed {
				t.Errorf("%s token %d of killed worker %s was deleted while live, though it never released it", k, a.token, worker)
				continue
			}
			if a.deleted == nil {
				t.Errorf("%s token %d of killed worker %s was never reclaimed", k, a.token, worker)
				continue
			}
			if a.deleted.Before(a.expires) {
				t.Errorf("%s token %d of killed worker %s was reclaimed at %v, before it expired at %v", k, a.token, worker, *a.deleted, a.expires)
			}
			if a.expires.Before(quitAt.Add(-semReclaimBound)) {
				promptlyChecked++
				lag := a.deleted.Sub(a.expires)
				worstLag = max(worstLag, lag)
				if lag > semReclaimBound {
					t.Errorf("%s token %d of killed worker %s: its slot came back %v after it expired, more than %v", k, a.token, worker, lag, semReclaimBound)
				}
			}
		}
		t.Logf("%s: %d permits, at most %d live at once", k, len(as), most)
	}
	t.Logf("%d kills; %d permits that killed workers never released, all reclaimed after their expiry (%d while workers ran, the slowest %v after expiry)",
		kills, deadPermits, promptlyChecked, worstLag)
	if deadPermits < 3 {
		t.Errorf("only %d permits of killed workers: the test proves little about reclaim", deadPermits)
	}
}
