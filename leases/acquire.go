package leases

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/internal/dbarg"
	"github.com/pgcoord/pgcoord/internal/dbsqlc"
	"github.com/pgcoord/pgcoord/internal/listen"
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
	w, err := newWaiter(ctx, conn, o.NoListen)
	if err != nil {
		conn.Release()
		return Lease{}, fmt.Errorf("leases: acquire %q: %w", name, pgcoord.TranslateError(err))
	}
	defer w.Close()
	for {
		start := time.Now()
		row, err := queries.WaitLease(ctx, conn, dbsqlc.WaitLeaseParams{
			Name: name, Holder: o.Holder, Ttl: dbarg.Interval(ttl), Want: dbarg.Interval(2 * o.PollInterval),
			Metadata: meta.json, Now: dbarg.Now(o.Now), SyncCommit: o.SyncCommit,
		})
		var wait time.Duration
		switch {
		case err == nil && row.Holder != nil && *row.Holder == o.Holder:
			return leaseFrom(dbsqlc.AcquireLeaseRow(row), meta.values, start, o.SafetyMargin), nil
		case err == nil && row.ExpiresAt != nil:
			// Held by someone else: try again when the grant expires, on a notification,
			// or after the poll interval, whichever comes first.
			wait = min(listen.Jitter(o.PollInterval), row.ExpiresAt.Sub(row.DbNow)+time.Millisecond)
		case errors.Is(err, pgx.ErrNoRows):
			wait = 0 // the lease flipped twice under us: try again at once
		case ctx.Err() != nil:
			return Lease{}, fmt.Errorf("leases: acquire %q: %w", name, ctx.Err())
		default:
			return Lease{}, fmt.Errorf("leases: acquire %q: %w", name, pgcoord.TranslateError(err))
		}
		if err := w.Wait(ctx, name, wait); err != nil {
			return Lease{}, fmt.Errorf("leases: acquire %q: %w", name, err)
		}
	}
}

// newWaiter returns a waiter on conn listening on the leases channel, unless noListen.
func newWaiter(ctx context.Context, conn *pgxpool.Conn, noListen bool) (*listen.Waiter, error) {
	if noListen {
		return listen.New(ctx, conn, "")
	}
	ch, err := queries.LeaseChannel(ctx, conn)
	if err != nil {
		return nil, err
	}
	return listen.New(ctx, conn, ch)
}
