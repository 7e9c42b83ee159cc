package leases

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/internal/tracing"
)

// Metrics counts what keep-alive loops (Do, Elector) saw. Its zero value is ready to use:
// create one with &Metrics{}, pass it to the loops it should count (DoOpts.Metrics,
// ElectorConfig.Metrics: a loop without one is not counted), and read the fields with Load
// or export them with package metrics (metrics.Opts.Leases).
type Metrics struct {
	// Renewals counts successful renewals.
	Renewals atomic.Int64
	// RenewErrors counts renewals that failed for a reason other than the lease being
	// lost (a connection error, a timeout); the loop retries until the trust deadline.
	RenewErrors atomic.Int64
	// NearMisses counts renewals that succeeded with less than a quarter of the TTL left
	// before the holder would have stopped trusting the lease: a sign that TTLs are too
	// short for this database or that the process stalls.
	NearMisses atomic.Int64
	// Lost counts leases lost while their function ran: taken over, expired by an operator,
	// or past the trust deadline without a successful renewal.
	Lost atomic.Int64
}

// DoOpts are the options of Do. A nil *DoOpts means the defaults.
type DoOpts struct {
	// AcquireOpts are used to acquire the lease, as by Acquire.
	AcquireOpts
	// RenewEvery is the interval between renewals. Default: a third of the TTL.
	RenewEvery time.Duration
	// Logger receives warnings about failed renewals, near misses and lost leases.
	// Default slog.Default().
	Logger *slog.Logger
	// Metrics, if set, receives the counts (see Metrics). Default nil: not counted.
	Metrics *Metrics
}

// Do acquires the lease name (waiting like Acquire), runs fn while holding it and releases
// it when fn returns. In the background it renews the lease every RenewEvery, with an
// asynchronous commit (losing a renewal only shortens the lease). fn's context is
// cancelled, with a cause wrapping ErrLost, as soon as the lease is lost — a renewal finds
// it taken over or expired by an operator — or its trust deadline passes without a
// successful renewal, whichever comes first. fn should pass lease.Token with every write
// it makes (see package fenced): a cancelled context stops fn only at its next check.
//
// Do returns:
//   - if the lease was lost before fn returned, or found no longer held when Do released
//     it: an error wrapping ErrLost — and also wrapping fn's error if fn failed with
//     anything but the cancellation Do itself caused. So a lost lease is always
//     errors.Is(err, ErrLost), and that error is errors.Is(err, context.Canceled) only
//     when ctx, the caller's own context, was cancelled: a caller can tell a lost lease
//     from its own cancellation;
//   - otherwise fn's error, if fn failed;
//   - otherwise the error of acquiring or releasing, or nil.
func Do(ctx context.Context, pool *pgxpool.Pool, name string, ttl time.Duration, fn func(ctx context.Context, lease Lease) error, opts *DoOpts) (err error) {
	d, err := startDo(ctx, pool, name, ttl, fn, opts)
	if err != nil {
		return err
	}
	defer d.endSpan(&err)
	// Only this frame, small, and the acquisition's loop stay on the stack while Do waits
	// for the lease (see acquisition.run).
	if err := d.a.run(); err != nil {
		return err
	}
	return d.hold()
}

// doCall is the state of one Do call.
type doCall struct {
	ctx  context.Context // the caller's, or the span's
	pool *pgxpool.Pool
	ttl  time.Duration
	fn   func(ctx context.Context, lease Lease) error
	o    DoOpts
	span tracing.Span
	a    *acquisition
}

// startDo checks Do's arguments, starts its span and the acquisition of its lease.
func startDo(ctx context.Context, pool *pgxpool.Pool, name string, ttl time.Duration, fn func(ctx context.Context, lease Lease) error, opts *DoOpts) (*doCall, error) {
	d := &doCall{ctx: ctx, pool: pool, ttl: ttl, fn: fn}
	if opts != nil {
		d.o = *opts
	}
	o := &d.o
	if fn == nil {
		return nil, check.Invalid("nil function")
	}
	if err := validate(name, ttl); err != nil {
		return nil, err
	}
	if o.RenewEvery == 0 {
		o.RenewEvery = ttl / 3
	}
	if o.RenewEvery <= 0 || o.RenewEvery >= ttl {
		return nil, check.Invalid("renew interval %v must be between 0 and the TTL %v", o.RenewEvery, ttl)
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Metrics == nil {
		o.Metrics = &Metrics{} // counts nobody reads
	}
	if o.Tracer != nil {
		d.ctx, d.span = tracing.Start(ctx, o.Tracer, tracing.LeaseDo, tracing.Str(tracing.AttrLease, name))
	}
	a, err := startAcquire(d.ctx, pool, name, ttl, &o.AcquireOpts)
	if err != nil {
		d.span.End(err)
		return nil, err
	}
	d.a = a
	return d, nil
}

// endSpan ends Do's span, if traced, with the call's error *err.
func (d *doCall) endSpan(err *error) { d.span.End(*err) }

// hold runs Do's fn while it holds the acquisition's grant, and releases it.
func (d *doCall) hold() error {
	ctx, pool, ttl, fn, o, span := d.ctx, d.pool, d.ttl, d.fn, &d.o, d.span
	lease, name := *d.a.lease, d.a.name
	if span.On() {
		span.Set(tracing.Str(tracing.AttrHolder, lease.Holder), tracing.Int(tracing.AttrToken, lease.Token))
	}

	fnCtx, cancel := context.WithCancelCause(ctx)
	k := keeper{pool: pool, ttl: ttl, opts: o, cancel: cancel, stop: make(chan struct{}), done: make(chan Lease),
		spanCtx: context.Background()}
	if span.On() {
		k.span, k.spanCtx = span, context.WithoutCancel(ctx)
	}
	go k.run(lease)
	fnErr := fn(fnCtx, lease)
	close(k.stop)
	current := <-k.done
	lost := context.Cause(fnCtx)
	cancel(nil)

	relCtx, relCancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer relCancel()
	relErr := Release(relCtx, pool, current, nil)
	switch {
	case errors.Is(lost, ErrLost):
	case errors.Is(relErr, ErrLost):
		o.Metrics.Lost.Add(1)
		lost = fmt.Errorf("%w: %q was no longer held when fn returned", ErrLost, name)
		k.traceLoss(current, lost)
	case fnErr != nil:
		return fnErr
	default:
		return relErr
	}
	switch {
	case fnErr == nil:
		return lost
	case ctx.Err() == nil && errors.Is(fnErr, context.Canceled):
		// fn stopped because Do cancelled its context for the loss: the caller did not
		// cancel anything, so the error must not say it did.
		return fmt.Errorf("%w (fn returned: %v)", lost, fnErr)
	default:
		return fmt.Errorf("%w (fn returned: %w)", lost, fnErr)
	}
}

// keeper renews one lease until stopped, and cancels the function's context when the
// lease is lost or its trust deadline passes.
type keeper struct {
	pool   *pgxpool.Pool
	ttl    time.Duration
	opts   *DoOpts
	cancel context.CancelCauseFunc
	stop   chan struct{}
	done   chan Lease // receives the last grant when run returns
	// span is Do's span, and spanCtx a context carrying it (without cancellation) for the
	// renewals' spans: zero without a Tracer.
	span    tracing.Span
	spanCtx context.Context
}

func (k *keeper) run(l Lease) {
	defer func() { k.done <- l }()
	log := k.opts.Logger.With("lease", l.Name, "token", l.Token)
	renew := time.NewTimer(k.opts.RenewEvery)
	defer renew.Stop()
	trust := time.NewTimer(time.Until(l.TrustUntil))
	defer trust.Stop()
	for {
		select {
		case <-k.stop:
			return
		case <-trust.C:
			k.lose(log, l, fmt.Errorf("%w: %q: trust deadline passed without a successful renewal", ErrLost, l.Name))
			return
		case <-renew.C:
		}
		rctx, cancel := context.WithDeadline(k.spanCtx, l.TrustUntil)
		next, err := Renew(rctx, k.pool, l, k.ttl, &RenewOpts{AsyncCommit: true, SafetyMargin: k.opts.SafetyMargin, Tracer: k.opts.Tracer})
		cancel()
		switch {
		case errors.Is(err, ErrLost):
			k.lose(log, l, err)
			return
		case err != nil:
			k.opts.Metrics.RenewErrors.Add(1)
			log.Warn("pgcoord: lease renewal failed; retrying until the trust deadline", "err", err, "trust_left", time.Until(l.TrustUntil))
			renew.Reset(min(k.opts.RenewEvery, max(time.Until(l.TrustUntil)/4, time.Millisecond)))
			continue
		}
		k.opts.Metrics.Renewals.Add(1)
		if left := time.Until(l.TrustUntil); left < k.ttl/4 {
			k.opts.Metrics.NearMisses.Add(1)
			log.Warn("pgcoord: lease renewed with little time left (near miss)", "trust_left", left, "ttl", k.ttl)
		}
		l = next
		trust.Reset(time.Until(l.TrustUntil))
		renew.Reset(k.opts.RenewEvery)
	}
}

func (k *keeper) lose(log *slog.Logger, l Lease, cause error) {
	k.opts.Metrics.Lost.Add(1)
	k.traceLoss(l, cause)
	log.Warn("pgcoord: lease lost; cancelling its function", "err", cause)
	k.cancel(cause)
}

// traceLoss records the loss of the grant l on Do's span, if traced.
func (k *keeper) traceLoss(l Lease, cause error) {
	if k.span.On() {
		k.span.Event(tracing.EventLeaseLost, tracing.Int(tracing.AttrToken, l.Token), tracing.Str(tracing.AttrCause, cause.Error()))
	}
}
