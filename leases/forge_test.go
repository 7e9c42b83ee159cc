package leases_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/internal/listen"
	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/leases"
)

// TestForgedNotificationsBoundAcquireStatements is the attack of a login with no grant
// that floods the lease channel with the payload of a lease someone waits for (a tag it
// can compute from a guessed name, or copy from a real notification): 10,000 forged
// notifications, at up to 10,000 a second. The waiting Acquire's statements, counted by a
// pgx tracer on its pool, stay within one per check with checks bounded as
// internal/listen states: WakeBurst + T/WakeGap (+1 for the span's edges) over the span T
// of the flood — not one per notification.
func TestForgedNotificationsBoundAcquireStatements(t *testing.T) {
	// Behind a pooler a waiter polls and hears no notification, forged or not: the bound
	// there is its PollInterval's.
	pgtest.NeedsSession(t, "LISTEN: the waiting Acquire is woken by notifications")
	t.Parallel()
	other := pgtest.Pool(t)
	cfg := other.Config()
	rt := &pgtest.RoundTrips{}
	cfg.ConnConfig.Tracer = rt
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	direct := pgtest.Direct(t, other) // notifications need a session of their own

	mustAcquire(t, other, "payroll", time.Hour, nil)
	actx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := leases.Acquire(actx, pool, "payroll", time.Minute, &leases.AcquireOpts{PollInterval: time.Hour})
		done <- err
	}()
	// Acquire waits once its registration (wanted_until) is visible: its statement ran.
	deadline := time.Now().Add(pgtest.WaitLimit)
	for {
		var waiting bool
		if err := other.QueryRow(ctx, `SELECT coalesce(wanted_until > now(), false) FROM pgcoord_leases WHERE name = 'payroll'`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Acquire did not register as a waiter within %v", pgtest.WaitLimit)
		}
		time.Sleep(5 * time.Millisecond)
	}
	var channel string
	if err := other.QueryRow(ctx, `SELECT pgcoord_channel('leases')`).Scan(&channel); err != nil {
		t.Fatal(err)
	}
	before, start := rt.N(), time.Now()
	rate := forgeNotifications(t, direct, channel, listen.Tag("payroll"), 10000)
	// Whatever the flood woke has been dispatched once a later notification was: wait for
	// one on a waiter of the same pool's notifier.
	w, err := listen.New(ctx, pool, channel, "marker")
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if _, err := direct.Exec(ctx, `SELECT pg_notify($1, 'marker')`, channel); err != nil {
		t.Fatal(err)
	}
	wctx, wcancel := context.WithTimeout(ctx, pgtest.WaitLimit)
	defer wcancel()
	if err := w.Wait(wctx, time.Hour); err != nil {
		t.Fatalf("the marker notification did not arrive: %v", err)
	}
	elapsed := time.Since(start)
	used := rt.N() - before
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Acquire: %v, want it canceled (still waiting)", err)
	}
	bound := int64(listen.WakeBurst) + int64(elapsed/listen.WakeGap) + 1
	t.Logf("forged 10000 notifications at %.0f/s over %v: the waiting Acquire sent %d statements (bound %d)", rate, elapsed, used, bound)
	if used > bound {
		t.Errorf("the waiting Acquire sent %d statements during 10000 forged notifications over %v, want at most %d", used, elapsed, bound)
	}
}

// forgeNotifications sends n notifications on channel with payload, as any login may,
// each in a transaction of its own (PostgreSQL folds equal notifications of one
// transaction), a hundred per round trip, at most 10,000 a second. It returns the rate
// it reached.
func forgeNotifications(t *testing.T, pool *pgxpool.Pool, channel, payload string, n int) float64 {
	t.Helper()
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
	q := strings.Repeat("BEGIN; SELECT pg_notify('"+channel+"', '"+payload+"'); COMMIT; ", batch)
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
