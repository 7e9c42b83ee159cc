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
func Acquire(ctx context.Context, pool *pgxpool.Pool, name string, ttl time.Duration, opts *AcquireOpts) (Lease, error) {
	a, err := startAcquire(ctx, pool, name, ttl, opts)
	if err != nil {
		return Lease{}, err
	}
	if err := a.run(); err != nil {
		return Lease{}, err
	}
	return *a.lease, nil
}

// acquisition is the state of one Acquire call across its attempts: on the heap, where it
// costs a waiter less than the stack it would keep from shrinking.
type acquisition struct {
	ctx          context.Context // the caller's, or the span's
	pool         *pgxpool.Pool
	name, holder string
	syncCommit   string
	ttl          time.Duration
	poll, margin time.Duration // AcquireOpts.PollInterval and SafetyMargin
	meta         metadata
	w            *listen.Waiter
	span         tracing.Span
	attempts     int64
	retried      bool   // the last attempt's error was ambiguous, and this one asks again
	lease        *Lease // the grant, once granted
	err          error
}

// run waits for the grant (a.lease) or the call's end (a.err, which it returns).
//
// Only run's loop, its callers and the Wait it parks in stay on the stack while it waits:
// the statement, tracing and errors run in calls that have returned by then. A waiter's
// goroutine grows its stack for the statement (pgx goes deep); once it parks with little of
// it in use, the garbage collector halves it (issue 32: 10,000 waiters).
func (a *acquisition) run() error {
	defer a.end()
	for {
		wait, done := a.attempt()
		if done {
			return a.err
		}
		if err := a.w.Wait(a.ctx, wait); err != nil {
			a.fail(err)
			return a.err
		}
	}
}

// startAcquire checks Acquire's arguments, starts its span and creates its waiter.
func startAcquire(ctx context.Context, pool *pgxpool.Pool, name string, ttl time.Duration, opts *AcquireOpts) (*acquisition, error) {
	if err := validate(name, ttl); err != nil {
		return nil, err
	}
	if pool == nil {
		return nil, check.Invalid("nil pool")
	}
	o, err := opts.withDefaults(ttl)
	if err != nil {
		return nil, err
	}
	a := &acquisition{ctx: ctx, pool: pool, name: name, holder: o.Holder, syncCommit: o.SyncCommit, ttl: ttl,
		poll: o.PollInterval, margin: o.SafetyMargin}
	if o.Tracer != nil {
		a.ctx, a.span = tracing.Start(ctx, o.Tracer, tracing.LeaseAcquire,
			tracing.Str(tracing.AttrLease, name), tracing.Str(tracing.AttrHolder, o.Holder))
	}
	// The waiter exists before the first attempt, so a release between a failed attempt
	// and the wait is not missed.
	if a.w, err = newWaiter(a.ctx, pool, name, o.NoListen); err != nil {
		if a.ctx.Err() != nil {
			err = a.ctx.Err()
		} else {
			err = base.TranslateError(err)
		}
		a.err = fmt.Errorf("leases: acquire %q: %w", name, err)
		a.endSpan()
		return nil, a.err
	}
	a.meta = encodeMetadata(o.Metadata)
	return a, nil
}

// attempt asks for the lease once. It returns done when the call is over (granted, or
// failed: a.lease or a.err says which), else how long to wait before the next attempt.
func (a *acquisition) attempt() (wait time.Duration, done bool) {
	a.attempts++
	start := time.Now()
	row, err := queries.WaitLease(a.ctx, a.pool, dbsqlc.WaitLeaseParams{
		Name: a.name, Holder: a.holder, Ttl: dbarg.Interval(a.ttl), Want: dbarg.Interval(2 * a.poll),
		Metadata: a.meta.json, SyncCommit: a.syncCommit,
	})
	switch {
	case err == nil && row.Holder != nil && *row.Holder == a.holder:
		if a.span.On() {
			a.span.Set(tracing.Int(tracing.AttrToken, row.FenceToken))
		}
		l := leaseFrom(dbsqlc.AcquireLeaseRow(row), a.meta.values, start, a.margin)
		a.lease = &l
		return 0, true
	case err == nil && row.ExpiresAt != nil:
		// Held by someone else: try again when the grant expires, on a notification,
		// or after the poll interval, whichever comes first.
		wait = min(listen.Jitter(a.poll), row.ExpiresAt.Sub(row.DbNow)+time.Millisecond)
		if a.span.On() && row.Holder != nil {
			a.span.Event(tracing.EventWait, tracing.Str(tracing.AttrHeldBy, *row.Holder))
		}
	case err == nil || errors.Is(err, pgx.ErrNoRows):
		wait = 0 // the lease changed hands under us: try again at once
	case a.ctx.Err() != nil:
		a.fail(a.ctx.Err())
		return 0, true
	case !a.retried && listen.Ambiguous(a.ctx, err):
		a.retried = true
		return 0, false // the grant may have committed: ask again as the same holder
	default:
		a.fail(base.TranslateError(err))
		return 0, true
	}
	a.retried = false
	return wait, false
}

// fail ends the call with err.
func (a *acquisition) fail(err error) {
	a.err = fmt.Errorf("leases: acquire %q: %w", a.name, err)
}

// end closes the waiter and the span (with a.err as the call's outcome).
func (a *acquisition) end() {
	a.w.Close()
	a.endSpan()
}

func (a *acquisition) endSpan() {
	if a.span.On() {
		a.span.Set(tracing.Int(tracing.AttrAttempts, a.attempts))
		a.span.End(a.err)
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
