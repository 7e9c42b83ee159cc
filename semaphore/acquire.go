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
func Acquire(ctx context.Context, pool *pgxpool.Pool, key string, limit int, ttl time.Duration, opts *AcquireOpts) (Permit, error) {
	a, err := startAcquire(ctx, pool, key, limit, ttl, opts)
	if err != nil {
		return Permit{}, err
	}
	if err := a.run(); err != nil {
		return Permit{}, err
	}
	return a.permit, nil
}

// lineSlack is how much longer than two poll intervals a waiter's place in line lasts.
const lineSlack = time.Second

// acquisition is the state of one Acquire call across its attempts: on the heap, where it
// costs a waiter less than the stack it would keep from shrinking.
type acquisition struct {
	ctx       context.Context // the caller's, or the span's
	pool      *pgxpool.Pool
	key       string
	limit     int
	ttl       time.Duration
	o         AcquireOpts
	generated bool // o.Holder is this call's own
	span      tracing.Span
	start     time.Time
	attempts  int64
	tried     bool // an attempt was sent: there may be a place in line or a permit to clean up
	permit    Permit
	err       error // what ended the wait; once the call is over, its error
}

// startAcquire checks Acquire's arguments and options and starts its span.
func startAcquire(ctx context.Context, pool *pgxpool.Pool, key string, limit int, ttl time.Duration, opts *AcquireOpts) (*acquisition, error) {
	if err := validateAcquire(key, limit, ttl); err != nil {
		return nil, err
	}
	if pool == nil {
		return nil, check.Invalid("nil pool")
	}
	a := &acquisition{ctx: ctx, pool: pool, key: key, limit: limit, ttl: ttl, generated: opts == nil || opts.Holder == ""}
	var err error
	if a.o, err = opts.withDefaults(ttl); err != nil {
		return nil, err
	}
	if a.o.Tracer != nil {
		a.ctx, a.span = tracing.Start(ctx, a.o.Tracer, tracing.SemAcquire, keyAttrs(key, limit, a.o.Holder)...)
	}
	a.start = time.Now()
	return a, nil
}

// run waits in line for the permit (a.permit) or the call's end (a.err, which it returns),
// and ends the span on every return.
//
// Only run, its caller and the waiting loop's small frame stay on the stack while Acquire
// waits: the statements, tracing, metrics and errors run in calls that have returned by
// then. A waiter's goroutine grows its stack for the statements (pgx goes deep); once it
// parks with little of it in use, the garbage collector halves it.
func (a *acquisition) run() error {
	defer a.endSpan()
	a.wait()
	a.finish()
	return a.err
}

// wait is Acquire's waiting loop. It returns with the permit, or with the error that ended
// the wait in a.err; the waiter is closed by then.
func (a *acquisition) wait() {
	// The waiter exists before the first attempt, so a release between a refusal and the
	// wait is not missed.
	w, err := newWaiter(a.ctx, a.pool, a.key, a.o.NoListen)
	if err != nil {
		a.err = err
		return
	}
	defer w.Close()
	for {
		d, done := a.attempt()
		if done {
			return
		}
		if err := w.Wait(a.ctx, d); err != nil {
			a.err = err
			return
		}
	}
}

// attempt asks for a permit once, keeping the place in line. It returns done when the wait
// is over (admitted, or failed: a.err says which), else how long to wait before the next
// attempt.
func (a *acquisition) attempt() (d time.Duration, done bool) {
	a.tried = true
	a.attempts++
	sent := time.Now()
	// How long each attempt keeps the place in line: until two polls later, and a second
	// more for the round trips of a loaded server or pooler, so that a live waiter never
	// lapses between its own polls.
	r := admit(a.ctx, acquireCall{db: a.pool, key: a.key, holder: a.o.Holder, generated: a.generated, limit: int32(a.limit),
		ttl: dbarg.Interval(a.ttl), wait: dbarg.Interval(2*a.o.PollInterval + lineSlack), syncCommit: a.o.SyncCommit})
	if r.OK {
		a.permit = permitFrom(r.Row, sent, a.o.SafetyMargin)
		return 0, true
	}
	if r.Err != nil {
		a.err = r.Err
		return 0, true
	}
	a.o.Metrics.refused(a.key)
	if a.span.On() {
		a.span.Event(tracing.EventWait)
	}
	// In line. Try again on a notification, when the first live permit expires or
	// another waiter's place in line lapses (neither sends a notification), or after
	// the poll interval, whichever comes first — at once if nothing live is left in the
	// way: what refused the attempt expired, lapsed or left since.
	d = listen.Jitter(a.o.PollInterval)
	next, err := queries.SemaphoreNextExpiry(a.ctx, a.pool, dbsqlc.SemaphoreNextExpiryParams{Key: a.key, Holder: a.o.Holder})
	if err != nil {
		a.err = err
		return 0, true
	}
	return min(d, max(next.NextExpiry.Sub(next.DbNow)+time.Millisecond, 0)), false
}

// finish settles the call once the wait is over: it counts an admission; after an attempt
// whose outcome is unknown, it asks once more as the same holder; otherwise it takes the
// waiter out of the line and makes a.err the call's error.
func (a *acquisition) finish() {
	switch {
	case a.err == nil:
		a.admitted()
		return
	case a.tried && listen.Ambiguous(a.ctx, a.err):
		// The last attempt may have been granted: ask once more as the same holder.
		if a.askAgain() {
			return
		}
	}
	if a.tried {
		giveUp(a.ctx, a.pool, a.key, a.o.Holder, a.generated)
	}
	a.err = fmt.Errorf("semaphore: acquire %q: %w", a.key, base.TranslateError(a.err))
}

// askAgain asks for the permit once more, without a place in line, after an attempt whose
// outcome is unknown; it reports whether it was admitted (the permit, a.permit, may be
// the one that attempt was granted).
func (a *acquisition) askAgain() bool {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(a.ctx), 5*time.Second)
	defer cancel()
	sent := time.Now()
	r := admit(rctx, acquireCall{db: a.pool, key: a.key, holder: a.o.Holder, generated: a.generated, limit: int32(a.limit),
		ttl: dbarg.Interval(a.ttl), syncCommit: a.o.SyncCommit})
	if !r.OK {
		return false
	}
	a.permit = permitFrom(r.Row, sent, a.o.SafetyMargin)
	a.admitted()
	a.err = nil
	return true
}

// admitted counts the admission of a.permit and records its token on the span.
func (a *acquisition) admitted() {
	a.o.Metrics.admitted(a.key, time.Since(a.start))
	if a.span.On() {
		a.span.Set(tracing.Int(tracing.AttrToken, a.permit.Token))
	}
}

// endSpan ends the span, if traced, with a.err as the call's outcome.
func (a *acquisition) endSpan() {
	if a.span.On() {
		a.span.Set(tracing.Int(tracing.AttrAttempts, a.attempts))
		a.span.End(a.err)
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
