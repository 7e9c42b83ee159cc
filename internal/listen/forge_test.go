package listen

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// forge sends n notifications on channel with payload as a stranger would, each in a
// transaction of its own (PostgreSQL folds equal notifications of one transaction into
// one), a hundred per round trip, at most 10,000 a second. It returns the rate it reached.
func forge(t *testing.T, pool *pgxpool.Pool, channel, payload string, n int) float64 {
	t.Helper()
	ctx := context.Background()
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, "SET synchronous_commit = off"); err != nil {
		t.Fatal(err)
	}
	defer conn.Exec(ctx, "RESET synchronous_commit") //nolint:errcheck // best effort
	const batch = 100
	one := "BEGIN; SELECT pg_notify('" + channel + "', '" + payload + "'); COMMIT; "
	q := strings.Repeat(one, batch)
	start := time.Now()
	sent := 0
	for sent < n {
		if ahead := time.Until(start.Add(time.Duration(sent) * time.Second / 10000)); ahead > 0 {
			time.Sleep(ahead)
		}
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
		sent += batch
	}
	return float64(sent) / time.Since(start).Seconds()
}

// TestForgedNotificationsAreCoalesced: 10,000 notifications forged for a waiter's channel
// and payload, at up to 10,000 a second, make its Wait return early at most
// WakeBurst + T/WakeGap times over the span T they take (plus the one wake-up that may
// be pending at the end), however many arrive.
func TestForgedNotificationsAreCoalesced(t *testing.T) {
	pool, ch := newPool(t)
	tag := Tag("payroll")
	w := mustNew(t, pool, ch, tag)

	var returns atomic.Int64
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for w.Wait(ctx, time.Hour) == nil { // an hour: every return is a notification's
			returns.Add(1)
		}
	}()
	start := time.Now()
	rate := forge(t, pool, ch, tag, 10000)
	// The last notifications reach the waiter after forge returns: one more, sent after
	// them, is dispatched after them, so it wakes this second waiter only once they were.
	last := mustNew(t, pool, ch, "last")
	notify(t, pool, ch, "last")
	woken(t, "the waiter of the last notification", last)
	elapsed := time.Since(start)
	cancel()
	<-done

	bound := WakeBurst + int64(elapsed/WakeGap) + 1
	got := returns.Load()
	t.Logf("forged 10000 notifications at %.0f/s over %v: Wait returned early %d times (bound %d)", rate, elapsed, got, bound)
	if got > bound {
		t.Errorf("Wait returned early %d times for 10000 forged notifications over %v, want at most %d (WakeBurst + T/WakeGap + 1)", got, elapsed, bound)
	}
	if got == 0 {
		t.Error("the forged notifications never woke the waiter: the test forged nothing")
	}
}

// TestWakeUpsAreSpacedNotLost: WakeBurst early returns in a row are free, the next must
// wait WakeGap; and a wake-up that must wait is delayed, not dropped: it still returns
// before the waiter's own timeout of an hour.
func TestWakeUpsAreSpacedNotLost(t *testing.T) {
	w := &Waiter{wake: make(chan struct{}, 1)}
	now := time.Now()
	for i := range WakeBurst {
		if d := w.wakeDelay(now); d > 0 {
			t.Fatalf("early return %d of a burst must wait %v, want none within the burst", i+1, d)
		}
		w.woke(now)
	}
	if d := w.wakeDelay(now); d != WakeGap {
		t.Fatalf("after a burst of %d early returns, the next must wait %v, want WakeGap (%v)", WakeBurst, d, WakeGap)
	}
	if d := w.wakeDelay(now.Add(WakeGap)); d > 0 {
		t.Fatalf("WakeGap later, the next must still wait %v, want none", d)
	}
	w.tat = time.Now().Add(WakeBurst * WakeGap) // a burst just now
	w.signal()
	if err := w.Wait(context.Background(), time.Hour); err != nil {
		t.Fatal(err)
	}
}
