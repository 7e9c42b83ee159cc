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
	// candidates' OnNewLeader receive. Default: pgcoord.NewHolderID(), fixed for the Elector's life.
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
	// NoListen makes campaigning poll only, without LISTEN: for connections through a
	// transaction-mode pooler, where notifications are not delivered. Failover after a
	// resignation then takes up to PollInterval instead of a few milliseconds.
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
	// Metrics receives the counts of the keep-alive loop (see Do). Default
	// DefaultMetrics.
	Metrics *Metrics
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
		return nil, fmt.Errorf("%w: leases: nil pool", pgcoord.ErrInvalidArgument)
	}
	if cfg == nil {
		return nil, fmt.Errorf("%w: leases: nil elector config", pgcoord.ErrInvalidArgument)
	}
	c := *cfg
	if c.TTL == 0 {
		c.TTL = DefaultElectorTTL
	}
	if err := validate(c.Name, c.TTL); err != nil {
		return nil, err
	}
	if c.Holder == "" {
		c.Holder = pgcoord.NewHolderID()
	} else if err := pgcoord.ValidateName("holder", c.Holder); err != nil {
		return nil, err
	}
	if err := pgcoord.CheckSyncCommit(c.SyncCommit); err != nil {
		return nil, fmt.Errorf("leases: %w", err)
	}
	if c.SafetyMargin == 0 {
		c.SafetyMargin = c.TTL / 10
	}
	if c.SafetyMargin < 0 || c.SafetyMargin >= c.TTL {
		return nil, fmt.Errorf("%w: leases: safety margin %v must be between 0 and the TTL %v", pgcoord.ErrInvalidArgument, c.SafetyMargin, c.TTL)
	}
	if c.RenewEvery == 0 {
		c.RenewEvery = c.TTL / 3
	}
	if c.RenewEvery <= 0 || c.RenewEvery >= c.TTL-c.SafetyMargin {
		return nil, fmt.Errorf("%w: leases: renew interval %v must be between 0 and TTL − safety margin (%v)", pgcoord.ErrInvalidArgument, c.RenewEvery, c.TTL-c.SafetyMargin)
	}
	if c.PollInterval == 0 {
		c.PollInterval = time.Second
	}
	if c.PollInterval < 0 {
		return nil, fmt.Errorf("%w: leases: negative poll interval %v", pgcoord.ErrInvalidArgument, c.PollInterval)
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

// IsLeader reports whether this candidate leads now: it holds a grant of the lease, that
// grant has not been found lost, and its trust deadline has not passed by the local
// monotonic clock. It turns false as soon as the term's context is cancelled (before
// OnStartedLeading returns), or when OnStartedLeading returns.
//
// The trust deadline is the grant's Lease.TrustUntil, moved forward each time the leader
// reads its lease back (at least every RenewEvery) and finds it renewed, computed like a
// renewal's: never later than the database's expiry minus SafetyMargin. When renewals
// fail, IsLeader therefore turns false at that deadline, possibly a little before the
// keep-alive gives up the term; should a renewal get through in that gap, IsLeader
// reports true again.
//
// It is a local judgement: a leader paused right after IsLeader returned true may act
// after it was deposed, so fence its writes with the lease's token.
func (e *Elector) IsLeader() bool {
	_, ok := e.Leader()
	return ok
}

// Leader returns the grant this candidate leads with, and true, when IsLeader would
// report true; otherwise a zero Lease and false. The grant's ExpiresAt and TrustUntil
// reflect the latest renewal the leader has observed; its Token is the one to fence writes
// with.
func (e *Elector) Leader() (Lease, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	t := e.term
	if t == nil || t.ctx.Err() != nil || !t.lease.Trusted() {
		return Lease{}, false
	}
	return t.lease, true
}

// ObservedLeader returns the holder this candidate last saw leading (itself included), or
// "" if it has seen none yet. It may be stale by up to PollInterval.
func (e *Elector) ObservedLeader() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.seenHolder
}

// report records that holder leads with token and calls OnNewLeader if the leader changed.
// Observations older than the last reported one (lower token) are dropped.
func (e *Elector) report(holder string, token int64) {
	e.cbMu.Lock()
	defer e.cbMu.Unlock()
	e.mu.Lock()
	if token < e.seenToken {
		e.mu.Unlock()
		return
	}
	e.seenToken = token
	changed := holder != e.seenHolder
	e.seenHolder = holder
	e.mu.Unlock()
	if changed && e.cfg.OnNewLeader != nil {
		e.cfg.OnNewLeader(holder)
	}
}

// poke makes the observer read the lease now.
func (e *Elector) poke() {
	select {
	case e.wake <- struct{}{}:
	default:
	}
}

// observe reads the lease every PollInterval while following, and at least every
// RenewEvery while leading, until ctx ends.
func (e *Elector) observe(ctx context.Context) {
	timer := time.NewTimer(0)
	defer timer.Stop()
	failures := 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		case <-e.wake:
			timer.Stop()
		}
		if err := e.poll(ctx); err != nil && ctx.Err() == nil {
			failures++
			if failures == 1 || failures%10 == 0 {
				e.log.Warn("pgcoord: reading the leader lease failed", "err", err, "failures", failures)
			}
		} else {
			failures = 0
		}
		every := e.cfg.PollInterval
		e.mu.Lock()
		if e.term != nil {
			every = min(every, e.cfg.RenewEvery)
		}
		e.mu.Unlock()
		timer.Reset(listen.Jitter(every))
	}
}

// poll reads the lease once: it reports the leader it finds, and while leading refreshes
// the term's trust deadline from the expiry the database reports, or ends the term if the
// grant is no longer current.
func (e *Elector) poll(ctx context.Context) error {
	e.mu.Lock()
	t := e.term
	e.mu.Unlock()
	rctx, cancel := context.WithTimeout(ctx, max(e.cfg.PollInterval, e.cfg.RenewEvery))
	defer cancel()
	start := time.Now()
	info, err := Get(rctx, e.pool, e.cfg.Name)
	if errors.Is(err, ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	if info.Held() {
		e.report(info.Holder, info.Token)
	}
	if t == nil {
		return nil
	}
	// t was current before the read started, so the read sees t's grant or a later state.
	if info.Held() && info.Token == t.lease.Token && info.Holder == t.lease.Holder {
		// The same computation as for a renewal's reply: the grant lasts at least the
		// remaining TTL the database reports, counted from before the request was sent.
		trust := start.Add(info.ExpiresAt.Sub(info.DBNow) - e.cfg.SafetyMargin)
		e.mu.Lock()
		if trust.After(t.lease.TrustUntil) {
			t.lease.TrustUntil = trust
			t.lease.ExpiresAt = info.ExpiresAt
		}
		e.mu.Unlock()
		return nil
	}
	t.cancel(fmt.Errorf("%w: %q token %d is no longer current (the lease has token %d, holder %q)",
		ErrLost, e.cfg.Name, t.lease.Token, info.Token, info.Holder))
	return nil
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
