package leases

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/internal/dbsqlc"
	"github.com/pgcoord/pgcoord/pgcoord"
)

// Acquire waits until it is granted the lease name for ttl, or ctx ends (then it returns
// ctx's error). While it waits it holds one connection of pool, on which it LISTENs: a
// Release wakes it within milliseconds. A holder that dies without releasing is replaced
// as soon as its grant expires, by the database clock; between those, Acquire tries again
// at least every PollInterval (jittered), which is also how it works when notifications
// cannot arrive (NoListen, or a transaction-mode pooler).
func Acquire(ctx context.Context, pool *pgxpool.Pool, name string, ttl time.Duration, opts *AcquireOpts) (Lease, error) {
	if err := validate(name, ttl); err != nil {
		return Lease{}, err
	}
	if pool == nil {
		return Lease{}, fmt.Errorf("%w: leases: nil pool", pgcoord.ErrInvalidArgument)
	}
	o, err := opts.withDefaults(ttl)
	if err != nil {
		return Lease{}, err
	}
	meta := encodeMetadata(o.Metadata)
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return Lease{}, fmt.Errorf("leases: acquire %q: %w", name, err)
	}
	w := waiter{conn: conn, listen: !o.NoListen}
	defer w.close()
	if w.listen {
		if err := w.startListening(ctx); err != nil {
			return Lease{}, fmt.Errorf("leases: acquire %q: %w", name, err)
		}
	}
	for {
		start := time.Now()
		row, err := queries.WaitLease(ctx, conn, dbsqlc.WaitLeaseParams{
			Name: name, Holder: o.Holder, Ttl: interval(ttl), Want: interval(2 * o.PollInterval),
			Metadata: meta.json, Now: nowArg(o.Now),
		})
		var wait time.Duration
		switch {
		case err == nil && row.Holder != nil && *row.Holder == o.Holder:
			return leaseFrom(dbsqlc.AcquireLeaseRow(row), meta.values, start, o.SafetyMargin), nil
		case err == nil && row.ExpiresAt != nil:
			// Held by someone else: try again when the grant expires, on a notification,
			// or after the poll interval, whichever comes first.
			wait = min(jitter(o.PollInterval), row.ExpiresAt.Sub(row.DbNow)+time.Millisecond)
		case errors.Is(err, pgx.ErrNoRows):
			wait = 0 // the lease flipped twice under us: try again at once
		case ctx.Err() != nil:
			return Lease{}, fmt.Errorf("leases: acquire %q: %w", name, ctx.Err())
		default:
			return Lease{}, fmt.Errorf("leases: acquire %q: %w", name, err)
		}
		if err := w.wait(ctx, name, wait); err != nil {
			return Lease{}, fmt.Errorf("leases: acquire %q: %w", name, err)
		}
	}
}

// waiter owns the connection a waiting Acquire listens on.
type waiter struct {
	conn    *pgxpool.Conn
	listen  bool
	channel string
}

func (w *waiter) startListening(ctx context.Context) error {
	ch, err := queries.LeaseChannel(ctx, w.conn)
	if err != nil {
		return err
	}
	if _, err := w.conn.Exec(ctx, "LISTEN "+pgx.Identifier{ch}.Sanitize()); err != nil {
		return err
	}
	w.channel = ch
	return nil
}

// wait returns after d, when a notification for name arrives, or when ctx ends.
func (w *waiter) wait(ctx context.Context, name string, d time.Duration) error {
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
		case err == nil && n.Payload == name:
			return nil
		case err == nil:
			continue // another lease's release
		case ctx.Err() != nil:
			return ctx.Err()
		case wctx.Err() != nil:
			return nil // timed out: pgx leaves the connection usable after a read deadline
		default:
			return err
		}
	}
}

// close returns the connection to the pool, no longer listening, or destroys it if it
// cannot be cleaned.
func (w *waiter) close() {
	if w.channel != "" && !w.conn.Conn().IsClosed() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if _, err := w.conn.Exec(ctx, "UNLISTEN "+pgx.Identifier{w.channel}.Sanitize()); err == nil {
			w.conn.Release()
			return
		}
	}
	if w.channel != "" {
		c := w.conn.Hijack()
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = c.Close(ctx)
		return
	}
	w.conn.Release()
}

// jitter spreads d by ±20% so waiters do not retry in lockstep.
func jitter(d time.Duration) time.Duration {
	return time.Duration(float64(d) * (0.8 + 0.4*rand.Float64()))
}
