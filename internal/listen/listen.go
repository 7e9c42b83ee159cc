// Package listen is the waiting side shared by pgcoord's blocking calls (leases.Acquire,
// semaphore.Acquire, outbox relays).
//
// Every waiter of a pool shares one LISTEN connection: the pool's notifier, which takes a
// connection from the pool once (and hijacks it, so the pool may open another in its
// place), LISTENs on the channels its waiters need and fans each notification out to the
// waiters it concerns. A waiter holds no connection while it waits: however many wait, the
// pool keeps its connections for the work that must not wait — a holder's renewals above
// all. The notifier closes its connection shortly after its last waiter leaves.
//
// # Strangers
//
// Any login of the database may LISTEN on pgcoord's channels and NOTIFY them: PostgreSQL
// asks no privilege for either. So notifications carry no name (a lease name or semaphore
// key travels as its Tag, a truncated SHA-256), and a notification only ever makes a
// waiter check again — never decides anything. Forged notifications cost a bounded amount
// of work: a waiter returns early from Wait for notifications at most WakeBurst times in
// a row, then at most once per WakeGap (10 ms), so over any span T it makes at most
// WakeBurst + T/WakeGap checks more than its timeouts alone would make (at most 100 a
// second sustained), however many notifications arrive; the rest are coalesced into the
// next early return. TestForgedNotificationsAreCoalesced and leases'
// TestForgedNotificationsBoundAcquireStatements show it under 10,000 forged notifications
// a second.
package listen

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// linger is how long a notifier keeps its connection after its last waiter left, and a
// channel LISTENed after the channel's last waiter left, so that waiters that come and go
// (a lease handed from waiter to waiter) do not open and close a connection, nor UNLISTEN
// and LISTEN again, each. A notifier reads it once, when it is created (under the
// registry's lock, so tests may change it).
var linger = 10 * time.Second

// Waiter waits for a notification on one channel carrying one payload (any payload when
// it is ""), or for a timeout. Create it before the attempt whose failure it waits after,
// so nothing sent in between is missed.
type Waiter struct {
	n    *notifier // nil: the waiter only sleeps
	wake chan struct{}
	key  subKey
	// tat is the theoretical arrival time of the generic cell-rate algorithm that spaces
	// the waiter's early returns: each moves it WakeGap later (from now at the earliest),
	// and an early return may come no earlier than tat - (WakeBurst-1)*WakeGap. Only Wait's
	// goroutine touches it (a Waiter is not for concurrent Waits).
	tat time.Time
}

// WakeGap and WakeBurst bound how often a waiter returns early from Wait for
// notifications: at most WakeBurst times in a row, then once per WakeGap.
const (
	WakeGap   = 10 * time.Millisecond
	WakeBurst = 4
)

// New returns a waiter on pool for notifications on channel with payload. With an empty
// channel, or on a pool that goes through a transaction-mode pooler (see Pooled), where
// notifications are not delivered, the waiter only sleeps. Otherwise, when New returns,
// the pool's notifier is LISTENing on channel. Close the waiter when done.
func New(ctx context.Context, pool *pgxpool.Pool, channel, payload string) (*Waiter, error) {
	w := &Waiter{wake: make(chan struct{}, 1), key: subKey{channel, payload}}
	if channel == "" || Pooled(pool) {
		return w, nil
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	for {
		n := notifierOf(pool)
		err := n.subscribe(ctx, w)
		if errors.Is(err, errRetired) {
			continue // it retired between the lookup and the subscription: take the new one
		}
		if errors.Is(err, errPooled) {
			// A pooler would not deliver notifications: a fresh waiter (the notifier may
			// have woken w on its way out) that only sleeps.
			return &Waiter{wake: make(chan struct{}, 1), key: w.key}, nil
		}
		if err != nil {
			return nil, err
		}
		w.n = n
		return w, nil
	}
}

// Wait returns after d, when a notification for the waiter arrives (or arrived since the
// last Wait), or with ctx's error when ctx ends. It may also return early when the
// notifier lost its connection and notifications may have been missed: the caller checks
// again either way.
//
// Early returns are spaced (see the package doc): after WakeBurst of them in quick
// succession, a notification makes Wait return WakeGap after the previous early return (or
// after d, if that comes first). Wait is not for concurrent use on one Waiter.
func (w *Waiter) Wait(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	// Nothing but this select is on the stack while a waiter sleeps (the spacing below runs
	// in a call of its own), so that the stack of a parked caller can shrink.
	t := time.NewTimer(d)
	select {
	case <-ctx.Done():
		t.Stop()
		return ctx.Err()
	case <-t.C:
		return nil
	case <-w.wake:
	}
	err := w.space(ctx, t)
	t.Stop()
	return err
}

// space returns from a Wait woken by a notification: at once, or, when woken too often
// lately (notifications anyone can forge), once this wake-up's turn comes (anything that
// arrives meanwhile is folded into it), at the end of Wait's timer t, or when ctx ends.
func (w *Waiter) space(ctx context.Context, t *time.Timer) error {
	if delay := w.wakeDelay(time.Now()); delay > 0 {
		g := time.NewTimer(delay)
		defer g.Stop()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
			return nil
		case <-g.C:
		}
	}
	w.woke(time.Now())
	return nil
}

// woke records an early return at now.
func (w *Waiter) woke(now time.Time) {
	if w.tat.Before(now) {
		w.tat = now
	}
	w.tat = w.tat.Add(WakeGap)
}

// wakeDelay is how long an early return at now must wait to keep the spacing of early
// returns.
func (w *Waiter) wakeDelay(now time.Time) time.Duration {
	return w.tat.Add(-(WakeBurst - 1) * WakeGap).Sub(now)
}

// Listening reports whether the waiter is woken by notifications (or only sleeps).
func (w *Waiter) Listening() bool { return w.n != nil }

// Close removes the waiter from its notifier.
func (w *Waiter) Close() {
	if w.n != nil {
		w.n.unsubscribe(w)
		w.n = nil
	}
}

// signal wakes the waiter without blocking; a wake-up already pending is enough.
func (w *Waiter) signal() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

type subKey struct{ channel, payload string }

// Tag is the payload pgcoord's notifications carry for a lease name or semaphore key: the
// first 32 hex digits of the SHA-256 of name, as the SQL function pgcoord_wake_tag computes
// it. Any login may LISTEN on pgcoord's channels; a tag does not tell it the name (though it
// can confirm a guess).
func Tag(name string) string {
	sum := sha256.Sum256([]byte(name))
	return hex.EncodeToString(sum[:16])
}
