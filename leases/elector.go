package leases

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/internal/base"
	"github.com/pgcoord/pgcoord/internal/listen"
	"github.com/pgcoord/pgcoord/pgcoord"
)

// DefaultElectorTTL is the lease TTL of an Elector when ElectorConfig.TTL is zero: how long
// a crashed leader blocks the election at most.
const DefaultElectorTTL = 15 * time.Second

// ErrElectorRunning is returned by Run when the same Elector is already running.
var ErrElectorRunning = errors.New("leases: elector is already running")

// ElectorConfig configures an Elector. Name is required; every other field has a default.
type ElectorConfig struct {
	// Name is the lease the candidates campaign for: one leader per name.
	Name string
	// TTL is the lease's time to live, renewed while leading. A leader that dies without
	// resigning (crash, SIGKILL, partition) is replaced at most TTL after its last renewal.
	// Default DefaultElectorTTL.
	TTL time.Duration
	// Holder identifies this candidate: the lease's holder while it leads, and what other
	// candidates' OnNewLeader receive. Default: a new "host/pid/random" identity, fixed for the Elector's life.
	// Two Electors with the same Holder are one candidate to pgcoord and share leadership:
	// never give two processes the same Holder.
	Holder string
	// Metadata is stored with the lease for operators (`pgcoord leases list`), on top of
	// host, pid and app.
	Metadata map[string]string
	// RenewEvery is the interval between renewals while leading. Default TTL/3. It must be
	// less than TTL − SafetyMargin.
	RenewEvery time.Duration
	// SafetyMargin is how long before the database would expire the lease the leader stops
	// trusting it when renewals do not get through (see Lease.TrustUntil). Default TTL/10.
	SafetyMargin time.Duration
	// PollInterval is how often a follower reads the lease to observe the leader (for
	// OnNewLeader), and the longest a waiting candidate goes without retrying when no
	// notification arrives (see AcquireOpts.PollInterval). A leader reads its own lease at
	// least every RenewEvery, to refresh its trust deadline and to notice early that it
	// was deposed. Default 1s, jittered by ±20%.
	PollInterval time.Duration
	// Cooldown is how long the elector waits before campaigning again after a term ended
	// without shutdown (leadership lost, or OnStartedLeading returned), so that another
	// candidate can take over. After an error (the database unreachable) it waits at least
	// max(Cooldown, PollInterval), doubling with each consecutive error up to 30s.
	// Default PollInterval; a negative value means no wait.
	Cooldown time.Duration
	// NoListen makes campaigning poll only, without LISTEN, as it does on its own behind a
	// transaction-mode pooler (see AcquireOpts.NoListen). Failover after a resignation
	// then takes up to PollInterval instead of a few milliseconds.
	NoListen bool
	// SyncCommit is the synchronous_commit level of each grant of leadership, as
	// AcquireOpts.SyncCommit: set it (e.g. "on") so that a leader elected before a
	// failover to a synchronous standby is still the leader after it. Default "": the
	// server's setting.
	SyncCommit string

	// OnStartedLeading runs, in Run's goroutine, each time this candidate becomes leader.
	// Its context is cancelled when leadership ends: lost (a renewal found the lease taken
	// over or expired by an operator, a read found it gone, or the trust deadline passed
	// without a successful renewal) or Run's context ended. It should return promptly
	// then; the lease is released only after it returns. If it returns while still
	// leading, the elector resigns (releases the lease, waking the other candidates), waits
	// Cooldown and campaigns again: a leader that stopped doing the leader's work must not
	// keep others from doing it. Nil means lead without a function, until leadership is
	// lost or Run returns (for callers that only ask IsLeader).
	//
	// The leader's writes must carry lease.Token (package fenced): a paused leader learns
	// that it was deposed only when it next looks.
	OnStartedLeading func(ctx context.Context, lease Lease)
	// OnStoppedLeading is called once after each term, once OnStartedLeading has returned
	// and the lease has been released (or found lost), in Run's goroutine.
	OnStoppedLeading func()
	// OnNewLeader is called when the observed leader changes, including to this candidate
	// itself when it is elected. Calls are serialized and ordered by fence token (a stale
	// observation is never reported after a newer one); a lease that is free or expired
	// is not reported. Followers observe a change within about PollInterval.
	OnNewLeader func(holder string)

	// Logger receives the elector's events: elected, lost, resigned, errors. Default
	// slog.Default().
	Logger *slog.Logger
	// Metrics, if set, receives the counts of the keep-alive loop (see Do). Default nil:
	// not counted.
	Metrics *Metrics
	// Tracer, if set, traces each term as Do does (DoOpts.Tracer). Default nil: not
	// traced.
	Tracer pgcoord.Tracer
}

// Elector runs a leader election on a lease: among all Electors campaigning for one name,
// in any number of processes, at most one leads at any instant of the database clock. It
// is built on Do: the leader holds the lease, renews it in the background and stops
// trusting it at its trust deadline; candidates wait in Acquire and are woken by the
// release's notification when the leader resigns.
//
// What an Elector guarantees is the lease's guarantee, no more: a leader that is paused
// (GC, SIGSTOP, swap) past its TTL keeps believing it leads until it looks at its context
// or calls IsLeader. Fence the leader's writes with its lease's token (package fenced).
//
// An Elector is safe for concurrent use. Create it with NewElector.
type Elector struct {
	pool *pgxpool.Pool
	cfg  ElectorConfig
	log  *slog.Logger

	running atomic.Bool
	wake    chan struct{} // asks the observer to read the lease now

	mu         sync.Mutex
	term       *term  // the current term, nil while following
	seenToken  int64  // token of the last leader reported to OnNewLeader
	seenHolder string // holder last reported to OnNewLeader

	cbMu sync.Mutex // serializes OnNewLeader calls
}

// term is one period of leadership.
type term struct {
	lease  Lease // TrustUntil and ExpiresAt refreshed by the observer's reads; guarded by Elector.mu
	ctx    context.Context
	cancel context.CancelCauseFunc
}

// NewElector returns an Elector for cfg, validated, with defaults filled in. It returns an
// error wrapping pgcoord.ErrInvalidName for a bad Name or Holder, and one wrapping
// pgcoord.ErrInvalidArgument for a nil pool or config or durations out of range. It does
// not touch the database: call Run.
//
// A candidate holds no connection while it waits: its attempts, renewals and reads of the
// leader each borrow one from the pool for one statement, and its wake-ups come from the
// pool's one shared LISTEN connection (see Acquire).
func NewElector(pool *pgxpool.Pool, cfg *ElectorConfig) (*Elector, error) {
	if pool == nil {
		return nil, check.Invalid("nil pool")
	}
	if cfg == nil {
		return nil, check.Invalid("nil elector config")
	}
	c := *cfg
	if c.TTL == 0 {
		c.TTL = DefaultElectorTTL
	}
	if err := validate(c.Name, c.TTL); err != nil {
		return nil, err
	}
	if c.Holder == "" {
		c.Holder = base.NewHolderID()
	} else if err := check.Name("holder", c.Holder); err != nil {
		return nil, err
	}
	if err := check.SyncCommit(c.SyncCommit); err != nil {
		return nil, err
	}
	if c.SafetyMargin == 0 {
		c.SafetyMargin = c.TTL / 10
	}
	if c.SafetyMargin < 0 || c.SafetyMargin >= c.TTL {
		return nil, check.Invalid("safety margin %v must be between 0 and the TTL %v", c.SafetyMargin, c.TTL)
	}
	if c.RenewEvery == 0 {
		c.RenewEvery = c.TTL / 3
	}
	if c.RenewEvery <= 0 || c.RenewEvery >= c.TTL-c.SafetyMargin {
		return nil, check.Invalid("renew interval %v must be between 0 and TTL − safety margin (%v)", c.RenewEvery, c.TTL-c.SafetyMargin)
	}
	if c.PollInterval == 0 {
		c.PollInterval = time.Second
	}
	if c.PollInterval < 0 {
		return nil, check.Invalid("negative poll interval %v", c.PollInterval)
	}
	if c.Cooldown == 0 {
		c.Cooldown = c.PollInterval
	}
	if c.Cooldown < 0 {
		c.Cooldown = 0
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return &Elector{
		pool: pool, cfg: c, wake: make(chan struct{}, 1),
		log: c.Logger.With("lease", c.Name, "holder", c.Holder),
	}, nil
}

// Holder returns this candidate's holder identity (ElectorConfig.Holder or the one
// generated for it).
func (e *Elector) Holder() string { return e.cfg.Holder }

// Name returns the name of the lease the Elector campaigns for.
func (e *Elector) Name() string { return e.cfg.Name }

// Run campaigns for leadership until ctx ends, leading whenever elected (see
// ElectorConfig.OnStartedLeading), and returns nil once ctx has ended, having resigned:
// OnStartedLeading's context is cancelled, and when it has returned the lease is released,
// which wakes the other candidates at once. The release is attempted for up to 5s after
// ctx ends.
//
// Errors along the way (the database unreachable, a lost lease) are logged and retried
// with backoff; Run does not return them. It returns ErrElectorRunning if this Elector is
// already running. An Elector may be run again after Run returned.
func (e *Elector) Run(ctx context.Context) error {
	if !e.running.CompareAndSwap(false, true) {
		return fmt.Errorf("%w: %q as %q", ErrElectorRunning, e.cfg.Name, e.cfg.Holder)
	}
	defer e.running.Store(false)

	obsCtx, stopObserver := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { e.observe(obsCtx) })
	defer func() {
		stopObserver()
		wg.Wait()
	}()

	opts := &DoOpts{
		AcquireOpts: AcquireOpts{
			Holder: e.cfg.Holder, Metadata: e.cfg.Metadata, SafetyMargin: e.cfg.SafetyMargin,
			PollInterval: e.cfg.PollInterval, NoListen: e.cfg.NoListen, SyncCommit: e.cfg.SyncCommit,
			Tracer: e.cfg.Tracer,
		},
		RenewEvery: e.cfg.RenewEvery,
		Logger:     e.cfg.Logger,
		Metrics:    e.cfg.Metrics,
	}
	failures := 0
	for {
		led := false
		err := Do(ctx, e.pool, e.cfg.Name, e.cfg.TTL, func(fnCtx context.Context, l Lease) error {
			led = true
			e.lead(fnCtx, l)
			return nil
		}, opts)
		if led {
			e.poke()
			if e.cfg.OnStoppedLeading != nil {
				e.cfg.OnStoppedLeading()
			}
		}
		if ctx.Err() != nil {
			if led {
				e.log.Info("pgcoord: resigned leadership on shutdown", "err", err)
			}
			return nil
		}
		wait := e.cfg.Cooldown
		switch {
		case errors.Is(err, ErrLost):
			failures = 0
			e.log.Warn("pgcoord: leadership lost; campaigning again", "err", err, "cooldown", wait)
		case err == nil && led:
			failures = 0
			e.log.Info("pgcoord: leader function returned; resigned and campaigning again", "cooldown", wait)
		default:
			failures++
			base := max(e.cfg.Cooldown, e.cfg.PollInterval)
			wait = min(base<<min(failures-1, 6), max(30*time.Second, base))
			e.log.Warn("pgcoord: campaign failed; retrying", "err", err, "failures", failures, "backoff", wait)
		}
		if !sleepCtx(ctx, listen.Jitter(wait)) {
			return nil
		}
	}
}

// lead runs one term: it makes the grant l visible to IsLeader, reports the new leader and
// runs OnStartedLeading until it returns.
func (e *Elector) lead(fnCtx context.Context, l Lease) {
	ctx, cancel := context.WithCancelCause(fnCtx)
	defer cancel(nil)
	t := &term{lease: l, ctx: ctx, cancel: cancel}
	e.mu.Lock()
	e.term = t
	e.mu.Unlock()
	e.log.Info("pgcoord: elected leader", "token", l.Token)
	e.report(l.Holder, l.Token)
	e.poke() // the observer switches to the leader's cadence

	if fn := e.cfg.OnStartedLeading; fn != nil {
		fn(ctx, l)
	} else {
		<-ctx.Done()
	}

	e.mu.Lock()
	e.term = nil
	e.mu.Unlock()
	if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, context.Canceled) {
		e.log.Info("pgcoord: stopped leading", "token", l.Token, "cause", cause)
	}
}

// sleepCtx waits d or until ctx ends, and reports whether ctx is still live.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-timer.C:
		return true
	}
}
