package ratelimit_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/ratelimit"
)

// A shadow policy never refuses, even a cost above its burst; the binding policy of a
// decision is an enforcing one; shadow counts are kept per key, survive gc, and never make
// one key's call wait for another's.
func TestShadowNeverBindsNorBlocks(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	clock := pgtest.NewClock(t, pool)
	clock.Freeze(t0)
	mustSet(t, pool, ratelimit.Policy{Name: "enf", Rate: 1000, Period: time.Second, Burst: 100})
	mustSet(t, pool, ratelimit.Policy{Name: "sh", Rate: 1, Period: time.Second, Burst: 5, Shadow: true})
	both := []ratelimit.Limit{lim("enf", "k"), lim("sh", "k")}
	d := allow(t, pool, 10, both...)
	if !d.Allowed || d.Policy != "enf" || d.Remaining != 90 {
		t.Fatalf("cost 10 over a shadow burst of 5: %+v; want allowed, bound by enf with 90 left", d)
	}
	d, err := ratelimit.AllowAtMost(ctx, pool, 50, both, nil)
	if err != nil || d.Granted != 50 || d.Policy != "enf" {
		t.Fatalf("AllowAtMost beside a shadow policy: %+v, %v; want 50 granted, bound by enf", d, err)
	}
	if p, err := ratelimit.Get(ctx, pool, "sh"); err != nil || p.ShadowRefused != 2 {
		t.Fatalf("shadow policy: %+v, %v; want 2 counted", p, err)
	}

	// A transaction that counted a shadow refusal on k1 holds k1's row, not the policy's:
	// a call on k2 goes through meanwhile.
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := ratelimit.Allow(ctx, tx, 6, []ratelimit.Limit{lim("sh", "k1")}, nil); err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithTimeout(ctx, pgtest.WaitLimit)
	defer cancel()
	if _, err := ratelimit.Allow(cctx, pool, 6, []ratelimit.Limit{lim("sh", "k2")}, nil); err != nil {
		t.Fatalf("a call on another key of the shadow policy waited for the open transaction: %v", err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if p, _ := ratelimit.Get(ctx, pool, "sh"); p.ShadowRefused != 4 {
		t.Fatalf("shadow count %d, want 4", p.ShadowRefused)
	}
	// gc deletes the keys at rest and keeps their counts.
	clock.Advance(time.Hour)
	if _, err := pool.Exec(ctx, `SELECT pgcoord_gc(interval '1 second')`); err != nil {
		t.Fatal(err)
	}
	var left int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pgcoord_ratelimit_state`).Scan(&left); err != nil || left != 0 {
		t.Fatalf("%d state rows after gc (%v), want none", left, err)
	}
	if p, _ := ratelimit.Get(ctx, pool, "sh"); p.ShadowRefused != 4 {
		t.Fatalf("shadow count after gc %d, want 4", p.ShadowRefused)
	}
	// Turning shadow mode off and on restarts it.
	mustSet(t, pool, ratelimit.Policy{Name: "sh", Rate: 1, Period: time.Second, Burst: 5})
	if p := mustSet(t, pool, ratelimit.Policy{Name: "sh", Rate: 1, Period: time.Second, Burst: 5, Shadow: true}); p.ShadowRefused != 0 {
		t.Fatalf("shadow count after a restart %d, want 0", p.ShadowRefused)
	}
}

// A key holding a reservation reads 0 remaining, never a negative number.
func TestStateOfAReservedKey(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	pgtest.NewClock(t, pool).Freeze(t0)
	mustSet(t, pool, ratelimit.Policy{Name: "line", Rate: 1, Period: time.Second, Burst: 1})
	for range 5 {
		if _, err := ratelimit.Reserve(ctx, pool, 1, []ratelimit.Limit{lim("line", "k")}, time.Minute, nil); err != nil {
			t.Fatal(err)
		}
	}
	if st, err := ratelimit.State(ctx, pool, lim("line", "k")); err != nil || st.Remaining != 0 || st.ResetAfter != 5*time.Second {
		t.Fatalf("a key with reservations: %+v, %v; want 0 remaining, at rest in 5s", st, err)
	}
}

// Cancel locks its keys in (policy, key) order, as every call does: a cancel whose limits
// are in another order waits for a transaction that holds one key and then takes the
// other, instead of deadlocking with it.
func TestCancelLocksInOrder(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	mustSet(t, pool, ratelimit.Policy{Name: "a", Rate: 1, Period: time.Hour, Burst: 10})
	mustSet(t, pool, ratelimit.Policy{Name: "b", Rate: 1, Period: time.Hour, Burst: 10})
	r, err := ratelimit.Reserve(ctx, pool, 1, []ratelimit.Limit{lim("b", "k"), lim("a", "k")}, time.Hour, nil)
	if err != nil || !r.Allowed {
		t.Fatalf("Reserve = %+v, %v", r, err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	allow(t, tx, 1, lim("a", "k")) // holds (a, k)
	cancelled := pgtest.Go(func() (struct{}, error) { return struct{}{}, r.Cancel(ctx, pool) })
	pgtest.Until(t, "the cancel to wait for the transaction's lock", func() bool {
		var waiting bool
		err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND query LIKE '%pgcoord_ratelimit_cancel%')`).Scan(&waiting)
		return err == nil && waiting
	})
	if _, err := ratelimit.Allow(ctx, tx, 1, []ratelimit.Limit{lim("b", "k")}, nil); err != nil {
		t.Fatalf("the transaction's second key: %v (a deadlock with the cancel?)", err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := cancelled.Wait(t); err != nil {
		t.Fatalf("Cancel: %v", err)
	}
}

// A Wait whose slot turns out to lie past its deadline only once the reply arrives — it
// waited for the key's lock — gives the slot back and says ErrTooLong.
func TestWaitPastTheDeadlineAfterALockWait(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	mustSet(t, pool, ratelimit.Policy{Name: "slow", Rate: 1, Period: time.Second, Burst: 1})
	k := []ratelimit.Limit{lim("slow", "k")}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	// The transaction charges 3 units' worth (the key's next slot 3 s away) and holds the row.
	for range 3 {
		if _, err := ratelimit.Reserve(ctx, tx, 1, k, time.Minute, nil); err != nil {
			t.Fatal(err)
		}
	}
	dctx, cancel := context.WithTimeout(ctx, 2500*time.Millisecond)
	defer cancel()
	start := time.Now()
	waited := pgtest.Go(func() (ratelimit.Reservation, error) { return ratelimit.Wait(dctx, pool, 1, k, nil) })
	pgtest.Until(t, "the waiter to wait for the key's lock", func() bool {
		var waiting bool
		err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND query LIKE '%pgcoord\_ratelimit\_%')`).Scan(&waiting)
		return err == nil && waiting
	})
	// Hold the lock until the waiter's slot (3 s after the first reservation) is within its
	// max wait (2.5 s from its start) only because time passed: a second is enough.
	for time.Since(start) < time.Second {
		time.Sleep(10 * time.Millisecond)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := waited.Wait(t); !errors.Is(err, ratelimit.ErrTooLong) {
		t.Fatalf("Wait = %v, want ErrTooLong", err)
	}
	if st, err := ratelimit.State(ctx, pool, k[0]); err != nil || st.ResetAfter > 3*time.Second {
		t.Fatalf("after the refused Wait the key resets in %v (%v): its slot was not given back", st.ResetAfter, err)
	}
}
