package singleton

import (
	"context"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/pgcoord"
)

// DefaultDelay is the default of ScheduleOpts.Delay (for a job whose Every is at least
// ten times longer).
const DefaultDelay = 50 * time.Millisecond

// ScheduleOpts are the options of Schedule. A nil *ScheduleOpts means the defaults.
type ScheduleOpts struct {
	// Holder identifies this replica in the ledger. Default: a new identity per Schedule
	// call, "host/pid/random".
	Holder string
	// Logger receives failed runs (their errors are also recorded in the ledger), failed
	// claims and heartbeats. Default slog.Default().
	Logger *slog.Logger
	// Delay is how long after each slot boundary, by the database clock, this replica
	// claims the tick: it absorbs the error of the replica's estimate of the database
	// clock, so that the claim does not reach the database just before the boundary.
	// Default DefaultDelay (50ms), or a tenth of Every if that is shorter. It must be
	// shorter than Every.
	Delay time.Duration
	// CatchUp also claims the current tick when Schedule starts, if no replica has run it
	// yet: a tick whose boundary passed while no replica was running (every replica
	// restarting at once, say) then still runs, late. Off by default, because it also
	// makes a job that was never run before run at once, in the middle of its slot.
	CatchUp bool
	// Tracer, if set, traces each claim and run (see pgcoord.Tracer, RunTickOpts.Tracer).
	// Default nil: not traced.
	Tracer pgcoord.Tracer

	now func() time.Time // the local clock; tests skew it
}

// Timing of Schedule.
const (
	// remeasureTicks and remeasureAge say when Schedule measures the offset between the
	// database clock and the local clock again: after that many ticks or that long.
	remeasureTicks = 8
	remeasureAge   = time.Minute
	// maxSleep bounds one sleep: a longer wait is cut into sleeps of at most maxSleep,
	// with a new measurement of the offset between them, so a weekly job does not trust
	// one measurement (or a monotonic clock that stops while the machine is suspended)
	// for a week.
	maxSleep = time.Minute
	// minPoll is the shortest wait between two looks at a tick another replica runs.
	minPoll = 5 * time.Millisecond
	// maxBackoff bounds the wait between retries after an error.
	maxBackoff = 5 * time.Second
)

// Schedule runs job at every tick until ctx ends, then returns ctx's error. Run it on
// every replica: at each slot boundary every replica calls RunTick, and exactly one of
// them runs the tick (see ClaimTick); fn's errors are recorded in the ledger and logged,
// not returned.
//
// Ticks are timed by the database clock, never by the replica's own: Schedule measures
// the offset between the two (database now − local now, with DBNow, at the start and
// again every few ticks and every minute) and sleeps until the next slot boundary plus
// ScheduleOpts.Delay by that clock, so replicas whose clocks disagree by seconds still
// claim each tick just after its boundary. The replicas that did not get the tick watch
// it while its slot lasts: if its runner stops heartbeating (it crashed), one of them
// takes the tick over once the run's lease expires, as attempt 2. A tick is claimed
// only during its own slot: a replica still busy with an earlier tick when the next
// boundary passes leaves that tick to the others, and a boundary that passes while no
// replica runs Schedule is missed (see ScheduleOpts.CatchUp and JobStatus.MissedTicks).
//
// When ctx ends during a run, fn's context is cancelled too, and what fn then returns is
// recorded (a failure, unless fn finished its work anyway).
//
// It returns an error wrapping pgcoord.ErrInvalidName or pgcoord.ErrInvalidArgument,
// before any SQL runs, for an invalid job, a nil pool or fn, a bad holder or a Delay
// outside [0, Every).
func Schedule(ctx context.Context, pool *pgxpool.Pool, job Job, fn func(ctx context.Context, run Run) error, opts *ScheduleOpts) error {
	j, err := job.normalize()
	if err != nil {
		return err
	}
	if err := validateFn(j.Name, pool, fn == nil); err != nil {
		return err
	}
	var o ScheduleOpts
	if opts != nil {
		o = *opts
	}
	holder, err := holderOrNew(o.Holder)
	if err != nil {
		return err
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Delay == 0 {
		o.Delay = min(DefaultDelay, j.Every/10)
	}
	if o.Delay < 0 || o.Delay >= j.Every {
		return check.Invalid("job %q: Delay %v must be at least 0 and shorter than Every %v", j.Name, o.Delay, j.Every)
	}
	if o.now == nil {
		o.now = time.Now
	}
	s := &scheduler{
		pool: pool, job: j, fn: fn, holder: holder, delay: o.Delay, catchUp: o.CatchUp, now: o.now,
		log: o.Logger.With("job", j.Name, "holder", holder), tracer: o.Tracer,
	}
	return s.loop(ctx)
}

// scheduler is one replica's Schedule loop.
type scheduler struct {
	pool    *pgxpool.Pool
	job     Job
	fn      func(context.Context, Run) error
	holder  string
	log     *slog.Logger
	delay   time.Duration
	catchUp bool
	now     func() time.Time
	tracer  pgcoord.Tracer

	offset     time.Duration // database clock − local clock
	measuredAt time.Time     // when offset was measured (time.Now); zero: never
	ticks      int           // ticks since then
}

func (s *scheduler) loop(ctx context.Context) error {
	s.measure(ctx)
	if s.catchUp && ctx.Err() == nil {
		s.runSlot(ctx, slotOf(s.dbNow(), s.job.Every, s.job.Origin))
	}
	for ctx.Err() == nil {
		if s.ticks >= remeasureTicks || time.Since(s.measuredAt) >= remeasureAge {
			s.measure(ctx)
		}
		next := slotOf(s.dbNow(), s.job.Every, s.job.Origin).Add(s.job.Every)
		if err := s.sleepUntil(ctx, next.Add(s.delay)); err != nil {
			break
		}
		s.ticks++
		s.runSlot(ctx, next)
	}
	return ctx.Err()
}

// dbNow is the replica's estimate of the database clock.
func (s *scheduler) dbNow() time.Time { return s.now().Add(s.offset).Round(0) }

// measure estimates the offset of the database clock from the local clock: the best of a
// few round trips, taking the database's reading as made halfway through. On failure it
// keeps the previous estimate (and tries again before the next tick).
func (s *scheduler) measure(ctx context.Context) {
	best := time.Duration(-1)
	var offset time.Duration
	var lastErr error
	for range 3 {
		mctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		t0 := s.now()
		db, err := queries.DBNow(mctx, s.pool)
		t1 := s.now()
		cancel()
		if err != nil {
			lastErr = err
			continue
		}
		rtt := t1.Sub(t0)
		if best < 0 || rtt < best {
			best, offset = rtt, db.Sub(t0.Add(rtt/2))
		}
	}
	if best < 0 {
		if ctx.Err() == nil {
			s.log.Warn("pgcoord: could not read the database clock; keeping the previous estimate", "err", lastErr)
		}
		return
	}
	s.offset, s.measuredAt, s.ticks = offset, time.Now(), 0
}

// sleepUntil waits until the database clock (as estimated) reaches t, measuring the
// offset again between sleeps longer than maxSleep.
func (s *scheduler) sleepUntil(ctx context.Context, t time.Time) error {
	for {
		d := t.Sub(s.dbNow())
		if d <= 0 {
			return nil
		}
		long := d > maxSleep
		if long {
			d = maxSleep
		}
		if err := sleep(ctx, d); err != nil {
			return err
		}
		if long {
			s.measure(ctx)
		}
	}
}

// pause waits d, but not past end by the database clock.
func (s *scheduler) pause(ctx context.Context, d time.Duration, end time.Time) {
	_ = sleep(ctx, min(d, end.Sub(s.dbNow())))
}

func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// runSlot runs the tick of slot here, or watches it while another replica runs it and
// takes it over if that replica's lease expires, until the tick is done or its slot is
// over.
func (s *scheduler) runSlot(ctx context.Context, slot time.Time) {
	end := slot.Add(s.job.Every)
	claim := true
	retry, backoff := minPoll, minPoll
	for ctx.Err() == nil && s.dbNow().Before(end) {
		if claim {
			ran, err := runTick(ctx, s.pool, s.job, s.fn, s.holder, s.log, s.tracer)
			if ran {
				if err != nil {
					s.log.Error("pgcoord: job run failed", "tick", slot, "err", err)
				}
				return
			}
			if err != nil {
				s.log.Warn("pgcoord: could not claim a job tick; retrying while its slot lasts", "tick", slot, "err", err)
				s.pause(ctx, backoff, end)
				backoff = min(2*backoff, maxBackoff)
				continue
			}
		}
		runs, err := ListRuns(ctx, s.pool, s.job.Name, &ListRunsOpts{Before: end, Limit: 1})
		if err != nil {
			if ctx.Err() == nil {
				s.log.Warn("pgcoord: could not read a job tick; retrying while its slot lasts", "tick", slot, "err", err)
			}
			claim = false
			s.pause(ctx, backoff, end)
			backoff = min(2*backoff, maxBackoff)
			continue
		}
		switch {
		case len(runs) == 0 || runs[0].ScheduledFor.Before(slot):
			// The claim reached the database before the boundary by its clock: the
			// estimate of the offset is off. Measure again and retry.
			s.measure(ctx)
			claim = true
			s.pause(ctx, retry, end)
			retry = min(2*retry, maxBackoff)
		case runs[0].State != "running":
			return // succeeded, failed, skipped or replaced
		default:
			// Another replica runs the tick: look again when its lease would expire,
			// and take the tick over if it was not extended (its runner died).
			left := runs[0].ExpiresAt.Sub(s.dbNow())
			switch {
			case left > 0:
				claim = false
				s.pause(ctx, left+minPoll, end)
			case claim:
				// The claim just found the lease live while this replica thinks it
				// expired: the estimate of the offset is behind. Retry shortly.
				s.pause(ctx, retry, end)
				retry = min(2*retry, maxBackoff)
			default:
				claim = true
			}
		}
	}
}
