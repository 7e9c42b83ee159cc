// Package listen is the waiting side shared by pgcoord's blocking calls (leases.Acquire,
// semaphore.Acquire, outbox relays).
//
// Every waiter of a pool shares one LISTEN connection: the pool's notifier, which takes a
// connection from the pool once (and hijacks it, so the pool may open another in its
// place), LISTENs on the channels its waiters need and fans each notification out to the
// waiters it concerns. A waiter holds no connection while it waits: however many wait, the
// pool keeps its connections for the work that must not wait — a holder's renewals above
// all. The notifier closes its connection shortly after its last waiter leaves.
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
}

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
func (w *Waiter) Wait(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	case <-w.wake:
		return nil
	}
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
