package singleton

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/internal/tracing"
	"github.com/pgcoord/pgcoord/pgcoord"
)

// RunTickOpts are the options of RunTick. A nil *RunTickOpts means the defaults.
type RunTickOpts struct {
	// Holder identifies the runner in the ledger. Default: a new identity per call,
	// "host/pid/random".
	Holder string
	// Logger receives warnings about failed heartbeats and lost runs. Default
	// slog.Default().
	Logger *slog.Logger
	// Tracer, if set, traces the claim and the run (see pgcoord.Tracer). Default nil: not
	// traced.
	Tracer pgcoord.Tracer
}

// RunTick claims the current tick of job (ClaimTick), runs fn while heartbeating the run
// every job.TTL/3 (HeartbeatTick), and records fn's outcome in the ledger (FinishTick).
// It returns (false, nil) when there was no tick to run: the current tick already ran, is
// running elsewhere, or was skipped by the overlap policy.
//
// fn's context is cancelled, with a cause wrapping ErrLost (see context.Cause), when a
// heartbeat finds the run lost — replaced by a newer run (OverlapReplace) or taken over
// after the runner stalled past its lease — or when no heartbeat succeeded before the
// lease would expire by the runner's own clock (less a tenth of the TTL). A cancelled
// context stops fn only at its next look: fence fn's writes with run.Token, or make them
// idempotent.
//
// When fn returns, RunTick records success (fn returned nil) or failure (fn's error
// text), even if ctx has ended, and returns (true, fn's error). If fn succeeded but the
// outcome could not be recorded, it returns (true, an error): wrapping ErrLost when the
// run was no longer current. If fn panics, the failure is recorded and the panic goes on.
//
// It returns an error wrapping pgcoord.ErrInvalidName or pgcoord.ErrInvalidArgument,
// before any SQL runs, for an invalid job, a nil pool or fn, or a bad holder.
func RunTick(ctx context.Context, pool *pgxpool.Pool, job Job, fn func(ctx context.Context, run Run) error, opts *RunTickOpts) (ran bool, err error) {
	j, err := job.normalize()
	if err != nil {
		return false, err
	}
	if err := validateFn(j.Name, pool, fn == nil); err != nil {
		return false, err
	}
	var o RunTickOpts
	if opts != nil {
		o = *opts
	}
	holder, err := holderOrNew(o.Holder)
	if err != nil {
		return false, err
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return runTick(ctx, pool, j, fn, holder, o.Logger, o.Tracer)
}

// runTick is RunTick for a normalized job.
func runTick(ctx context.Context, pool *pgxpool.Pool, j Job, fn func(context.Context, Run) error, holder string, log *slog.Logger, tracer pgcoord.Tracer) (ran bool, err error) {
	start := time.Now()
	run, dbNow, err := claimTraced(ctx, pool, j, holder, tracer)
	if errors.Is(err, ErrNoTick) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return true, execute(ctx, pool, run, start, dbNow, j.TTL, fn, log, tracer)
}

// RunClaimed runs fn for a run claimed by other means than ClaimTick — package schedules
// claims the ticks of calendar schedules through the SQL API (pgcoord_schedule_claim) —
// and heartbeats and finishes it exactly as RunTick does (see RunTick for fn's context and
// the errors). ttl is the lease each heartbeat asks for (every ttl/3); claimedAt is when,
// by the local clock, the claim was sent, and dbNow the database clock in its answer, so
// that the runner stops trusting the run before its lease expires by the database clock.
func RunClaimed(ctx context.Context, pool *pgxpool.Pool, run Run, claimedAt, dbNow time.Time, ttl time.Duration,
	fn func(ctx context.Context, run Run) error, opts *RunTickOpts) error {
	if err := run.check(); err != nil {
		return err
	}
	if err := validateFn(run.Job, pool, fn == nil); err != nil {
		return err
	}
	if err := checkTTL(ttl); err != nil {
		return err
	}
	var o RunTickOpts
	if opts != nil {
		o = *opts
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return execute(ctx, pool, run, claimedAt, dbNow, ttl, fn, o.Logger, o.Tracer)
}

// execute runs fn for a claimed run, heartbeating it, and records the outcome.
func execute(ctx context.Context, pool *pgxpool.Pool, run Run, start, dbNow time.Time, ttl time.Duration,
	fn func(context.Context, Run) error, log *slog.Logger, tracer pgcoord.Tracer) (err error) {
	log = log.With("job", run.Job, "tick", run.ScheduledFor, "token", run.Token, "attempt", run.Attempt)
	var span tracing.Span
	if tracer != nil {
		ctx, span = tracing.Start(ctx, tracer, tracing.TickRun, runAttrs(run)...)
		defer func() { span.End(err) }()
	}

	fnCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	hb := &heartbeater{
		pool: pool, ttl: ttl, every: ttl / 3, margin: ttl / 10, log: log, cancel: cancel,
		stop: make(chan struct{}), done: make(chan Run, 1), span: span,
	}
	go hb.run(run, start.Add(run.ExpiresAt.Sub(dbNow)))

	returned := false
	defer func() {
		if returned {
			return
		}
		// fn panicked (or called runtime.Goexit): record the failure, then let it go on.
		r := recover()
		current := hb.halt()
		why := "fn did not return (runtime.Goexit)"
		if r != nil {
			why = fmt.Sprintf("panic: %v", r)
		}
		_ = finish(ctx, pool, current, errors.New(why), log)
		if r != nil {
			panic(r)
		}
	}()
	fnErr := fn(fnCtx, run)
	returned = true
	current := hb.halt()
	lost := context.Cause(fnCtx)
	if !errors.Is(lost, ErrLost) {
		lost = nil
	}
	finErr := finish(ctx, pool, current, fnErr, log)
	switch {
	case fnErr != nil && lost != nil:
		return joinLost(lost, fnErr)
	case fnErr != nil:
		return fnErr
	default:
		// A run that the heartbeat gave up on but nobody took over is still recorded as
		// done (finErr nil): it did complete.
		return finErr
	}
}

// finish records the outcome of run with a context of its own: it must happen even when
// the caller's context ended (that may be why fn returned).
func finish(ctx context.Context, pool *pgxpool.Pool, run Run, fnErr error, log *slog.Logger) error {
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	err := FinishTick(fctx, pool, run, fnErr)
	if err != nil && !errors.Is(err, ErrLost) {
		log.Warn("pgcoord: could not record the outcome of a job run; the tick stays running until its lease expires", "err", err)
	}
	return err
}

// heartbeater extends a run's lease while fn runs, and cancels fn's context when the run
// is lost or the runner cannot trust it any more.
type heartbeater struct {
	pool   *pgxpool.Pool
	ttl    time.Duration
	every  time.Duration
	margin time.Duration
	log    *slog.Logger
	cancel context.CancelCauseFunc
	stop   chan struct{}
	done   chan Run // receives the last version of the run when run returns
	span   tracing.Span
	halted bool
	last   Run
}

// run heartbeats until stopped. expiresLocal is when the lease expires by the database
// clock, translated to the local clock at the claim.
func (h *heartbeater) run(r Run, expiresLocal time.Time) {
	defer func() { h.done <- r }()
	beat := time.NewTimer(h.every)
	defer beat.Stop()
	trustUntil := expiresLocal.Add(-h.margin)
	trust := time.NewTimer(time.Until(trustUntil))
	defer trust.Stop()
	for {
		select {
		case <-h.stop:
			return
		case <-trust.C:
			h.lose(fmt.Errorf("%w: job %q: no heartbeat succeeded before the run's lease would expire", ErrLost, r.Job))
			return
		case <-beat.C:
		}
		start := time.Now()
		ctx, cancel := context.WithDeadline(context.Background(), trustUntil)
		next, dbNow, err := heartbeat(ctx, h.pool, r, h.ttl)
		cancel()
		switch {
		case errors.Is(err, ErrLost):
			h.lose(err)
			return
		case err != nil:
			h.log.Warn("pgcoord: job heartbeat failed; retrying until the lease would expire", "err", err, "trust_left", time.Until(trustUntil))
			beat.Reset(min(h.every, max(time.Until(trustUntil)/4, time.Millisecond)))
			continue
		}
		r = next
		trustUntil = start.Add(next.ExpiresAt.Sub(dbNow) - h.margin)
		trust.Reset(time.Until(trustUntil))
		beat.Reset(h.every)
	}
}

// lose cancels fn's context for the loss of its run.
func (h *heartbeater) lose(err error) {
	h.log.Warn("pgcoord: job run lost; cancelling its function", "err", err)
	if h.span.On() {
		h.span.Event(tracing.EventTickLost, tracing.Str(tracing.AttrCause, err.Error()))
	}
	h.cancel(err)
}

// claimTraced is claim, in a span of tracer if it is set. No tick to run is no error.
func claimTraced(ctx context.Context, pool *pgxpool.Pool, j Job, holder string, tracer pgcoord.Tracer) (Run, time.Time, error) {
	if tracer == nil {
		return claim(ctx, pool, j, holder)
	}
	ctx, span := tracing.Start(ctx, tracer, tracing.TickClaim, tracing.Str(tracing.AttrJob, j.Name),
		tracing.Str(tracing.AttrHolder, holder))
	run, dbNow, err := claim(ctx, pool, j, holder)
	span.Set(tracing.Bool(tracing.AttrClaimed, err == nil))
	if err == nil {
		span.Set(runAttrs(run)...)
	}
	if errors.Is(err, ErrNoTick) {
		span.End(nil)
	} else {
		span.End(err)
	}
	return run, dbNow, err
}

// runAttrs are the attributes of a traced run.
func runAttrs(r Run) []pgcoord.Attr {
	return []pgcoord.Attr{tracing.Str(tracing.AttrJob, r.Job), tracing.Str(tracing.AttrTick, r.ScheduledFor.UTC().Format(time.RFC3339Nano)),
		tracing.Int(tracing.AttrToken, r.Token), tracing.Int(tracing.AttrAttempt, int64(r.Attempt)), tracing.Str(tracing.AttrHolder, r.Holder)}
}

// halt stops the heartbeats and returns the run as last heartbeated.
func (h *heartbeater) halt() Run {
	if !h.halted {
		h.halted = true
		close(h.stop)
		h.last = <-h.done
	}
	return h.last
}
