package main

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/examples/internal/exampletest"
	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/semaphore"
)

func TestMain(m *testing.M) { exampletest.Main(m, main) }

// history records what the jobs did, as they ran.
type history struct {
	mu             sync.Mutex
	running, most  map[string]int // per tenant: jobs running now, and the most at once
	runs           map[int64]int  // job id -> times it ran
	started        map[string]int // per tenant: jobs started
	bigStartedWhen int            // big's jobs started when small's last job finished
}

// handle is the job function: it counts the job in, works a little, and counts it out.
func (h *history) handle(smallJobs int) func(ctx context.Context, j job) error {
	return func(ctx context.Context, j job) error {
		h.mu.Lock()
		h.running[j.Tenant]++
		h.most[j.Tenant] = max(h.most[j.Tenant], h.running[j.Tenant])
		h.runs[j.ID]++
		h.started[j.Tenant]++
		h.mu.Unlock()

		time.Sleep(10 * time.Millisecond) // the job's work

		h.mu.Lock()
		defer h.mu.Unlock()
		h.running[j.Tenant]--
		if j.Tenant == "small" && h.started["small"] == smallJobs && h.running["small"] == 0 {
			h.bigStartedWhen = h.started["big"]
		}
		return nil
	}
}

// Tenant big floods the queue with 100 jobs, then small enqueues 10; six workers serve
// them. (a) No tenant ever runs more jobs at once than its limit; (b) small's jobs are all
// done while most of big's are still queued; (c) every job runs exactly once.
func TestFloodingTenantDoesNotStarveOthers(t *testing.T) {
	t.Parallel()
	const bigJobs, smallJobs = 100, 10
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pool := newPool(t)
	for _, q := range []struct {
		tenant string
		jobs   int
	}{{"big", bigJobs}, {"small", smallJobs}} { // big floods the queue first
		payloads := make([]string, q.jobs)
		for i := range payloads {
			payloads[i] = fmt.Sprint(i)
		}
		if err := enqueue(ctx, pool, q.tenant, payloads...); err != nil {
			t.Fatal(err)
		}
	}

	h := &history{running: map[string]int{}, most: map[string]int{}, runs: map[int64]int{}, started: map[string]int{}}
	limits := map[string]share{"big": {Limit: 2, Weight: 1}, "small": {Limit: 3, Weight: 2}}
	done := make(chan error)
	go func() {
		done <- run(ctx, pool, config{Workers: 6, Tenants: limits, TTL: 30 * time.Second, Idle: 5 * time.Millisecond,
			Handle: h.handle(smallJobs), Logger: slog.New(slog.DiscardHandler)})
	}()
	exampletest.WaitFor(t, "every job finished", func(context.Context) (bool, error) {
		return exampletest.Count(t, pool, `SELECT count(*) FROM jobs WHERE finished_at IS NOT NULL`) == bigJobs+smallJobs, nil
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("run: %v", err)
	}

	h.mu.Lock()
	defer h.mu.Unlock()
	for tenant, l := range limits {
		if h.most[tenant] > l.Limit {
			t.Errorf("tenant %s ran %d jobs at once, over its limit of %d", tenant, h.most[tenant], l.Limit)
		}
	}
	if h.most["big"] != limits["big"].Limit {
		t.Errorf("big ran at most %d jobs at once, never its limit %d: the test did not load the pool", h.most["big"], limits["big"].Limit)
	}
	if h.bigStartedWhen == 0 || h.bigStartedWhen >= bigJobs/2 {
		t.Errorf("small's last job finished when %d of big's %d jobs had started; want it done while most of big's queue waits",
			h.bigStartedWhen, bigJobs)
	}
	t.Logf("small's jobs were done when %d of big's %d had started", h.bigStartedWhen, bigJobs)
	rows, err := pool.Query(context.Background(), `SELECT id FROM jobs`)
	if err != nil {
		t.Fatal(err)
	}
	ids := 0
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		ids++
		if h.runs[id] != 1 {
			t.Errorf("job %d ran %d times, want 1", id, h.runs[id])
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if ids != bigJobs+smallJobs || len(h.runs) != ids {
		t.Errorf("%d jobs in the queue, %d ran; want %d", ids, len(h.runs), bigJobs+smallJobs)
	}
}

// newPool returns a pool on a fresh schema with pgcoord and the example's tables.
func newPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool := pgtest.Pool(t)
	if err := createTables(context.Background(), pgtest.Direct(t, pool), "tenant-pool", schema); err != nil {
		t.Fatal(err)
	}
	return pool
}

// A worker that dies strands no job. One "dies" right after Next, holding a unit of
// demand but no job; another after taking a job. Their permits (TTL 1s) are never released:
// once they expire, their units come back, the taken job's mark names a permit no longer
// held, and the live workers run every job, each exactly once, under a later permit.
func TestJobsOfDeadWorkersRunAgain(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pool := newPool(t)
	if err := enqueue(ctx, pool, "acme", "1", "2", "3", "4"); err != nil {
		t.Fatal(err)
	}
	limits := map[string]share{"acme": {Limit: 3, Weight: 1}}
	if err := semaphore.SetLimit(ctx, pool, "acme", limits["acme"].Limit, nil); err != nil {
		t.Fatal(err)
	}
	diedAfterNext, err := semaphore.Next(ctx, pool, time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	diedWithJob, err := semaphore.Next(ctx, pool, time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	stranded, ok, err := take(ctx, pool, diedWithJob, "dead-worker")
	if err != nil || !ok {
		t.Fatalf("take: %+v, %v, %v", stranded, ok, err)
	}

	h := &history{running: map[string]int{}, most: map[string]int{}, runs: map[int64]int{}, started: map[string]int{}}
	done := make(chan error)
	go func() {
		done <- run(ctx, pool, config{Workers: 2, Tenants: limits, TTL: 30 * time.Second, Idle: 5 * time.Millisecond,
			Handle: h.handle(0), Logger: slog.New(slog.DiscardHandler)})
	}()
	exampletest.WaitFor(t, "every job finished", func(context.Context) (bool, error) {
		return exampletest.Count(t, pool, `SELECT count(*) FROM jobs WHERE finished_at IS NOT NULL`) == 4, nil
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("run: %v", err)
	}
	var token int64
	var worker string
	if err := pool.QueryRow(context.Background(), `SELECT permit_token, worker FROM jobs WHERE id = $1`, stranded.ID).Scan(&token, &worker); err != nil {
		t.Fatal(err)
	}
	if token <= max(diedAfterNext.Token, diedWithJob.Token) || worker == "dead-worker" {
		t.Errorf("the dead worker's job was finished under token %d by %s; want a live worker's later permit", token, worker)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for id, n := range h.runs {
		if n != 1 {
			t.Errorf("job %d ran %d times, want 1", id, n)
		}
	}
	if s, err := semaphore.Get(context.Background(), pool, "acme"); err != nil || s.Demand != 0 {
		t.Errorf("acme after every job: %+v, %v; want demand 0", s, err)
	}
}

// The program itself: globex's and initech's jobs are all done while acme's flood is still
// queued; SIGTERM stops it cleanly, giving back the jobs it was running, so that none is
// left in hand.
func TestMainProgram(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	p := exampletest.StartMain(t, exampletest.EnvDatabaseURL+"="+exampletest.DatabaseURL(t, pool))
	exampletest.WaitFor(t, "globex's and initech's jobs done", func(ctx context.Context) (bool, error) {
		var n int
		err := pool.QueryRow(ctx, `SELECT count(*) FROM jobs WHERE tenant <> 'acme' AND finished_at IS NOT NULL`).Scan(&n)
		if err != nil && strings.Contains(err.Error(), "does not exist") {
			return false, nil // main has not created its tables yet
		}
		return n == 30, err
	})
	if n := exampletest.Count(t, pool, `SELECT count(*) FROM jobs WHERE tenant = 'acme' AND finished_at IS NULL`); n < 100 {
		t.Errorf("only %d of acme's 200 jobs still queued when the others were done", n)
	}
	p.Stop(t)
	if n := exampletest.Count(t, pool, `SELECT count(*) FROM jobs WHERE finished_at IS NULL AND permit_token IS NOT NULL
		AND pgcoord_semaphore_held(tenant, permit_token)`); n != 0 {
		t.Errorf("%d jobs still in hand after SIGTERM", n)
	}
	// The demand the semaphore counts is still the unfinished jobs: the units of the jobs
	// given back went back with their permits.
	for _, tenant := range []string{"acme", "globex", "initech"} {
		s, err := semaphore.Get(context.Background(), pool, tenant)
		if err != nil {
			t.Fatal(err)
		}
		unfinished := exampletest.Count(t, pool, `SELECT count(*) FROM jobs WHERE tenant = $1 AND finished_at IS NULL`, tenant)
		if s.Demand != int64(unfinished) || s.Held != 0 {
			t.Errorf("tenant %s: demand %d and %d permits held after SIGTERM; want %d (the unfinished jobs) and 0", tenant, s.Demand, s.Held, unfinished)
		}
	}
}
