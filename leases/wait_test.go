package leases_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/internal/listen"
	"github.com/pgcoord/pgcoord/internal/pgconfig"
	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/leases"
)

type acquired struct {
	lease leases.Lease
	err   error
	at    time.Time
}

func acquireAsync(f func() (leases.Lease, error)) <-chan acquired {
	ch := make(chan acquired, 1)
	go func() {
		l, err := f()
		ch <- acquired{l, err, time.Now()}
	}()
	return ch
}

// waitForWaiter returns once a waiter has registered its interest in name.
func waitForWaiter(t *testing.T, pool pgxQuerier, name string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		var waiting bool
		if err := pool.QueryRow(ctx, `SELECT coalesce(wanted_until > pgcoord_now(), false) FROM pgcoord_leases WHERE name = $1`, name).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("no waiter registered for %q within 10s", name)
}

type pgxQuerier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// A release wakes a waiting Acquire at once: with a poll interval of a minute, only the
// notification can explain a prompt return.
func TestAcquireIsWokenByRelease(t *testing.T) {
	pgtest.NeedsSession(t, "LISTEN: the wake-up by notification; behind a pooler Acquire polls (TestAcquireWithoutListenPolls)")
	t.Parallel()
	pool := pgtest.Pool(t)
	held := mustAcquire(t, pool, "handoff", time.Hour, nil)
	got := acquireAsync(func() (leases.Lease, error) {
		return leases.Acquire(ctx, pool, "handoff", time.Minute, &leases.AcquireOpts{PollInterval: time.Minute})
	})
	waitForWaiter(t, pool, "handoff")
	released := time.Now()
	if err := leases.Release(ctx, pool, held, nil); err != nil {
		t.Fatal(err)
	}
	select {
	case a := <-got:
		if a.err != nil || a.lease.Token <= held.Token {
			t.Fatalf("Acquire after release: %+v, %v", a.lease, a.err)
		}
		t.Logf("handoff took %v", a.at.Sub(released))
	case <-time.After(10 * time.Second):
		t.Fatal("Acquire was not woken by the release")
	}
}

// A holder that dies without releasing is replaced when its grant expires: Acquire
// schedules its next attempt at the expiry it read, not at the next poll.
func TestAcquireTakesOverAtExpiry(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	dead := mustAcquire(t, pool, "dead-holder", 300*time.Millisecond, nil)
	start := time.Now()
	l, err := leases.Acquire(ctx, pool, "dead-holder", time.Minute, &leases.AcquireOpts{PollInterval: time.Minute})
	if err != nil || l.Token <= dead.Token {
		t.Fatalf("Acquire after the holder died: %+v, %v", l, err)
	}
	if waited := time.Since(start); waited > 20*time.Second {
		t.Fatalf("Acquire waited %v for a 300ms lease: it did not wake at expiry", waited)
	}
}

// Without LISTEN (behind a transaction pooler), Acquire still gets the lease by polling.
func TestAcquireWithoutListenPolls(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	held := mustAcquire(t, pool, "polled", time.Hour, nil)
	got := acquireAsync(func() (leases.Lease, error) {
		return leases.Acquire(ctx, pool, "polled", time.Minute, &leases.AcquireOpts{NoListen: true, PollInterval: 50 * time.Millisecond})
	})
	waitForWaiter(t, pool, "polled")
	if err := leases.Release(ctx, pool, held, nil); err != nil {
		t.Fatal(err)
	}
	select {
	case a := <-got:
		if a.err != nil {
			t.Fatal(a.err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a polling Acquire did not get the released lease")
	}
}

// A waiting Acquire holds no connection of the pool between its attempts (the shared
// notifier's is not the pool's any more), and gives up with its context.
func TestAcquireHoldsNoConnectionWhileWaiting(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	mustAcquire(t, pool, "busy", time.Hour, nil)
	waitCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	got := acquireAsync(func() (leases.Lease, error) {
		return leases.Acquire(waitCtx, pool, "busy", time.Minute, &leases.AcquireOpts{PollInterval: time.Minute})
	})
	waitForWaiter(t, pool, "busy")
	// Between attempts (the next is a minute away) no connection is checked out.
	deadline := time.Now().Add(pgtest.WaitLimit)
	for pool.Stat().AcquiredConns() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("a waiting Acquire keeps %d connections of the pool checked out", pool.Stat().AcquiredConns())
		}
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	select {
	case a := <-got:
		if !errors.Is(a.err, context.Canceled) {
			t.Fatalf("Acquire after its context was cancelled: %v", a.err)
		}
	case <-time.After(pgtest.WaitLimit):
		t.Fatal("Acquire did not return when its context was cancelled")
	}
	if n := pool.Stat().AcquiredConns(); n != 0 {
		t.Fatalf("%d connections still checked out after Acquire returned", n)
	}
	// The pool's connections are clean: none of them listens.
	var listening int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_listening_channels()`).Scan(&listening); err != nil {
		t.Fatal(err)
	}
	if listening != 0 {
		t.Fatalf("a pooled connection listens on %d channels", listening)
	}
}

// Release notifies only while someone waits: NOTIFY serializes commits database-wide, so
// an uncontended release must not send one.
func TestReleaseNotifiesOnlyWhenSomeoneWaits(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	conn, err := pgtest.Direct(t, pool).Acquire(ctx) // LISTEN needs a session of its own
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	var channel string
	if err := conn.QueryRow(ctx, `SELECT pgcoord_channel('leases')`).Scan(&channel); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{channel}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	defer conn.Exec(ctx, "UNLISTEN *")
	notified := func() bool {
		// A round trip delivers any notification already queued for this session.
		if _, err := conn.Exec(ctx, "SELECT 1"); err != nil {
			t.Fatal(err)
		}
		wctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		defer cancel()
		n, err := conn.Conn().WaitForNotification(wctx)
		return err == nil && n.Payload == listen.Tag("quiet")
	}

	l := mustAcquire(t, pool, "quiet", time.Minute, nil)
	if err := leases.Release(ctx, pool, l, nil); err != nil {
		t.Fatal(err)
	}
	if notified() {
		t.Fatal("a release nobody waited for sent a notification")
	}
	l = mustAcquire(t, pool, "quiet", time.Minute, nil)
	// Register a waiter the way Acquire does.
	if _, err := pool.Exec(ctx, `SELECT * FROM pgcoord_lease_wait('quiet', 'waiter', '1 minute', '10 seconds')`); err != nil {
		t.Fatal(err)
	}
	if err := leases.Release(ctx, pool, l, nil); err != nil {
		t.Fatal(err)
	}
	if !notified() {
		t.Fatal("a release with a waiter sent no notification")
	}
}

// An application pool with its own notification handler (pgx then hands notifications to
// the handler, not to WaitForNotification) still gets woken leases.
func TestAcquireWithTheApplicationsNotificationHandler(t *testing.T) {
	t.Parallel()
	_, schema := pgtest.Schema(t)
	cfg, err := pgconfig.Pool(pgtest.URL(t), pgconfig.Options{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.OnNotification = func(*pgconn.PgConn, *pgconn.Notification) {}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	migrate(t, pool)
	held := mustAcquire(t, pool, "handled", time.Hour, nil)
	got := acquireAsync(func() (leases.Lease, error) {
		return leases.Acquire(ctx, pool, "handled", time.Minute, &leases.AcquireOpts{PollInterval: time.Minute})
	})
	waitForWaiter(t, pool, "handled")
	if err := leases.Release(ctx, pool, held, nil); err != nil {
		t.Fatal(err)
	}
	select {
	case a := <-got:
		if a.err != nil {
			t.Fatal(a.err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Acquire was not woken")
	}
}
