//go:build unix

package integration_test

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

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

func TestSemaphoreWithRealProcessesAndKills(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool, schema := workerDB(t, semSchema)
	r := &semRig{t: t, pool: pool, url: pgtest.URL(t), schema: schema, procs: map[string]*workerproc.Proc{}, holding: map[string]string{}, killed: map[string]bool{}}
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
