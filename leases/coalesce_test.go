package leases_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/internal/coalesce"
	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/leases"
	"github.com/pgcoord/pgcoord/pgcoord"
)

// exclusive records which reported grants are live, per lease name: a second live grant
// of one name is a lease granted twice. A grant is live from its TryAcquire's return until
// its Release is called (the release may commit before its reply comes back, and the next
// grant with it).
type exclusive struct {
	mu   sync.Mutex
	live map[string]int64 // name → token of its live reported grant
}

func (e *exclusive) granted(t *testing.T, l leases.Lease) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if tok, ok := e.live[l.Name]; ok {
		t.Errorf("%q granted with token %d while the grant with token %d was live", l.Name, l.Token, tok)
	}
	e.live[l.Name] = l.Token
}

func (e *exclusive) over(l leases.Lease) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.live[l.Name] == l.Token {
		delete(e.live, l.Name)
	}
}

// contend runs workers goroutines, each with its own holder, acquiring one of names at
// random, renewing and releasing it, until stop is closed; a Release that fails is retried
// until it returns nil or ErrLost (it may not have happened). It returns the calls made
// and failed.
func contend(t *testing.T, pool *pgxpool.Pool, names []string, workers int, ttl time.Duration, stop <-chan struct{}, ex *exclusive) (calls, failed *atomic.Int64, wait func()) {
	calls, failed = new(atomic.Int64), new(atomic.Int64)
	var wg sync.WaitGroup
	for w := range workers {
		opts := &leases.AcquireOpts{Holder: fmt.Sprintf("worker-%d", w)}
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				calls.Add(1)
				l, err := leases.TryAcquire(ctx, pool, names[rand.IntN(len(names))], ttl, opts)
				switch {
				case errors.Is(err, leases.ErrHeld):
					continue
				case errors.Is(err, pgcoord.ErrInvalidArgument) || errors.Is(err, pgcoord.ErrInvalidName):
					t.Error(err)
					return
				case err != nil:
					failed.Add(1)
					continue
				}
				ex.granted(t, l)
				calls.Add(1)
				if r, err := leases.Renew(ctx, pool, l, ttl, nil); err == nil {
					l = r
				} else if !errors.Is(err, leases.ErrLost) {
					failed.Add(1)
				}
				ex.over(l)
				for {
					calls.Add(1)
					err := leases.Release(ctx, pool, l, nil)
					if err == nil || errors.Is(err, leases.ErrLost) {
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
// (coalesced), and a lease is never granted to two holders at once: 32 holders on 4
// names, through a pool of 4 connections.
func TestCoalescedCallsShareStatementsAndGrantOnce(t *testing.T) {
	t.Parallel()
	rt := &pgtest.RoundTrips{}
	pool, _ := pgtest.TracedPool(t, 4, rt)
	ex := &exclusive{live: map[string]int64{}}
	before := rt.N()
	stop := make(chan struct{})
	calls, failed, wait := contend(t, pool, []string{"a", "b", "c", "d"}, 32, time.Minute, stop, ex)
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
	held, err := leases.List(ctx, pool, &leases.ListOpts{Held: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(held) != 0 {
		t.Errorf("leases still held after every grant was released: %+v", held)
	}
}

// Backends killed while coalesced batches are in flight (40 kills of an active backend):
// every call returns, and a lease is never granted to two holders at once. A batch whose
// backend dies mid-statement is sent again call by call; a lone call's error is its own.
func TestCoalescedLeaseCallsSurviveKilledBackends(t *testing.T) {
	pgtest.NeedsSession(t, "it kills the pool's backends (behind a pooler they are PgBouncer's)")
	t.Parallel()
	rt := &pgtest.RoundTrips{}
	pool, other := pgtest.TracedPool(t, 4, rt)
	ex := &exclusive{live: map[string]int64{}}
	stop := make(chan struct{})
	// A grant whose TryAcquire failed (it committed, the reply was lost twice) stays held
	// until it expires: 5 s keeps the names in use.
	calls, failed, wait := contend(t, pool, []string{"a", "b", "c", "d", "e", "f", "g", "h"}, 32, 5*time.Second, stop, ex)
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

// A batch never waits long for a row another transaction holds: that transaction may be
// waiting for a row the batch has written. Here a transaction holds lease "b"'s row and
// then asks for "a"'s, while a batch of TryAcquire("a") and TryAcquire("b") has granted
// "a" and waits for "b". The batch's sessions detect deadlocks only after 10 s, the
// transaction's after the default second: a batch that waited would make the transaction
// the deadlock's victim. It gives up within its lock timeout instead; the transaction
// goes on, and both calls, sent alone, are granted once it commits.
func TestBatchGivesWayToATransactionWaitingForItsRows(t *testing.T) {
	pgtest.NeedsSession(t, "it sets deadlock_timeout on the pool's sessions")
	t.Parallel()
	plain := pgtest.Pool(t)
	cfg := plain.Config()
	cfg.ConnConfig.RuntimeParams["deadlock_timeout"] = "10s"
	cfg.ConnConfig.RuntimeParams["application_name"] = "batch " + t.Name()
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	for _, name := range []string{"a", "b"} { // rows to lock
		l, err := leases.TryAcquire(ctx, plain, name, time.Minute, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := leases.Release(ctx, plain, l, nil); err != nil {
			t.Fatal(err)
		}
	}
	// Every lane busy, so that the next two calls are merged.
	unblock := fillLanes(t, pool, plain, "batch "+t.Name())
	type result struct {
		l   leases.Lease
		err error
	}
	results := make(chan result, 2)
	acquire := func(name string) {
		go func() {
			l, err := leases.TryAcquire(ctx, pool, name, time.Minute, nil)
			results <- result{l, err}
		}()
	}
	acquire("a")
	acquire("b")
	pgtest.Until(t, "two calls to wait behind them", func() bool { return leases.AcquiresWaiting(pool) == 2 })
	// The transaction takes "b", the batch goes out and takes "a", then waits for "b".
	tx, err := plain.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `SELECT FROM pgcoord_leases WHERE name = 'b' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	unblock()
	pgtest.Until(t, "the batch to wait for b", func() bool { return pgtest.LockWaiters(t, plain, "batch "+t.Name()) == 1 })
	// Now the transaction asks for "a", which the batch holds, unless it gave way.
	if _, err := tx.Exec(ctx, `SELECT FROM pgcoord_leases WHERE name = 'a' FOR UPDATE`); err != nil {
		t.Fatalf("the transaction waiting for a row of the batch: %v", err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if r := <-results; r.err != nil {
			t.Errorf("a call of the batch: %v", r.err)
		}
	}
}

// lockRow locks name's lease row in a transaction of its own until the returned function
// commits it.
func lockRow(t *testing.T, pool *pgxpool.Pool, name string) func() {
	t.Helper()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SELECT FROM pgcoord_leases WHERE name = $1 FOR UPDATE`, name); err != nil {
		t.Fatal(err)
	}
	unlock := sync.OnceFunc(func() {
		if err := tx.Commit(ctx); err != nil {
			t.Error(err)
		}
	})
	t.Cleanup(unlock) // before the pool closes: its calls wait for the row
	return unlock
}

// A caller that gives up while its batch is in flight gets an error saying its outcome is
// unknown; if the batch then grants it the lease, the grant is released at once when its
// holder was the call's own (nobody else can ask for it), and kept when the caller chose
// the holder (it gets it back by asking again).
func TestAGrantNobodyWaitsForIsReleased(t *testing.T) {
	t.Parallel()
	for _, own := range []bool{true, false} {
		t.Run(fmt.Sprintf("generated holder %t", own), func(t *testing.T) {
			plain := pgtest.Pool(t)
			cfg := plain.Config()
			app := fmt.Sprintf("lease orphans %t", own) // within application_name's 63 bytes
			cfg.ConnConfig.RuntimeParams["application_name"] = app
			pool, err := pgxpool.NewWithConfig(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(pool.Close)
			for _, name := range []string{"x"} { // rows to lock
				l, err := leases.TryAcquire(ctx, plain, name, time.Minute, nil)
				if err != nil {
					t.Fatal(err)
				}
				if err := leases.Release(ctx, plain, l, nil); err != nil {
					t.Fatal(err)
				}
			}
			var opts *leases.AcquireOpts
			if !own {
				opts = &leases.AcquireOpts{Holder: "chosen"}
			}
			unblockX := lockRow(t, plain, "x")
			unblockFirst := fillLanes(t, pool, plain, app)
			errs := make(chan error, 2)
			gone, giveUp := context.WithCancel(ctx)
			defer giveUp()
			go func() { _, err := leases.TryAcquire(gone, pool, "x", time.Minute, opts); errs <- err }()
			pgtest.Until(t, "x to wait behind it", func() bool { return leases.AcquiresWaiting(pool) == 1 })
			go func() { _, err := leases.TryAcquire(ctx, pool, "y", time.Minute, nil); errs <- err }()
			pgtest.Until(t, "y to wait behind it", func() bool { return leases.AcquiresWaiting(pool) == 2 })
			unblockFirst()
			pgtest.Until(t, "the batch of x and y to wait for x's row", func() bool { return pgtest.LockWaiters(t, plain, app) == 1 })
			giveUp()
			if err := <-errs; !errors.Is(err, coalesce.ErrUnknown) {
				t.Fatalf("x's caller, gone while its batch was in flight: %v, want an unknown outcome", err)
			}
			unblockX()
			if err := <-errs; err != nil {
				t.Fatalf("y: %v", err)
			}
			held := func() bool {
				info, err := leases.Get(ctx, plain, "x")
				if err != nil {
					t.Fatal(err)
				}
				return info.Held()
			}
			if own {
				pgtest.Until(t, "x's grant to be released", func() bool { return !held() })
			} else if !held() {
				t.Error("the grant of a holder the caller chose was released")
			}
		})
	}
}

// fillLanes sends a TryAcquire in every lane of pool, each waiting for a row that plain
// locks, until the returned function unlocks them and they return: calls made meanwhile
// are merged. app names pool's sessions.
func fillLanes(t *testing.T, pool, plain *pgxpool.Pool, app string) func() {
	t.Helper()
	tx, err := plain.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	unlock := sync.OnceFunc(func() {
		if err := tx.Commit(ctx); err != nil {
			t.Error(err)
		}
	})
	t.Cleanup(unlock)
	errs := make(chan error, leases.Lanes)
	for i := range leases.Lanes {
		name := fmt.Sprint("lane-", i)
		l, err := leases.TryAcquire(ctx, plain, name, time.Minute, nil) // its row, to lock
		if err == nil {
			err = leases.Release(ctx, plain, l, nil)
		}
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, `SELECT FROM pgcoord_leases WHERE name = $1 FOR UPDATE`, name); err != nil {
			t.Fatal(err)
		}
		go func() { _, err := leases.TryAcquire(ctx, pool, name, time.Minute, nil); errs <- err }()
	}
	pgtest.Until(t, "a call in each lane to wait for its row", func() bool { return pgtest.LockWaiters(t, plain, app) == leases.Lanes })
	return func() {
		unlock()
		for range leases.Lanes {
			if err := <-errs; err != nil {
				t.Fatal(err)
			}
		}
	}
}

// Calls in the caller's own transactions are never merged: 8 goroutines, each making 20
// TryAcquire and Release calls in transactions of their own, send exactly BEGIN, the
// call and COMMIT for each.
func TestLeaseCallsInTransactionsAreNeverMerged(t *testing.T) {
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
			name := fmt.Sprintf("tx-%d", w)
			for range each {
				tx, err := pool.Begin(ctx)
				if err != nil {
					t.Error(err)
					return
				}
				l, err := leases.TryAcquire(ctx, tx, name, time.Minute, nil)
				if err == nil {
					err = leases.Release(ctx, tx, l, nil)
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
