package leases

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/internal/base"
	"github.com/pgcoord/pgcoord/internal/dbarg"
	"github.com/pgcoord/pgcoord/internal/dbsqlc"
	"github.com/pgcoord/pgcoord/internal/listen"
	"github.com/pgcoord/pgcoord/internal/tracing"
)

// check makes this package's argument errors ("leases: cause").
var check = base.Check("leases")

// Acquire waits until it is granted the lease name for ttl, or ctx ends (then it returns
// ctx's error). It holds no connection while it waits: each attempt borrows one from pool
// for one statement, and the wake-ups come from the pool's one shared LISTEN connection
// (which it takes from the pool the first time anything waits, and closes a while after
// the last waiter left), so however many callers wait, the pool keeps its connections
// for the work that must not wait — a holder's renewals above all. A Release wakes it
// within milliseconds. A holder that dies without releasing is replaced as soon as its
// grant expires, by the database clock; between those, Acquire tries again at least every
// PollInterval (jittered), which is also how it works when notifications cannot arrive
// (NoListen, or a transaction-mode pooler).
//
// If an attempt's reply is lost after the grant committed (a connection cut), Acquire asks
// again at once as the same holder and gets its own grant back.
func Acquire(ctx context.Context, pool *pgxpool.Pool, name string, ttl time.Duration, opts *AcquireOpts) (_ Lease, err error) {
	if err := validate(name, ttl); err != nil {
		return Lease{}, err
	}
	if pool == nil {
		return Lease{}, check.Invalid("nil pool")
	}
	o, err := opts.withDefaults(ttl)
	if err != nil {
		return Lease{}, err
	}
	var span tracing.Span
	attempts := int64(0)
	if o.Tracer != nil {
		ctx, span = tracing.Start(ctx, o.Tracer, tracing.LeaseAcquire,
			tracing.Str(tracing.AttrLease, name), tracing.Str(tracing.AttrHolder, o.Holder))
		defer func() {
			span.Set(tracing.Int(tracing.AttrAttempts, attempts))
			span.End(err)
		}()
	}
	// The waiter exists before the first attempt, so a release between a failed attempt
	// and the wait is not missed.
	w, err := newWaiter(ctx, pool, name, o.NoListen)
	if err != nil {
		if ctx.Err() != nil {
			return Lease{}, fmt.Errorf("leases: acquire %q: %w", name, ctx.Err())
		}
		return Lease{}, fmt.Errorf("leases: acquire %q: %w", name, base.TranslateError(err))
	}
	defer w.Close()
	meta := encodeMetadata(o.Metadata)
	retried := false
	for {
		attempts++
		start := time.Now()
		row, err := queries.WaitLease(ctx, pool, dbsqlc.WaitLeaseParams{
			Name: name, Holder: o.Holder, Ttl: dbarg.Interval(ttl), Want: dbarg.Interval(2 * o.PollInterval),
			Metadata: meta.json, SyncCommit: o.SyncCommit,
		})
		var wait time.Duration
		switch {
		case err == nil && row.Holder != nil && *row.Holder == o.Holder:
			if span.On() {
				span.Set(tracing.Int(tracing.AttrToken, row.FenceToken))
			}
			return leaseFrom(dbsqlc.AcquireLeaseRow(row), meta.values, start, o.SafetyMargin), nil
		case err == nil && row.ExpiresAt != nil:
			// Held by someone else: try again when the grant expires, on a notification,
			// or after the poll interval, whichever comes first.
			wait = min(listen.Jitter(o.PollInterval), row.ExpiresAt.Sub(row.DbNow)+time.Millisecond)
			if span.On() && row.Holder != nil {
				span.Event(tracing.EventWait, tracing.Str(tracing.AttrHeldBy, *row.Holder))
			}
		case err == nil || errors.Is(err, pgx.ErrNoRows):
			wait = 0 // the lease changed hands under us: try again at once
		case ctx.Err() != nil:
			return Lease{}, fmt.Errorf("leases: acquire %q: %w", name, ctx.Err())
		case !retried && listen.Ambiguous(ctx, err):
			retried = true
			continue // the grant may have committed: ask again as the same holder
		default:
			return Lease{}, fmt.Errorf("leases: acquire %q: %w", name, base.TranslateError(err))
		}
		retried = false
		if err := w.Wait(ctx, wait); err != nil {
			return Lease{}, fmt.Errorf("leases: acquire %q: %w", name, err)
		}
	}
}

// newWaiter returns a waiter on pool for the release of the lease name (notifications on
// the leases channel carry the tag of the lease's name, listen.Tag), or a sleep-only one with noListen.
func newWaiter(ctx context.Context, pool *pgxpool.Pool, name string, noListen bool) (*listen.Waiter, error) {
	if noListen || listen.Pooled(pool) {
		return listen.New(ctx, pool, "", "")
	}
	ch, err := queries.LeaseChannel(ctx, pool)
	if err != nil {
		return nil, err
	}
	return listen.New(ctx, pool, ch, listen.Tag(name))
}
