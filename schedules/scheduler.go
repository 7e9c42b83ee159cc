package schedules

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/internal/base"
	"github.com/pgcoord/pgcoord/internal/cronspec"
	"github.com/pgcoord/pgcoord/internal/dbarg"
	"github.com/pgcoord/pgcoord/internal/dbsqlc"
	"github.com/pgcoord/pgcoord/internal/listen"
	"github.com/pgcoord/pgcoord/internal/tracing"
	"github.com/pgcoord/pgcoord/pgcoord"
	"github.com/pgcoord/pgcoord/singleton"
)

// Handler runs one tick of a schedule. Its context is cancelled when the run is lost
// (taken over, replaced, deleted), at the schedule's Deadline, and when the Scheduler
// stops. Its error is recorded in the ledger.
type Handler func(ctx context.Context, run Run) error

// Run is one run of a schedule, as its handler receives it.
type Run struct {
	// Schedule is the schedule's name, and Tick the tick this run is for (for a trigger,
	// when it was asked for), by the database clock.
	Schedule string
	Tick     time.Time
	// Cause is why it runs: "schedule", "catch-up" (a due tick queued behind another by
	// CatchUpAll), "trigger" or "backfill".
	Cause string
	// Args is the schedule's JSON arguments.
	Args json.RawMessage
	// Token is the run's fence token (resource "job:"+Schedule, package fenced) and
	// Attempt counts the claims of this tick (2 or more after a takeover).
	Token   int64
	Attempt int
}

// Defaults of Config.
const (
	DefaultRunTTL       = 30 * time.Second
	DefaultPollInterval = time.Second
	DefaultMaxRuns      = 100
	// MaxTicksPerClaim is the most due ticks one claim considers: of a schedule further
	// behind, with CatchUpLatest, the older ticks count as missed.
	MaxTicksPerClaim = 1000
	// maxMissedCount bounds the counting of missed ticks, one by one, in one claim; a
	// schedule further behind records that many and goes on from its window.
	maxMissedCount = 100000
	// batch is how many schedules one look at the database handles of each kind, and
	// maxLooks how many looks for due ticks one pass makes at most.
	batch    = 100
	maxLooks = 10
)

// Config configures a Scheduler.
type Config struct {
	// Pool is the database. Required.
	Pool *pgxpool.Pool
	// Handlers maps handler names (1 to 255 bytes, at most 1000) to their functions: this
	// process runs the ticks of the schedules that name them. Required, not empty.
	Handlers map[string]Handler
	// Holder identifies this process in the ledger. Default: a new identity per
	// Scheduler, "host/pid/random".
	Holder string
	// Logger receives failed runs and failed looks at the database. Default
	// slog.Default().
	Logger *slog.Logger
	// Tracer, if set, traces each run (see pgcoord.Tracer). Default nil.
	Tracer pgcoord.Tracer
	// RunTTL is the lease of a running tick, heartbeated every RunTTL/3: a process that
	// stops for RunTTL has its run taken over by another. It is also how long the
	// registration of the handlers outlives this process. Default DefaultRunTTL;
	// between singleton.MinTTL and singleton.MaxTTL, and at least 3 seconds.
	RunTTL time.Duration
	// PollInterval is the longest this process goes without looking at the database:
	// notifications of changes wake it sooner (not behind a transaction pooler, where it
	// polls). Default DefaultPollInterval; between 10ms and a minute.
	PollInterval time.Duration
	// MaxRuns caps the runs this process runs at once; due ticks beyond it are left to
	// other processes (or to later). Default DefaultMaxRuns.
	MaxRuns int
}

// Scheduler runs the ticks of the schedules whose handlers it has, on every replica: each
// tick runs once across them (see the package documentation).
type Scheduler struct {
	cfg      Config
	handlers []string
	runs     sync.WaitGroup
	mu       sync.Mutex
	running  int
	done     chan struct{} // a run finished: buffered and pending runs may start
}

// New checks cfg and returns a Scheduler. It returns an error wrapping
// pgcoord.ErrInvalidArgument or pgcoord.ErrInvalidName for a bad Config; no SQL runs.
func New(cfg Config) (*Scheduler, error) {
	if err := check.DB(cfg.Pool); err != nil {
		return nil, err
	}
	if len(cfg.Handlers) == 0 || len(cfg.Handlers) > 1000 {
		return nil, check.Invalid("scheduler: %d handlers, want 1 to 1000", len(cfg.Handlers))
	}
	for name, h := range cfg.Handlers {
		if err := check.Name("handler", name); err != nil {
			return nil, err
		}
		if h == nil {
			return nil, check.Invalid("scheduler: handler %q is nil", name)
		}
	}
	if cfg.Holder == "" {
		cfg.Holder = base.NewHolderID()
	}
	if err := check.Name("holder", cfg.Holder); err != nil {
		return nil, err
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.RunTTL == 0 {
		cfg.RunTTL = DefaultRunTTL
	}
	if cfg.RunTTL < 3*time.Second || cfg.RunTTL > singleton.MaxTTL {
		return nil, check.Invalid("scheduler: RunTTL %v is outside [3s, %v]", cfg.RunTTL, singleton.MaxTTL)
	}
	if cfg.PollInterval == 0 {
		cfg.PollInterval = DefaultPollInterval
	}
	if cfg.PollInterval < 10*time.Millisecond || cfg.PollInterval > time.Minute {
		return nil, check.Invalid("scheduler: PollInterval %v is outside [10ms, 1m]", cfg.PollInterval)
	}
	if cfg.MaxRuns == 0 {
		cfg.MaxRuns = DefaultMaxRuns
	}
	if cfg.MaxRuns < 1 {
		return nil, check.Invalid("scheduler: MaxRuns %d is not positive", cfg.MaxRuns)
	}
	return &Scheduler{cfg: cfg, handlers: slices.Sorted(maps.Keys(cfg.Handlers)), done: make(chan struct{}, 1)}, nil
}

// Run registers the handlers and runs due ticks until ctx ends; then it cancels the runs
// still running, waits for their handlers to return (their outcomes are recorded),
// unregisters, and returns ctx's error. Failed looks at the database are logged and
// retried; Run returns early only for an error that retrying cannot mend (a bad stored
// expression is logged, not returned).
func (s *Scheduler) Run(ctx context.Context) error {
	w, err := s.waiter(ctx)
	if err != nil {
		return err
	}
	defer w.Close()
	defer func() {
		s.runs.Wait()
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		_ = queries.ScheduleUnregister(cctx, s.cfg.Pool, s.cfg.Holder)
	}()
	var registered time.Time
	for {
		if time.Since(registered) >= s.cfg.RunTTL/3 {
			if err := queries.ScheduleRegister(ctx, s.cfg.Pool, dbsqlc.ScheduleRegisterParams{
				Holder: s.cfg.Holder, Handlers: s.handlers, Ttl: dbarg.Interval(s.cfg.RunTTL),
			}); err != nil {
				s.warn(ctx, "register handlers", err)
			} else {
				registered = time.Now()
			}
		}
		wake := time.Now().Add(s.cfg.PollInterval)
		if next, err := s.pass(ctx); err != nil {
			s.warn(ctx, "look for due ticks", err)
		} else if !next.IsZero() && next.Before(wake) {
			wake = next
		}
		if d := time.Until(registered.Add(s.cfg.RunTTL / 3)); d < time.Until(wake) {
			wake = time.Now().Add(d)
		}
		if err := s.sleep(ctx, w, time.Until(wake)); err != nil {
			return err
		}
	}
}

// waiter returns a waiter on the schedules channel, or one that only sleeps behind a
// transaction pooler.
func (s *Scheduler) waiter(ctx context.Context) (*listen.Waiter, error) {
	if listen.Pooled(s.cfg.Pool) {
		return listen.New(ctx, s.cfg.Pool, "", "")
	}
	ch, err := queries.ScheduleChannel(ctx, s.cfg.Pool)
	if err != nil {
		return nil, fmt.Errorf("schedules: %w", err)
	}
	return listen.New(ctx, s.cfg.Pool, ch, "")
}

// sleep waits d, or for a notification or the end of a run of this process.
func (s *Scheduler) sleep(ctx context.Context, w *listen.Waiter, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-s.done:
			cancel()
		case <-wctx.Done():
		}
	}()
	err := w.Wait(wctx, d)
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}

func (s *Scheduler) warn(ctx context.Context, what string, err error) {
	if ctx.Err() == nil {
		s.cfg.Logger.Warn("schedules: could not "+what+"; retrying", "holder", s.cfg.Holder, "err", err)
	}
}

// pass arms the schedules a change left unarmed, claims the due ticks, starts the runs
// that wait, and returns when, by the local clock, the next tick is due (zero: none; now:
// its looks read full batches of due schedules, and more may be due).
func (s *Scheduler) pass(ctx context.Context) (time.Time, error) {
	unarmed, err := queries.ScheduleUnarmed(ctx, s.cfg.Pool, batch)
	if err != nil {
		return time.Time{}, err
	}
	for _, u := range unarmed {
		next, err := firstTick(u.Expr, u.Zone, u.ArmFrom, u.StartsAt, u.EndsAt)
		if err != nil {
			s.cfg.Logger.Error("schedules: cannot arm a schedule", "schedule", u.Name, "err", err)
			continue
		}
		if _, err := queries.ScheduleArm(ctx, s.cfg.Pool, dbsqlc.ScheduleArmParams{Name: u.Name, Version: u.Version, Next: next}); err != nil {
			return time.Time{}, err
		}
	}
	// Claim the due ticks, look after look. A look reads at most batch schedules, and
	// leaves out those the pass's earlier looks read (their claims started a run, or found
	// them taken by another process or changed): processes that see the same burst spread
	// over it instead of waiting for each other's claims to commit.
	var seen []string
	more, launched := false, 0 // more: the last look read a full batch, and more may be due
	for {
		due, err := queries.ScheduleDue(ctx, s.cfg.Pool, dbsqlc.ScheduleDueParams{Handlers: s.handlers, Skip: seen, MaxRows: batch})
		if err != nil {
			return time.Time{}, err
		}
		n, err := s.claimDue(ctx, due)
		if err != nil {
			return time.Time{}, err
		}
		launched += n
		more = len(due) == batch
		if !more || len(seen) >= maxLooks*batch || !s.hasPlace() {
			break
		}
		for _, d := range due {
			seen = append(seen, d.Name)
		}
	}
	waiting, err := queries.ScheduleWaiting(ctx, s.cfg.Pool, dbsqlc.ScheduleWaitingParams{Handlers: s.handlers, MaxRows: batch})
	if err != nil {
		return time.Time{}, err
	}
	for _, name := range waiting {
		for range 10 {
			if !s.reserve() {
				break
			}
			started, err := s.start(ctx, name)
			if err != nil || !started {
				s.release()
				if err != nil {
					return time.Time{}, err
				}
				break
			}
		}
	}
	if more && launched > 0 && s.hasPlace() {
		// A new pass reads the schedules this one left out (while passes make progress:
		// schedules held by others wait for the next wake-up).
		return time.Now(), nil
	}
	sent := time.Now()
	next, err := queries.ScheduleNextDue(ctx, s.cfg.Pool, s.handlers)
	if err != nil || len(next) == 0 {
		return time.Time{}, err
	}
	return sent.Add(next[0].DueAt.Sub(next[0].DbNow)), nil
}

// reserve takes a place for a run of this process, if there is one left.
func (s *Scheduler) reserve() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.running >= s.cfg.MaxRuns {
		return false
	}
	s.running++
	return true
}

// hasPlace says whether a run of this process may start now.
func (s *Scheduler) hasPlace() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.running < s.cfg.MaxRuns
}

// release gives back a place no run took.
func (s *Scheduler) release() {
	s.mu.Lock()
	s.running--
	s.mu.Unlock()
}

// finished gives back the place of a run that ended, and wakes Run: a buffered or pending
// run may start now. (A claim that started no run wakes nothing: with places left, a look
// that lost every claim to other processes would otherwise look again at once, and again,
// taking the CPU the winners' claims need.)
func (s *Scheduler) finished() {
	s.release()
	select {
	case s.done <- struct{}{}:
	default:
	}
}

// start starts a waiting run of one schedule, with a place reserved; false when none could
// start.
func (s *Scheduler) start(ctx context.Context, name string) (bool, error) {
	sent := time.Now()
	cctx, span := s.claimSpan(ctx, name)
	rows, err := queries.ScheduleStart(cctx, s.cfg.Pool, dbsqlc.ScheduleStartParams{
		Name: name, Holder: s.cfg.Holder, Handlers: s.handlers, Ttl: dbarg.Interval(s.cfg.RunTTL),
	})
	endClaim(span, err == nil && len(rows) > 0 && rows[0].State == "running", err)
	if err != nil {
		return false, fmt.Errorf("start %q: %w", name, base.TranslateError(err))
	}
	if len(rows) == 0 || rows[0].State != "running" {
		return false, nil
	}
	s.launch(ctx, claimed(rows[0]), sent)
	return true, nil
}

// claimSpan starts the span of a claim (of a due tick, or of a waiting run), if tracing.
func (s *Scheduler) claimSpan(ctx context.Context, schedule string) (context.Context, tracing.Span) {
	if s.cfg.Tracer == nil {
		return ctx, tracing.Span{}
	}
	return tracing.Start(ctx, s.cfg.Tracer, tracing.TickClaim, tracing.Str(tracing.AttrJob, schedule),
		tracing.Str(tracing.AttrHolder, s.cfg.Holder))
}

// endClaim ends a claim's span, saying whether it started a run.
func endClaim(span tracing.Span, claimed bool, err error) {
	if span.On() {
		span.Set(tracing.Bool(tracing.AttrClaimed, claimed))
	}
	span.End(err)
}

// claimed is a run this process claimed, as the claim returned it.
type claimed dbsqlc.ScheduleStartRow

func (c claimed) ledger() singleton.Run {
	return singleton.Run{Job: c.Job, ScheduledFor: c.ScheduledFor, Token: c.FenceToken, Attempt: int(c.Attempt),
		Holder: c.Holder, StartedAt: c.StartedAt, ExpiresAt: dbarg.Deref(c.ExpiresAt)}
}

func (c claimed) run() Run {
	return Run{Schedule: c.Job, Tick: c.ScheduledFor, Cause: c.Cause, Args: c.Args, Token: c.FenceToken, Attempt: int(c.Attempt)}
}

// launch runs a claimed run's handler in a goroutine of its own, heartbeating the run and
// recording its outcome; it gives the run's place back when done. sent is when the claim
// was sent, by the local clock.
func (s *Scheduler) launch(ctx context.Context, c claimed, sent time.Time) {
	h, run, deadline := s.cfg.Handlers[c.Handler], c.run(), dbarg.Duration(c.Deadline)
	s.runs.Add(1)
	go func() {
		defer s.runs.Done()
		defer s.finished()
		fn := func(ctx context.Context, _ singleton.Run) error {
			if h == nil { // the schedule changed its handler since the claim
				return fmt.Errorf("schedules: this process has no handler %q", c.Handler)
			}
			if deadline <= 0 {
				return h(ctx, run)
			}
			dctx, cancel := context.WithTimeout(ctx, deadline)
			defer cancel()
			err := h(dctx, run)
			if errors.Is(dctx.Err(), context.DeadlineExceeded) && ctx.Err() == nil {
				return fmt.Errorf("schedules: deadline %v exceeded (the handler returned %v)", deadline, err)
			}
			return err
		}
		err := singleton.RunClaimed(ctx, s.cfg.Pool, c.ledger(), sent, c.DbNow, s.cfg.RunTTL, fn,
			&singleton.RunTickOpts{Holder: s.cfg.Holder, Logger: s.cfg.Logger, Tracer: s.cfg.Tracer})
		if err != nil && ctx.Err() == nil {
			s.cfg.Logger.Warn("schedules: run failed", "schedule", run.Schedule, "tick", run.Tick, "err", err)
		}
	}()
}

// dueTicks splits the ticks of spec from from (a tick, at most now) through now: those
// before windowStart are missed (counted), the others are due (at most MaxTicksPerClaim:
// the newest ones for CatchUpLatest, the oldest for CatchUpAll). next is the tick after the
// last due one sent, nil when there is none before endsAt.
func dueTicks(spec cronspec.Schedule, from, windowStart, now time.Time, policy CatchUpPolicy, endsAt *time.Time) (missed int64, ticks []time.Time, next *time.Time) {
	t := from
	for !t.IsZero() && t.Before(windowStart) && missed < maxMissedCount {
		missed++
		t = spec.Next(t)
	}
	if !t.IsZero() && t.Before(windowStart) {
		// Far behind: the rest of the missed ticks are not counted one by one.
		t = spec.Next(windowStart.Add(-time.Nanosecond))
	}
	for !t.IsZero() && !t.After(now) && (endsAt == nil || !t.After(*endsAt)) {
		if len(ticks) == MaxTicksPerClaim {
			if policy == CatchUpAll {
				break
			}
			ticks = ticks[1:]
			missed++
		}
		ticks = append(ticks, t)
		t = spec.Next(t)
	}
	// t is now the first tick not sent: the next one.
	if !t.IsZero() && (endsAt == nil || !t.After(*endsAt)) {
		next = &t
	}
	return missed, ticks, next
}
