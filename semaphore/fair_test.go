package semaphore_test

import (
	"errors"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/semaphore"
)

// finish calls Done on p in a transaction of its own: the job of p is done.
func finish(t testing.TB, pool *pgxpool.Pool, p semaphore.Permit) error {
	t.Helper()
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return semaphore.Done(ctx, tx, p) })
}

// nextSeq calls Next n times, marking each permit's job done at once, and returns the keys
// admitted, in order, as one string ("a b a b ...").
func nextSeq(t *testing.T, pool *pgxpool.Pool, n int, opts *semaphore.NextOpts) string {
	t.Helper()
	var keys []string
	for range n {
		p, err := semaphore.Next(ctx, pool, time.Minute, opts)
		if errors.Is(err, semaphore.ErrNoWork) {
			keys = append(keys, "-")
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		keys = append(keys, p.Key)
		if err := finish(t, pool, p); err != nil {
			t.Fatal(err)
		}
	}
	return strings.Join(keys, " ")
}

// The algorithm, one call at a time: the size of a backlog does not matter, weights do,
// a returning idle key gets no credit for its idle time, limits still hold, and demand is
// consumed one unit per job done.
func TestNextOrder(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	for _, k := range []string{"big", "small", "heavy", "idle"} {
		if err := semaphore.SetLimit(ctx, pool, k, 100, nil); err != nil {
			t.Fatal(err)
		}
	}
	if got := nextSeq(t, pool, 1, nil); got != "-" {
		t.Fatalf("Next without demand: %s", got)
	}
	// A million queued units against three: they alternate (ties go by key).
	if err := semaphore.AddDemand(ctx, pool, "big", 1_000_000, nil); err != nil {
		t.Fatal(err)
	}
	if err := semaphore.AddDemand(ctx, pool, "small", 3, nil); err != nil {
		t.Fatal(err)
	}
	if got, want := nextSeq(t, pool, 9, nil), "big small big small big small big big big"; got != want {
		t.Fatalf("big and small: %s, want %s", got, want)
	}
	if s := mustGet(t, pool, "small"); s.Demand != 0 || s.Admitted != 3 || s.VTime != 3 {
		t.Fatalf("small after its 3 units: %+v", s)
	}
	// idle was created long ago (vtime 0) and had no demand while big ran 6 units. When it
	// returns it starts at big's virtual time, not at 0: no run of 6 admissions.
	if err := semaphore.AddDemand(ctx, pool, "idle", 3, nil); err != nil {
		t.Fatal(err)
	}
	if s := mustGet(t, pool, "idle"); s.VTime != 6 {
		t.Fatalf("the returning key starts at vtime %v, want big's 6", s.VTime)
	}
	if got, want := nextSeq(t, pool, 6, nil), "big idle big idle big idle"; got != want {
		t.Fatalf("big and the returning idle key: %s, want %s", got, want)
	}
	// Weight 3 against 1: three admissions for one. heavy joins at big's vtime (9).
	if err := semaphore.SetLimit(ctx, pool, "heavy", 100, &semaphore.SetLimitOpts{Weight: 3}); err != nil {
		t.Fatal(err)
	}
	if err := semaphore.AddDemand(ctx, pool, "heavy", 1_000_000, nil); err != nil {
		t.Fatal(err)
	}
	if got, want := nextSeq(t, pool, 8, nil), "big heavy heavy heavy big heavy heavy heavy"; got != want {
		t.Fatalf("weights 1 and 3: %s, want %s", got, want)
	}
	// A key at its limit is skipped, without losing its turn: it is served first once it
	// has room again.
	if err := semaphore.SetLimit(ctx, pool, "big", 1, nil); err != nil {
		t.Fatal(err)
	}
	hold, err := semaphore.Next(ctx, pool, time.Minute, &semaphore.NextOpts{Keys: []string{"big"}})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := nextSeq(t, pool, 6, nil), "heavy heavy heavy heavy heavy heavy"; got != want {
		t.Fatalf("with big at its limit: %s, want %s", got, want)
	}
	if err := semaphore.Release(ctx, pool, hold); err != nil {
		t.Fatal(err)
	}
	if got := nextSeq(t, pool, 1, nil); got != "big" {
		t.Fatalf("big, behind on virtual time, once it has room: %s", got)
	}
	// Keys restricts the choice; an unknown key is no work.
	if got := nextSeq(t, pool, 2, &semaphore.NextOpts{Keys: []string{"small", "idle", "absent"}}); got != "- -" {
		t.Fatalf("keys without demand: %s", got)
	}
	// Negative demand takes work away, never below zero.
	if err := semaphore.AddDemand(ctx, pool, "big", -2_000_000, nil); err != nil {
		t.Fatal(err)
	}
	if s := mustGet(t, pool, "big"); s.Demand != 0 {
		t.Fatalf("demand after taking more than there was: %d", s.Demand)
	}
	if got := nextSeq(t, pool, 2, nil); got != "heavy heavy" {
		t.Fatalf("only heavy has work: %s", got)
	}
}

// fairRun runs workers goroutines looping Next → work → Done until observe returns
// true. observe is called, under a lock, with every admitted key in the order the workers
// saw them, including admissions that were under way when it returned true.
func fairRun(t *testing.T, pool *pgxpool.Pool, workers int, work time.Duration, observe func(key string) (stop bool)) {
	t.Helper()
	var (
		mu      sync.Mutex
		done    bool
		wg      sync.WaitGroup
		noWork  int
		started = time.Now()
		// progressAt is when the last admission was observed: the run fails when none
		// comes for pgtest.WaitLimit, however long a loaded machine makes the whole run.
		progressAt = started
		stalled    bool
	)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			for {
				mu.Lock()
				if !done && time.Since(progressAt) > pgtest.WaitLimit {
					stalled = true
				}
				stop := done || stalled
				mu.Unlock()
				if stop {
					return
				}
				p, err := semaphore.Next(ctx, pool, 10*time.Second, nil)
				if errors.Is(err, semaphore.ErrNoWork) {
					// Every key with work was being admitted to by another worker at that
					// instant: back off briefly, as a worker polling its queue would.
					mu.Lock()
					noWork++
					mu.Unlock()
					time.Sleep(time.Duration(500+rng.IntN(1500)) * time.Microsecond)
					continue
				}
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				progressAt = time.Now()
				if observe(p.Key) {
					done = true
				}
				mu.Unlock()
				time.Sleep(work + time.Duration(rng.Int64N(int64(work)))) // the job
				if err := finish(t, pool, p); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if !done {
		t.Fatalf("the run stalled: no admission for %v", pgtest.WaitLimit)
	}
	t.Logf("%v; Next found no work %d times", time.Since(started).Round(time.Millisecond), noWork)
}

// Incident 3: one tenant pushes a million jobs, another a hundred; 20 workers loop on Next.
// The small tenant is not starved: its 100 jobs are all admitted before the big tenant gets
// its 220th admission (2 x 100 for strict alternation, plus one per worker for the slack of
// concurrency), and the big one keeps the workers busy before and after.
func TestAMillionQueuedUnitsDoNotStarveAHundred(t *testing.T) {
	t.Parallel()
	const workers = 20
	pool := pgtest.PoolMax(t, workers+4)
	for _, d := range []struct {
		key   string
		units int64
	}{{"big", 1_000_000}, {"small", 100}} {
		// The enqueue transaction reports the demand with the jobs (the jobs are implied).
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := semaphore.AddDemand(ctx, tx, d.key, d.units, &semaphore.AddDemandOpts{Limit: workers}); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	admitted := map[string]int{}
	var bigWhenSmallDone int
	fairRun(t, pool, workers, time.Millisecond, func(key string) bool {
		admitted[key]++
		if key == "small" && admitted["small"] == 100 {
			bigWhenSmallDone = admitted["big"]
		}
		return admitted["small"] >= 100 && admitted["big"] >= bigWhenSmallDone+50
	})
	t.Logf("the big tenant had %d admissions when the small one's 100th came", bigWhenSmallDone)
	if bigWhenSmallDone > 2*100+workers {
		t.Fatalf("the small tenant's 100 jobs were admitted only after %d of the big one's", bigWhenSmallDone)
	}
	small, big := mustGet(t, pool, "small"), mustGet(t, pool, "big")
	if small.Demand != 0 || small.Admitted != 100 || big.Demand != 1_000_000-int64(admitted["big"]) {
		t.Fatalf("demand accounting: small %+v, big %+v, admitted %v", small, big, admitted)
	}
}

// Weights 3:1, both tenants backlogged, 20 workers: over a window of 1,200 admissions
// (after 100 to warm up), the shares are 3:1 within 10%.
func TestWeightedShares(t *testing.T) {
	t.Parallel()
	const workers = 20
	pool := pgtest.PoolMax(t, workers+4)
	if err := semaphore.SetLimit(ctx, pool, "gold", workers, &semaphore.SetLimitOpts{Weight: 3}); err != nil {
		t.Fatal(err)
	}
	if err := semaphore.SetLimit(ctx, pool, "basic", workers, nil); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"gold", "basic"} {
		if err := semaphore.AddDemand(ctx, pool, k, 1_000_000, nil); err != nil {
			t.Fatal(err)
		}
	}
	const warmup, window = 100, 1200
	var n int
	share := map[string]int{}
	fairRun(t, pool, workers, time.Millisecond, func(key string) bool {
		n++
		if n > warmup && n <= warmup+window {
			share[key]++
		}
		return n >= warmup+window
	})
	ratio := float64(share["gold"]) / float64(share["basic"])
	t.Logf("admissions in the window: %v (ratio %.3f)", share, ratio)
	if ratio < 3*0.9 || ratio > 3*1.1 {
		t.Fatalf("gold:basic = %d:%d = %.3f, want 3 within 10%%", share["gold"], share["basic"], ratio)
	}
}
