// Package listen is the waiting side shared by pgcoord's blocking calls (leases.Acquire,
// semaphore.Acquire): a pooled connection that LISTENs on a pgcoord channel, waits for a
// notification with a given payload or a timeout, and goes back to the pool clean.
package listen

import (
	"context"
	"errors"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Waiter owns one connection of a pool while a call waits on it.
type Waiter struct {
	conn    *pgxpool.Conn
	channel string // "" when not listening
}

// New wraps conn. If channel is not empty it LISTENs on it first, so that nothing sent
// after New returns is missed; with an empty channel the Waiter only sleeps (polling, for
// connections through a transaction-mode pooler).
func New(ctx context.Context, conn *pgxpool.Conn, channel string) (*Waiter, error) {
	w := &Waiter{conn: conn}
	if channel == "" {
		return w, nil
	}
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{channel}.Sanitize()); err != nil {
		return nil, err
	}
	w.channel = channel
	return w, nil
}

// Wait returns after d, when a notification with payload arrives, or with ctx's error
// when ctx ends. A notification for another payload is ignored.
func (w *Waiter) Wait(ctx context.Context, payload string, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	wctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	if w.channel == "" {
		<-wctx.Done()
		return ctx.Err()
	}
	for {
		n, err := w.conn.Conn().WaitForNotification(wctx)
		switch {
		case err == nil && n == nil:
			return nil // the pool's OnNotification handler took it: try again to be safe
		case err == nil && n.Payload == payload:
			return nil
		case err == nil:
			continue // another name's
		case ctx.Err() != nil:
			return ctx.Err()
		case wctx.Err() != nil:
			return nil // timed out: pgx leaves the connection usable after a read deadline
		default:
			return err
		}
	}
}

// Close returns the connection to the pool, no longer listening, or destroys it if it
// cannot be cleaned.
func (w *Waiter) Close() {
	if w.channel == "" {
		w.conn.Release()
		return
	}
	if !w.conn.Conn().IsClosed() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if _, err := w.conn.Exec(ctx, "UNLISTEN "+pgx.Identifier{w.channel}.Sanitize()); err == nil {
			w.conn.Release()
			return
		}
	}
	c := w.conn.Hijack()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = c.Close(ctx)
}

// Jitter spreads d by ±20% so waiters do not retry in lockstep.
func Jitter(d time.Duration) time.Duration {
	return time.Duration(float64(d) * (0.8 + 0.4*rand.Float64()))
}

// Ambiguous reports whether err leaves unknown whether a statement committed: the
// connection failed after the statement may have been sent. A grant in that state is
// recovered by asking again as the same holder.
func Ambiguous(ctx context.Context, err error) bool {
	if ctx.Err() != nil {
		return false
	}
	var pgErr *pgconn.PgError
	return !errors.As(err, &pgErr) && !pgconn.SafeToRetry(err)
}
