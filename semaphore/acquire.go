package semaphore

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/internal/base"
	"github.com/pgcoord/pgcoord/internal/dbarg"
	"github.com/pgcoord/pgcoord/internal/dbsqlc"
	"github.com/pgcoord/pgcoord/internal/listen"
	"github.com/pgcoord/pgcoord/internal/tracing"
)

// check makes this package's argument errors ("semaphore: cause").
var check = base.Check("semaphore")

// Acquire waits in line until it is granted a permit of key for ttl, or ctx ends (then it
// returns ctx's error, having left the line). Waiters of a key are served first come, first
// served, and a TryAcquire or Next never jumps a live waiter. limit is the key's limit if
// this call creates the key, as in TryAcquire.
//
// While it waits it holds no connection of pool: each attempt takes one for its round
// trips and gives it back, and between attempts it waits on the pool's shared notifier
// (one LISTEN connection per pool, taken out of the pool once, for every waiter of the
// process), so waiters never take the connections a holder needs to renew. A Release of
// the key wakes it within milliseconds (a release notifies only while someone waits). A
// holder that dies without releasing is replaced as soon as its permit expires, by the
// database clock: Acquire tries again at the earliest expiry of the key's live permits, and
// when the place in line of a waiter ahead of it lapses (a dead waiter's). Between those it
// tries at least every PollInterval (jittered), which is also how it
// works when notifications cannot arrive (NoListen, or a transaction-mode pooler). Each
// attempt renews its place in line for twice the PollInterval plus a second.
//
// If an attempt fails with the connection, so that its outcome is unknown, Acquire asks
// once more as the same holder: a permit granted by an attempt whose reply was lost is
// returned rather than leaked.
func Acquire(ctx context.Context, pool *pgxpool.Pool, key string, limit int, ttl time.Duration, opts *AcquireOpts) (_ Permit, err error) {
	if err := validateAcquire(key, limit, ttl); err != nil {
		return Permit{}, err
	}
	if pool == nil {
		return Permit{}, check.Invalid("nil pool")
	}
	generated := opts == nil || opts.Holder == ""
	o, err := opts.withDefaults(ttl)
	if err != nil {
		return Permit{}, err
	}
	var span tracing.Span
	var attempts int64
	if o.Tracer != nil {
		ctx, span = tracing.Start(ctx, o.Tracer, tracing.SemAcquire, keyAttrs(key, limit, o.Holder)...)
		defer func() {
			span.Set(tracing.Int(tracing.AttrAttempts, attempts))
			span.End(err)
		}()
	}
	start := time.Now()
	p, tried, err := acquire(ctx, pool, key, limit, ttl, o, generated, span, &attempts)
	switch {
	case err == nil:
		o.Metrics.admitted(key, time.Since(start))
		if span.On() {
			span.Set(tracing.Int(tracing.AttrToken, p.Token))
		}
		return p, nil
	case tried && listen.Ambiguous(ctx, err):
		// The last attempt may have been granted: ask once more as the same holder.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		sent := time.Now()
		r := admit(rctx, acquireCall{db: pool, key: key, holder: o.Holder, generated: generated, limit: int32(limit), ttl: dbarg.Interval(ttl),
			syncCommit: o.SyncCommit})
		if r.OK {
			o.Metrics.admitted(key, time.Since(start))
			p = permitFrom(r.Row, sent, o.SafetyMargin)
			if span.On() {
				span.Set(tracing.Int(tracing.AttrToken, p.Token))
			}
			return p, nil
		}
	}
	if tried {
		giveUp(ctx, pool, key, o.Holder, generated)
	}
	return Permit{}, fmt.Errorf("semaphore: acquire %q: %w", key, base.TranslateError(err))
}

// lineSlack is how much longer than two poll intervals a waiter's place in line lasts.
const lineSlack = time.Second

// acquire is Acquire's waiting loop. tried reports whether an attempt was sent (so there
// may be a place in line or a permit to clean up). It counts its attempts in *attempts
// and records each wait on span.
func acquire(ctx context.Context, pool *pgxpool.Pool, key string, limit int, ttl time.Duration, o AcquireOpts, generated bool, span tracing.Span, attempts *int64) (p Permit, tried bool, err error) {
	// The waiter exists before the first attempt, so a release between a refusal and the
	// wait is not missed.
	w, err := newWaiter(ctx, pool, key, o.NoListen)
	if err != nil {
		return Permit{}, false, err
	}
	defer w.Close()
	// How long each attempt keeps the place in line: until two polls later, and a second
	// more for the round trips of a loaded server or pooler, so that a live waiter never
	// lapses between its own polls.
	want := dbarg.Interval(2*o.PollInterval + lineSlack)
	for {
		tried = true
		*attempts++
		sent := time.Now()
		r := admit(ctx, acquireCall{db: pool, key: key, holder: o.Holder, generated: generated, limit: int32(limit), ttl: dbarg.Interval(ttl),
			wait: want, syncCommit: o.SyncCommit})
		if r.OK {
			return permitFrom(r.Row, sent, o.SafetyMargin), true, nil
		}
		if r.Err != nil {
			return Permit{}, true, r.Err
		}
		o.Metrics.refused(key)
		if span.On() {
			span.Event(tracing.EventWait)
		}
		// In line. Try again on a notification, when the first live permit expires or
		// another waiter's place in line lapses (neither sends a notification), or after
		// the poll interval, whichever comes first — at once if nothing live is left in the
		// way: what refused the attempt expired, lapsed or left since.
		wait := listen.Jitter(o.PollInterval)
		next, err := queries.SemaphoreNextExpiry(ctx, pool, dbsqlc.SemaphoreNextExpiryParams{Key: key, Holder: o.Holder})
		if err != nil {
			return Permit{}, true, err
		}
		wait = min(wait, max(next.NextExpiry.Sub(next.DbNow)+time.Millisecond, 0))
		if err := w.Wait(ctx, wait); err != nil {
			return Permit{}, true, err
		}
	}
}

// newWaiter returns a waiter for notifications of key (its tag, listen.Tag) on the semaphore channel, from the
// pool's shared notifier; with noListen, one that only sleeps.
func newWaiter(ctx context.Context, pool *pgxpool.Pool, key string, noListen bool) (*listen.Waiter, error) {
	if noListen || listen.Pooled(pool) {
		return listen.New(ctx, pool, "", "")
	}
	channel, err := queries.SemaphoreChannel(ctx, pool)
	if err != nil {
		return nil, err
	}
	return listen.New(ctx, pool, channel, listen.Tag(key))
}

// giveUp takes a waiter that stops waiting out of the line, so it does not hold its place
// until its registration lapses, and wakes the next waiter if a permit is free. If the
// holder identity was made for this call, it also frees a permit that an attempt whose
// outcome was never learned may have been granted. Best effort: a failure only leaves
// what the database forgets by itself (the registration lapses, the permit expires).
func giveUp(ctx context.Context, pool *pgxpool.Pool, key, holder string, generated bool) {
	gctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if generated {
		_, _ = queries.SemaphoreReleaseHolder(gctx, pool, dbsqlc.SemaphoreReleaseHolderParams{Key: key, Holder: holder})
	}
	_ = queries.SemaphoreLeaveLine(gctx, pool, dbsqlc.SemaphoreLeaveLineParams{Key: key, Holder: holder})
}
