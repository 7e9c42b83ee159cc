package ratelimit_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/ratelimit"
)

// Reservations take consecutive slots; one beyond the max wait charges nothing; the last
// reservation cancelled gives its slot back, an earlier one does not (its slot goes
// unused: later callers keep theirs).
func TestReserveSlotsAndCancel(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	clock := pgtest.NewClock(t, pool)
	clock.Freeze(t0)
	mustSet(t, pool, ratelimit.Policy{Name: "line", Rate: 10, Period: time.Second, Burst: 1})
	k := []ratelimit.Limit{lim("line", "k")}
	var rs []ratelimit.Reservation
	for i := range 3 {
		r, err := ratelimit.Reserve(ctx, pool, 1, k, time.Second, nil)
		if err != nil || !r.Allowed || r.Delay != time.Duration(i)*100*time.Millisecond || !r.At.Equal(t0.Add(r.Delay)) {
			t.Fatalf("reservation %d = %+v, %v; want a slot in %v", i, r, err, time.Duration(i)*100*time.Millisecond)
		}
		rs = append(rs, r)
	}
	r, err := ratelimit.Reserve(ctx, pool, 1, k, 150*time.Millisecond, nil)
	if err != nil || r.Allowed || r.RetryAfter != 150*time.Millisecond || !r.At.Equal(t0.Add(150*time.Millisecond)) {
		t.Fatalf("reservation past the max wait = %+v, %v; want refused, retry in 150ms (at t0+150ms)", r, err)
	}
	// Cancelling the middle one changes nothing: the next slot is still at 300 ms.
	if err := rs[1].Cancel(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if st, _ := ratelimit.State(ctx, pool, k[0]); st.ResetAfter != 300*time.Millisecond {
		t.Fatalf("after cancelling a middle reservation the key resets in %v, want 300ms", st.ResetAfter)
	}
	// Cancelling the last one gives its slot back: the next reservation gets 200 ms again.
	if err := rs[2].Cancel(ctx, pool); err != nil {
		t.Fatal(err)
	}
	r, err = ratelimit.Reserve(ctx, pool, 1, k, time.Second, nil)
	if err != nil || !r.Allowed || r.Delay != 200*time.Millisecond {
		t.Fatalf("reservation after a cancel = %+v, %v; want the 200ms slot back", r, err)
	}
	if _, err := ratelimit.Reserve(ctx, pool, 1, k, ratelimit.MaxWait+time.Second, nil); err == nil {
		t.Fatal("a max wait above MaxWait was accepted")
	}
}

// A reservation cancelled after its policy's rate changed puts its keys back exactly as
// they were before it — on a single key (one UPDATE) and on nested keys — neither giving
// back more than it took (which would admit beyond the limit) nor less.
func TestCancelAfterARateChangeRestoresTheKeys(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	pgtest.NewClock(t, pool).Freeze(t0)
	mustSet(t, pool, ratelimit.Policy{Name: "a", Rate: 10, Period: time.Second, Burst: 1})
	mustSet(t, pool, ratelimit.Policy{Name: "b", Rate: 10, Period: time.Second, Burst: 1})
	for _, limits := range [][]ratelimit.Limit{{lim("a", "one")}, {lim("a", "k"), lim("b", "k")}} {
		if _, err := ratelimit.Reserve(ctx, pool, 1, limits, time.Hour, nil); err != nil { // the key's next slot: 100 ms
			t.Fatal(err)
		}
		r, err := ratelimit.Reserve(ctx, pool, 1, limits, time.Hour, nil) // 100 ms more
		if err != nil || !r.Allowed || r.Delay != 100*time.Millisecond {
			t.Fatalf("%v: second reservation %+v, %v", limits, r, err)
		}
		// The rate drops tenfold: a unit is now a second, not 100 ms.
		mustSet(t, pool, ratelimit.Policy{Name: "a", Rate: 1, Period: time.Second, Burst: 1})
		mustSet(t, pool, ratelimit.Policy{Name: "b", Rate: 1, Period: time.Second, Burst: 1})
		if err := r.Cancel(ctx, pool); err != nil {
			t.Fatal(err)
		}
		for _, l := range limits {
			if st, err := ratelimit.State(ctx, pool, l); err != nil || st.ResetAfter != 100*time.Millisecond {
				t.Errorf("%v after the cancel: resets in %v (%v), want 100ms: the key as before the reservation", l, st.ResetAfter, err)
			}
		}
		mustSet(t, pool, ratelimit.Policy{Name: "a", Rate: 10, Period: time.Second, Burst: 1})
		mustSet(t, pool, ratelimit.Policy{Name: "b", Rate: 10, Period: time.Second, Burst: 1})
	}
}

// Wait sleeps until the slot, never returns before it, refuses a slot past the deadline
// without charging, and gives the slot back when its context ends first.
func TestWait(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	mustSet(t, pool, ratelimit.Policy{Name: "slow", Rate: 20, Period: time.Second, Burst: 1})
	k := []ratelimit.Limit{lim("slow", "k")}
	start := time.Now()
	for range 5 {
		if _, err := ratelimit.Wait(ctx, pool, 1, k, nil); err != nil {
			t.Fatal(err)
		}
	}
	// Five units at 20/s with a burst of 1: the fifth slot is 200 ms after the first.
	if el := time.Since(start); el < 200*time.Millisecond {
		t.Fatalf("5 waits at 20/s took %v: a slot was early", el)
	}

	mustSet(t, pool, ratelimit.Policy{Name: "hourly", Rate: 1, Period: time.Hour, Burst: 1})
	h := []ratelimit.Limit{lim("hourly", "k")}
	if _, err := ratelimit.Wait(ctx, pool, 1, h, nil); err != nil {
		t.Fatal(err)
	}
	dctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if _, err := ratelimit.Wait(dctx, pool, 1, h, nil); !errors.Is(err, ratelimit.ErrTooLong) {
		t.Fatalf("Wait for a slot an hour away with a minute's deadline = %v, want ErrTooLong", err)
	}
	st, err := ratelimit.State(ctx, pool, h[0])
	if err != nil || st.ResetAfter > time.Hour {
		t.Fatalf("a refused Wait charged: %+v, %v", st, err)
	}
	before := st.ResetAfter

	// A waiter whose context ends while it sleeps gives its slot back. It waits on a pool
	// of its own, so that the test can tell it is asleep: its reservation is in the
	// database and its connection is back in its pool (it read the reply). A cancel while
	// the reply is still on its way would end the call before it knows its slot (the
	// reservation then stays charged, as Wait's documentation says).
	var schema string
	if err := pool.QueryRow(ctx, "SELECT current_schema()").Scan(&schema); err != nil {
		t.Fatal(err)
	}
	waiterPool := pgtest.NewPool(t, pgtest.URL(t), schema)
	cctx, cancelWait := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { _, err := ratelimit.Wait(cctx, waiterPool, 1, h, nil); done <- err }()
	pgtest.Until(t, "the waiter's reservation, and the waiter asleep", func() bool {
		st, err := ratelimit.State(ctx, pool, h[0])
		return err == nil && st.ResetAfter > before+30*time.Minute && waiterPool.Stat().AcquiredConns() == 0
	})
	cancelWait()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled Wait = %v", err)
	}
	if st, err := ratelimit.State(ctx, pool, h[0]); err != nil || st.ResetAfter > before {
		t.Fatalf("after the cancelled wait the key resets in %v (%v), want at most %v: the slot was not given back", st.ResetAfter, err, before)
	}
}
