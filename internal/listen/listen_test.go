package listen

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/internal/pgtest"
)

// The tests of this package do not run in parallel: some change linger, which a notifier
// reads when it is created.
func TestMain(m *testing.M) { pgtest.Main(m) }

// setLinger sets linger for the notifiers created until t ends.
func setLinger(t *testing.T, d time.Duration) {
	t.Helper()
	registry.Lock()
	old := linger
	linger = d
	registry.Unlock()
	t.Cleanup(func() {
		registry.Lock()
		linger = old
		registry.Unlock()
	})
}

// newPool returns a pool of its own for t, and a channel name no other test uses
// (notifications are database-wide). When t ends, the pool's notifier is told to retire
// at once (its waiters are closed by then) and must have.
func newPool(t *testing.T) (*pgxpool.Pool, string) {
	t.Helper()
	pgtest.NeedsSession(t, "LISTEN needs a session")
	pool, schema := pgtest.Schema(t)
	t.Cleanup(func() {
		if n := notifierFor(pool); n != nil {
			n.mu.Lock()
			n.linger = 0
			n.kick()
			n.mu.Unlock()
		}
		waitRetired(t, pool)
	})
	return pool, "listen_" + schema
}

// notifierFor returns pool's current notifier, or nil.
func notifierFor(pool *pgxpool.Pool) *notifier {
	registry.Lock()
	defer registry.Unlock()
	return registry.m[pool]
}

// waitRetired waits until pool's notifier has retired and its goroutine has returned.
func waitRetired(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	n := notifierFor(pool)
	if n == nil {
		return
	}
	n.mu.Lock()
	done := n.done
	n.mu.Unlock()
	if done != nil {
		select {
		case <-done:
		case <-time.After(pgtest.WaitLimit):
			t.Errorf("the notifier's goroutine still runs %v after its waiters left", pgtest.WaitLimit)
			return
		}
	}
	if notifierFor(pool) == n {
		t.Errorf("the notifier's goroutine returned, but it is still registered")
	}
}

func notify(t *testing.T, pool *pgxpool.Pool, channel, payload string) {
	t.Helper()
	if _, err := pool.Exec(context.Background(), `SELECT pg_notify($1, $2)`, channel, payload); err != nil {
		t.Fatal(err)
	}
}

func mustNew(t *testing.T, pool *pgxpool.Pool, channel, payload string) *Waiter {
	t.Helper()
	w, err := New(context.Background(), pool, channel, payload)
	if err != nil {
		t.Fatalf("New(%q, %q): %v", channel, payload, err)
	}
	t.Cleanup(w.Close)
	return w
}

// woken waits for w's wake-up: with a wait of an hour, only a signal makes Wait return
// within pgtest.WaitLimit.
func woken(t *testing.T, what string, w *Waiter) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), pgtest.WaitLimit)
	defer cancel()
	if err := w.Wait(ctx, time.Hour); err != nil {
		t.Fatalf("%s: not woken within %v (%v)", what, pgtest.WaitLimit, err)
	}
}

// signalled reports whether w has a wake-up pending, without waiting.
func signalled(w *Waiter) bool {
	select {
	case <-w.wake:
		return true
	default:
		return false
	}
}

// waitFor polls cond until it holds, at most pgtest.WaitLimit.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(pgtest.WaitLimit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, pgtest.WaitLimit)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A notification wakes the waiters of its payload and those of any payload, and no other;
// all of them share one connection, which is not the pool's.
func TestFanOutByPayload(t *testing.T) {
	pool, ch := newPool(t)
	a1, a2 := mustNew(t, pool, ch, "a"), mustNew(t, pool, ch, "a")
	b := mustNew(t, pool, ch, "b")
	all := mustNew(t, pool, ch, "")
	barrier := mustNew(t, pool, ch, "barrier")
	other := mustNew(t, pool, ch+"_other", "a") // another channel, same payload

	if a1.n != a2.n || a1.n != all.n || a1.n != other.n || a1.n == nil {
		t.Fatal("the waiters of one pool do not share one notifier")
	}
	if n := pool.Stat().AcquiredConns(); n != 0 {
		t.Fatalf("%d connections of the pool are checked out while 6 waiters wait, want 0", n)
	}

	notify(t, pool, ch, "a")
	woken(t, "waiter of payload a", a1)
	woken(t, "second waiter of payload a", a2)
	woken(t, "waiter of any payload", all)
	// Notifications of one channel arrive in order and are dispatched one after the other:
	// once the barrier's arrived, a's has been dispatched, and it woke nobody else.
	notify(t, pool, ch, "barrier")
	woken(t, "barrier", barrier)
	if signalled(b) {
		t.Error("a notification with payload a woke the waiter of payload b")
	}
	if signalled(other) {
		t.Error("a notification on one channel woke a waiter of another channel")
	}
	woken(t, "the waiter of any payload, by the barrier's notification", all)

	notify(t, pool, ch+"_other", "a")
	woken(t, "waiter of the other channel", other)
	if signalled(a1) {
		t.Error("a notification on another channel woke a waiter of this one")
	}
}

// A waiter created before a NOTIFY is woken by it even if it calls Wait only afterwards:
// New returns once the notifier LISTENs, and the wake-up waits for the next Wait.
func TestAWaiterCreatedBeforeTheNotifyIsWoken(t *testing.T) {
	pool, ch := newPool(t)
	w := mustNew(t, pool, ch, "job")
	notify(t, pool, ch, "job")
	// Give the notification time to be dispatched before Wait runs; Wait must not need
	// to be running when it arrives.
	waitFor(t, "the wake-up", func() bool { return len(w.wake) == 1 })
	woken(t, "a waiter created before the notification", w)
	// One wake-up per notification: the next Wait waits.
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := w.Wait(ctx, time.Hour); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a second Wait after one notification returned %v, want to wait until its context ended", err)
	}
	// A sleep-only waiter (channel "") sleeps for d and holds no notifier.
	s := mustNew(t, pool, "", "")
	if s.n != nil {
		t.Fatal("a sleep-only waiter subscribed to the notifier")
	}
	start := time.Now()
	if err := s.Wait(context.Background(), 20*time.Millisecond); err != nil || time.Since(start) < 20*time.Millisecond {
		t.Fatalf("a sleep-only waiter's Wait: %v after %v", err, time.Since(start))
	}
}

// When the notifier's connection dies (pg_terminate_backend), every waiter is woken to
// check again, and the notifier LISTENs again on a new connection: a later NOTIFY still
// arrives.
func TestTheNotifierSurvivesATerminatedConnection(t *testing.T) {
	pool, ch := newPool(t)
	w := mustNew(t, pool, ch, "job")
	other := mustNew(t, pool, ch, "other")
	n := w.n
	pid := func() uint32 {
		n.mu.Lock()
		defer n.mu.Unlock()
		if n.conn == nil || !n.listening[ch] {
			return 0
		}
		return n.conn.PgConn().PID()
	}
	old := pid()
	if old == 0 {
		t.Fatal("the notifier does not LISTEN after New returned")
	}
	var terminated bool
	if err := pool.QueryRow(context.Background(), `SELECT pg_terminate_backend($1)`, old).Scan(&terminated); err != nil || !terminated {
		t.Fatalf("pg_terminate_backend(%d) = %v, %v", old, terminated, err)
	}
	woken(t, "a waiter whose notifier lost its connection", w)
	woken(t, "another waiter whose notifier lost its connection", other)
	waitFor(t, "the notifier LISTENing again on a new connection", func() bool {
		n.mu.Lock()
		again := n.relisten > 0
		n.mu.Unlock()
		return again && pid() != 0 && pid() != old
	})
	signalled(w) // the wake-up of the new LISTEN
	signalled(other)

	notify(t, pool, ch, "job")
	woken(t, "a waiter, by a notification sent after the reconnection", w)
	notify(t, pool, ch, "other")
	woken(t, "the other waiter, after the reconnection", other)
	if signalled(w) {
		t.Error("a notification for another payload woke the waiter after the reconnection")
	}
	if notifierFor(pool) != n {
		t.Error("the notifier was replaced instead of reconnecting")
	}
}

// A notifier keeps its connection for linger after its last waiter left: a waiter coming
// back meanwhile gets the same notifier and connection.
func TestTheNotifierLingers(t *testing.T) {
	setLinger(t, time.Minute)
	pool, ch := newPool(t)
	w := mustNew(t, pool, ch, "job")
	n := w.n
	n.mu.Lock()
	pid := n.conn.PgConn().PID()
	n.mu.Unlock()
	w.Close()
	again := mustNew(t, pool, ch, "job")
	n.mu.Lock()
	samePID := n.conn != nil && n.conn.PgConn().PID() == pid
	n.mu.Unlock()
	if again.n != n || !samePID {
		t.Fatal("a waiter that came back within linger got a new notifier or connection")
	}
	notify(t, pool, ch, "job")
	woken(t, "a waiter that came back", again)
}

// After linger with no waiter, a notifier closes its connection, leaves the registry and
// stops its goroutine: nothing is left behind. A later waiter gets a new one, which works.
func TestTheNotifierRetiresAfterItsLastWaiterLeft(t *testing.T) {
	setLinger(t, 100*time.Millisecond)
	pool, ch := newPool(t)
	w := mustNew(t, pool, ch, "job")
	n := w.n
	n.mu.Lock()
	pid, done := n.conn.PgConn().PID(), n.done
	n.mu.Unlock()
	w.Close()

	select {
	case <-done:
	case <-time.After(pgtest.WaitLimit):
		t.Fatalf("the notifier's goroutine still runs %v after its last waiter left", pgtest.WaitLimit)
	}
	n.mu.Lock()
	conn, retired := n.conn, n.retired
	n.mu.Unlock()
	if notifierFor(pool) == n || !retired || conn != nil {
		t.Fatalf("the notifier's goroutine returned, but the notifier is registered (%v), not retired (%v) or keeps its connection (%v)",
			notifierFor(pool) == n, !retired, conn != nil)
	}
	waitFor(t, "the notifier's connection closed on the server", func() bool {
		var count int
		if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&count); err != nil {
			t.Fatal(err)
		}
		return count == 0
	})
	if c := pool.Stat().AcquiredConns(); c != 0 {
		t.Errorf("%d connections of the pool checked out after the notifier retired", c)
	}

	w2 := mustNew(t, pool, ch, "job")
	if w2.n == n || w2.n == nil {
		t.Fatal("a waiter after the retirement did not get a new notifier")
	}
	notify(t, pool, ch, "job")
	woken(t, "a waiter of the new notifier", w2)
}

// New gives up with its context, and a waiter's Wait returns its context's error.
func TestContexts(t *testing.T) {
	pool, ch := newPool(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := New(ctx, pool, ch, "x"); !errors.Is(err, context.Canceled) {
		t.Errorf("New with a cancelled context: %v, want context.Canceled", err)
	}
	w := mustNew(t, pool, ch, "x")
	if err := w.Wait(ctx, time.Hour); !errors.Is(err, context.Canceled) {
		t.Errorf("Wait with a cancelled context: %v", err)
	}
	if err := w.Wait(context.Background(), 0); err != nil {
		t.Errorf("Wait(0): %v", err)
	}
}

// New returns only once the notifier LISTENs on the waiter's channel, even when waiters of
// many channels come and go at once (subscribers that arrive while the notifier is in the
// middle of LISTENing for others, or UNLISTENing a channel nobody waited on a moment ago):
// a NOTIFY sent right after New returned always arrives.
func TestNewReturnsOnlyOnceListening(t *testing.T) {
	pool, ch := newPool(t)
	const goroutines = 16
	for round := range 5 {
		errs := make(chan error, goroutines)
		for i := range goroutines {
			go func() {
				// Two channels per goroutine each round: one waited on, one that comes
				// and goes (UNLISTENed, LISTENed again).
				c := fmt.Sprintf("%s_%d_%d", ch, round, i)
				churn, err := New(context.Background(), pool, fmt.Sprintf("%s_churn_%d", ch, i%4), "")
				if err != nil {
					errs <- err
					return
				}
				churn.Close()
				w, err := New(context.Background(), pool, c, "")
				if err != nil {
					errs <- err
					return
				}
				defer w.Close()
				if _, err := pool.Exec(context.Background(), `SELECT pg_notify($1, 'x')`, c); err != nil {
					errs <- err
					return
				}
				ctx, cancel := context.WithTimeout(context.Background(), pgtest.WaitLimit)
				defer cancel()
				if err := w.Wait(ctx, time.Hour); err != nil {
					errs <- fmt.Errorf("channel %s: a NOTIFY sent after New returned did not arrive: %w", c, err)
					return
				}
				errs <- nil
			}()
		}
		for range goroutines {
			if err := <-errs; err != nil {
				t.Fatal(err)
			}
		}
	}
}

// A channel whose last waiter left stays LISTENed for linger: a waiter coming back (the
// next Acquire of a lease handed off) subscribes without the loop's UNLISTEN and LISTEN.
func TestAnEmptiedChannelStaysListenedForLinger(t *testing.T) {
	setLinger(t, time.Minute)
	pool, ch := newPool(t)
	w := mustNew(t, pool, ch, "job")
	n := w.n
	// The loop waits (a Close before that could not interrupt it, and it would wait on).
	waitFor(t, "the loop's wait", func() bool {
		n.mu.Lock()
		defer n.mu.Unlock()
		return n.interrupt != nil
	})
	n.mu.Lock()
	before := n.syncs
	n.mu.Unlock()
	w.Close()
	// The loop has seen the channel empty (a round after the Close) and waits again.
	waitFor(t, "the loop's round after the last waiter left", func() bool {
		n.mu.Lock()
		defer n.mu.Unlock()
		return n.syncs > before && n.interrupt != nil
	})
	n.mu.Lock()
	listening, after := n.listening[ch], n.syncs
	n.mu.Unlock()
	if !listening {
		t.Fatal("the channel was UNLISTENed as soon as its last waiter left")
	}
	again := mustNew(t, pool, ch, "job")
	n.mu.Lock()
	rounds := n.syncs - after
	n.mu.Unlock()
	if again.n != n || rounds != 0 {
		t.Fatalf("a waiter coming back needed %d rounds of the loop (same notifier: %v), want none", rounds, again.n == n)
	}
	notify(t, pool, ch, "job")
	woken(t, "a waiter that came back", again)
}

// A channel that has had no waiter for linger is UNLISTENed, while the notifier goes on
// serving the channels that have waiters: nothing stays LISTENed for nobody.
func TestAnEmptiedChannelIsUnlistenedAfterLinger(t *testing.T) {
	setLinger(t, 200*time.Millisecond)
	pool, ch := newPool(t)
	stays := mustNew(t, pool, ch+"_stays", "")
	goes := mustNew(t, pool, ch, "")
	n := goes.n
	goes.Close()
	waitFor(t, "the emptied channel UNLISTENed", func() bool {
		n.mu.Lock()
		defer n.mu.Unlock()
		return !n.listening[ch] && len(n.emptied) == 0
	})
	n.mu.Lock()
	listening := n.listening[ch+"_stays"]
	n.mu.Unlock()
	if !listening || notifierFor(pool) != n {
		t.Fatalf("the channel with a waiter is LISTENed: %v; the notifier is still registered: %v", listening, notifierFor(pool) == n)
	}
	notify(t, pool, ch+"_stays", "")
	woken(t, "the waiter of the other channel", stays)
}

// A New that gives up before the notifier first connected leaves a notifier with a
// subscription to answer, no waiter and no connection: it answers it and retires, where it
// went on to wait for notifications on the connection it did not have, and panicked (seen
// in CI as relays shut down on a loaded machine).
func TestANotifierWithoutAConnectionNeverWaitsOnOne(t *testing.T) {
	setLinger(t, 0) // each round's notifier retires once its waiter is gone: the next starts afresh
	pool, ch := newPool(t)
	for range 200 {
		ctx, cancel := context.WithCancel(context.Background())
		go cancel()
		if w, err := New(ctx, pool, ch, "x"); err == nil {
			w.Close()
		} else if !errors.Is(err, context.Canceled) {
			t.Fatal(err)
		}
		waitRetired(t, pool)
	}
	w := mustNew(t, pool, ch, "y")
	notify(t, pool, ch, "y")
	woken(t, "a waiter after the given-up subscriptions", w)
}
