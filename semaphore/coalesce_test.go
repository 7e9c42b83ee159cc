package semaphore_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/internal/coalesce"
	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/pgcoord"
	"github.com/pgcoord/pgcoord/semaphore"
)

// within counts the live reported permits of each key and fails the test when one goes
// over limit. A permit is live from its TryAcquire's return until its Release is called
// (the release may commit, and admit the next, before its reply comes back).
type within struct {
	t     *testing.T
	limit int
	mu    sync.Mutex
	live  map[string]int
}

func (w *within) admitted(p semaphore.Permit) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.live[p.Key]++
	if w.live[p.Key] > w.limit {
		w.t.Errorf("%q: %d live permits, over its limit %d", p.Key, w.live[p.Key], w.limit)
	}
}

func (w *within) released(p semaphore.Permit) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.live[p.Key]--
}

// admitRenewRelease runs workers goroutines, each with its own holder, taking a permit of
// one of keys at random, renewing and releasing it, until stop is closed; a Release that
// fails is retried until it returns nil or ErrLost (it may not have happened). It returns
// the calls made and failed.
func admitRenewRelease(t *testing.T, pool *pgxpool.Pool, keys []string, workers int, ttl time.Duration, stop <-chan struct{}, w *within) (calls, failed *atomic.Int64, wait func()) {
	calls, failed = new(atomic.Int64), new(atomic.Int64)
	var wg sync.WaitGroup
	for i := range workers {
		opts := &semaphore.AcquireOpts{Holder: fmt.Sprintf("worker-%d", i)}
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				calls.Add(1)
				p, err := semaphore.TryAcquire(ctx, pool, keys[rand.IntN(len(keys))], w.limit, ttl, opts)
				switch {
				case errors.Is(err, semaphore.ErrFull):
					continue
				case errors.Is(err, pgcoord.ErrInvalidArgument) || errors.Is(err, pgcoord.ErrInvalidName):
					t.Error(err)
					return
				case err != nil:
					failed.Add(1)
					continue
				}
				w.admitted(p)
				calls.Add(1)
				if r, err := semaphore.Renew(ctx, pool, p, ttl, nil); err == nil {
					p = r
				} else if !errors.Is(err, semaphore.ErrLost) {
					failed.Add(1)
				}
				w.released(p)
				for {
					calls.Add(1)
					err := semaphore.Release(ctx, pool, p)
					if err == nil || errors.Is(err, semaphore.ErrLost) {
						break
					}
					failed.Add(1)
				}
			}
		})
	}
	return calls, failed, wg.Wait
}

// Concurrent TryAcquire, Renew and Release calls through one pool share statements
// (coalesced), and a key never has more live permits than its limit: 32 holders on 4
// keys of limit 3, through a pool of 4 connections.
func TestCoalescedCallsShareStatementsAndKeepTheLimit(t *testing.T) {
	t.Parallel()
	rt := &pgtest.RoundTrips{}
	pool, _ := pgtest.TracedPool(t, 4, rt)
	w := &within{t: t, limit: 3, live: map[string]int{}}
	keys := []string{"a", "b", "c", "d"}
	before := rt.N()
	stop := make(chan struct{})
	calls, failed, wait := admitRenewRelease(t, pool, keys, 32, time.Minute, stop, w)
	for calls.Load() < 4000 && !t.Failed() {
		time.Sleep(10 * time.Millisecond)
	}
	close(stop)
	wait()
	statements := rt.N() - before
	t.Logf("%d calls in %d statements", calls.Load(), statements)
	if failed.Load() > 0 {
		t.Errorf("%d calls failed", failed.Load())
	}
	if statements >= calls.Load() {
		t.Errorf("%d calls sent %d statements: none were coalesced", calls.Load(), statements)
	}
	for _, k := range keys {
		s, err := semaphore.Get(ctx, pool, k)
		if err != nil {
			t.Fatal(err)
		}
		if s.Held != 0 {
			t.Errorf("%q: %d permits held after every permit was released", k, s.Held)
		}
	}
}

// Backends killed while coalesced batches are in flight (40 kills of an active backend):
// every call returns, and no key ever has more live permits than its limit.
func TestCoalescedSemaphoreCallsSurviveKilledBackends(t *testing.T) {
	pgtest.NeedsSession(t, "it kills the pool's backends (behind a pooler they are PgBouncer's)")
	t.Parallel()
	rt := &pgtest.RoundTrips{}
	pool, other := pgtest.TracedPool(t, 4, rt)
	w := &within{t: t, limit: 2, live: map[string]int{}}
	stop := make(chan struct{})
	// A permit whose TryAcquire failed (it committed, the reply was lost twice) stays held
	// until it expires: 5 s keeps the keys in use.
	calls, failed, wait := admitRenewRelease(t, pool, []string{"a", "b", "c", "d"}, 32, 5*time.Second, stop, w)
	kills := 0
	for kills < 40 && !t.Failed() {
		if pgtest.KillOneActive(t, other) {
			kills++
		}
		time.Sleep(time.Duration(10+rand.IntN(30)) * time.Millisecond) // reconnecting takes a while
	}
	close(stop)
	done := make(chan struct{})
	go func() { wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(pgtest.WaitLimit):
		t.Fatal("calls did not return after the run")
	}
	t.Logf("%d calls, %d failed; %d backends killed", calls.Load(), failed.Load(), kills)
}

// Calls in the caller's own transactions are never merged: 8 goroutines, each making 20
// TryAcquire and Release calls in transactions of their own, send exactly BEGIN, the two
// calls and COMMIT for each.
func TestSemaphoreCallsInTransactionsAreNeverMerged(t *testing.T) {
	t.Parallel()
	rt := &pgtest.RoundTrips{}
	pool, _ := pgtest.TracedPool(t, 8, rt)
	const workers, each = 8, 20
	var conns []*pgxpool.Conn // every connection set up before the count
	for range workers {
		c, err := pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	for _, c := range conns {
		c.Release()
	}
	before := rt.N()
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			key := fmt.Sprintf("tx-%d", w)
			for range each {
				tx, err := pool.Begin(ctx)
				if err != nil {
					t.Error(err)
					return
				}
				p, err := semaphore.TryAcquire(ctx, tx, key, 1, time.Minute, nil)
				if err == nil {
					err = semaphore.Release(ctx, tx, p)
				}
				if err != nil {
					t.Error(err)
				}
				if err := tx.Commit(ctx); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	if n, want := rt.N()-before, int64(workers*each*4); n != want {
		t.Errorf("%d statements for %d acquire+release pairs in their own transactions, want %d (BEGIN, two calls, COMMIT each)", n, workers*each, want)
	}
}

// rig is a pool whose sessions are named app, for watching them wait for locks, and a
// plain pool on the same schema.
type rig struct {
	t           *testing.T
	app         string
	pool, plain *pgxpool.Pool
}

// newRig returns a rig whose keys exist, with limit semaphore.Lanes, and hold nothing.
// app must fit application_name's 63 bytes.
func newRig(t *testing.T, app string, pool *pgxpool.Config, keys ...string) *rig {
	t.Helper()
	plain := pgtest.Pool(t)
	cfg := plain.Config()
	cfg.ConnConfig.RuntimeParams["application_name"] = app
	if pool != nil {
		for k, v := range pool.ConnConfig.RuntimeParams {
			cfg.ConnConfig.RuntimeParams[k] = v
		}
	}
	p, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	for _, key := range keys {
		pm, err := semaphore.TryAcquire(ctx, plain, key, semaphore.Lanes, time.Minute, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := semaphore.Release(ctx, plain, pm); err != nil {
			t.Fatal(err)
		}
	}
	return &rig{t: t, app: app, pool: p, plain: plain}
}

// lockKey locks key's row in a transaction of its own until the returned function commits.
func (r *rig) lockKey(key string) func() {
	tx, err := r.plain.Begin(ctx)
	if err != nil {
		r.t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SELECT FROM pgcoord_semaphores WHERE key = $1 FOR UPDATE`, key); err != nil {
		r.t.Fatal(err)
	}
	unlock := sync.OnceFunc(func() {
		if err := tx.Commit(ctx); err != nil {
			r.t.Error(err)
		}
	})
	r.t.Cleanup(unlock) // before the pool closes: its calls wait for the row
	return unlock
}

// blocked returns whether want of the rig's sessions wait for a lock.
func (r *rig) blocked(want int) func() bool {
	return func() bool { return pgtest.LockWaiters(r.t, r.plain, r.app) == want }
}

// fillLanes sends an admission to "first" in every lane, each waiting for first's row
// until the returned function unlocks it and they return: calls made meanwhile are merged.
func (r *rig) fillLanes() func() {
	unlock := r.lockKey("first")
	errs := make(chan error, semaphore.Lanes)
	for range semaphore.Lanes {
		go func() {
			_, err := semaphore.TryAcquire(ctx, r.pool, "first", semaphore.Lanes, time.Minute, nil)
			errs <- err
		}()
	}
	pgtest.Until(r.t, "a call in each lane to wait for its row", r.blocked(semaphore.Lanes))
	return func() {
		unlock()
		for range semaphore.Lanes {
			if err := <-errs; err != nil {
				r.t.Fatal(err)
			}
		}
	}
}

// A caller that gives up while its batch is in flight gets an error saying its outcome is
// unknown; if the batch then admits it, the permit is released at once when its holder was
// the call's own (nobody else can ask for it), and kept when the caller chose the holder.
func TestAPermitNobodyWaitsForIsReleased(t *testing.T) {
	t.Parallel()
	for _, own := range []bool{true, false} {
		t.Run(fmt.Sprintf("generated holder %t", own), func(t *testing.T) {
			r := newRig(t, fmt.Sprintf("semaphore orphans %t", own), nil, "first", "x")
			var opts *semaphore.AcquireOpts
			if !own {
				opts = &semaphore.AcquireOpts{Holder: "chosen"}
			}
			unblockX := r.lockKey("x")
			unblockFirst := r.fillLanes()
			errs := make(chan error, 2)
			gone, giveUp := context.WithCancel(ctx)
			defer giveUp()
			go func() { _, err := semaphore.TryAcquire(gone, r.pool, "x", 1, time.Minute, opts); errs <- err }()
			pgtest.Until(t, "x to wait behind them", func() bool { return semaphore.AdmissionsWaiting(r.pool) == 1 })
			go func() { _, err := semaphore.TryAcquire(ctx, r.pool, "y", 1, time.Minute, nil); errs <- err }()
			pgtest.Until(t, "y to wait behind them", func() bool { return semaphore.AdmissionsWaiting(r.pool) == 2 })
			unblockFirst()
			pgtest.Until(t, "the batch of x and y to wait for x's row", r.blocked(1))
			giveUp()
			if err := <-errs; !errors.Is(err, coalesce.ErrUnknown) {
				t.Fatalf("x's caller, gone while its batch was in flight: %v, want an unknown outcome", err)
			}
			unblockX()
			if err := <-errs; err != nil {
				t.Fatalf("y: %v", err)
			}
			held := func() bool {
				s, err := semaphore.Get(ctx, r.plain, "x")
				if err != nil {
					t.Fatal(err)
				}
				return s.Held > 0
			}
			if own {
				pgtest.Until(t, "x's permit to be released", func() bool { return !held() })
			} else if !held() {
				t.Error("the permit of a holder the caller chose was released")
			}
		})
	}
}

// A batch never waits long for a key's row that another transaction holds: that
// transaction may be waiting for a row the batch has written. Here a transaction holds
// key "b"'s row and then asks for "a"'s, while a batch of admissions to "a" and "b" has
// admitted to "a" and waits for "b". The batch's sessions detect deadlocks only after
// 10 s, the transaction's after the default second: a batch that waited would make the
// transaction the deadlock's victim. It gives up within its lock timeout instead; the
// transaction goes on, and both calls, sent alone, are admitted once it commits.
func TestSemaphoreBatchGivesWayToATransactionWaitingForItsRows(t *testing.T) {
	pgtest.NeedsSession(t, "it sets deadlock_timeout on the pool's sessions")
	t.Parallel()
	slow := &pgxpool.Config{ConnConfig: &pgx.ConnConfig{}}
	slow.ConnConfig.RuntimeParams = map[string]string{"deadlock_timeout": "10s"}
	r := newRig(t, "semaphore deadlock", slow, "first", "a", "b")
	unblockFirst := r.fillLanes()
	errs := make(chan error, 2)
	for _, key := range []string{"a", "b"} {
		go func() {
			_, err := semaphore.TryAcquire(ctx, r.pool, key, semaphore.Lanes, time.Minute, nil)
			errs <- err
		}()
	}
	pgtest.Until(t, "a and b to wait behind them", func() bool { return semaphore.AdmissionsWaiting(r.pool) == 2 })
	tx, err := r.plain.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `SELECT FROM pgcoord_semaphores WHERE key = 'b' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	unblockFirst()
	pgtest.Until(t, "the batch to wait for b", r.blocked(1))
	if _, err := tx.Exec(ctx, `SELECT FROM pgcoord_semaphores WHERE key = 'a' FOR UPDATE`); err != nil {
		t.Fatalf("the transaction waiting for a row of the batch: %v", err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := <-errs; err != nil {
			t.Errorf("a call of the batch: %v", err)
		}
	}
}
