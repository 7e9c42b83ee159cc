package schedules

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/pgcoord/pgcoord/internal/base"
	"github.com/pgcoord/pgcoord/internal/cronspec"
	"github.com/pgcoord/pgcoord/internal/dbarg"
	"github.com/pgcoord/pgcoord/internal/dbsqlc"
	"github.com/pgcoord/pgcoord/pgcoord"
	"github.com/pgcoord/pgcoord/singleton"
)

var (
	check   = base.Check("schedules")
	queries dbsqlc.Queries
)

// Errors returned by this package. Driver errors are wrapped, so a *pgconn.PgError stays
// reachable with errors.As.
var (
	// ErrNotFound means there is no schedule of that name.
	ErrNotFound = errors.New("schedules: no such schedule")
	// ErrExists means Create found the name taken, by a schedule or by a job of package
	// singleton.
	ErrExists = errors.New("schedules: a schedule or job of that name exists")
	// ErrChanged means Update was given a Version and the schedule has changed since.
	ErrChanged = errors.New("schedules: the schedule changed since it was read")
	// ErrUnknownZone is wrapped by the error for a zone that is not an IANA zone name.
	ErrUnknownZone = cronspec.ErrUnknownZone
)

// Overlap says what a tick does while an earlier run of its schedule is still running.
type Overlap = singleton.Overlap

// The overlap policies.
const (
	// OverlapSkip skips the new tick (recorded "skipped"). The default.
	OverlapSkip = singleton.OverlapForbid
	// OverlapBuffer keeps the new tick pending until the earlier run finishes, then runs
	// it; a further tick that comes meanwhile is skipped.
	OverlapBuffer = singleton.OverlapBuffer
	// OverlapAllow runs the new tick beside the earlier run.
	OverlapAllow = singleton.OverlapAllow
	// OverlapReplace marks the earlier run "replaced" (its context is cancelled at its
	// next heartbeat) and runs the new tick.
	OverlapReplace = singleton.OverlapReplace
)

// CatchUpPolicy says which due ticks within the catch-up window run after a schedule fell
// behind (every replica down, or paused by a busy database).
type CatchUpPolicy string

// The catch-up policies.
const (
	// CatchUpLatest runs the newest due tick only and records the others as skipped. The
	// default.
	CatchUpLatest CatchUpPolicy = "latest"
	// CatchUpAll runs each due tick, in order: the others wait for the run before them,
	// whatever the overlap policy.
	CatchUpAll CatchUpPolicy = "all"
)

// Limits and defaults of a Schedule.
const (
	// DefaultCatchUp is the catch-up window when Schedule.CatchUp is zero.
	DefaultCatchUp = time.Hour
	// MinCatchUp and MaxCatchUp bound Schedule.CatchUp.
	MinCatchUp = time.Second
	MaxCatchUp = 366 * 24 * time.Hour
	// MaxJitter bounds Schedule.Jitter, and MaxDeadline Schedule.Deadline.
	MaxJitter   = 24 * time.Hour
	MaxDeadline = 24 * time.Hour
	// MaxArgs is the largest Schedule.Args, in bytes.
	MaxArgs = 65536
	// MaxNoteLen is the longest pause note, in bytes.
	MaxNoteLen = 1000
	// MaxBackfill is the most ticks one Backfill records.
	MaxBackfill = 10000
	// DefaultZone is the zone of a Schedule with an empty Zone.
	DefaultZone = "UTC"
)

// Schedule is a schedule's definition: when its ticks are, and what runs them.
type Schedule struct {
	// Name identifies the schedule (1 to 255 bytes); it is also its job name in the
	// ledger (singleton.ListJobs, ListRuns, `pgcoord jobs`).
	Name string
	// Expr is the cron expression: five fields (minute hour day-of-month month
	// day-of-week), or six with a leading seconds field, or a descriptor (@hourly, @daily,
	// @weekly, @monthly, @yearly) or "@every <duration>" (see the package documentation).
	Expr string
	// Zone is the IANA time zone Expr is read in ("Europe/Berlin"). Default DefaultZone.
	Zone string
	// Handler names the function that runs the ticks: a Scheduler that registered it.
	Handler string
	// Args is the JSON the handler receives with each run (Run.Args). Default {}; at most
	// MaxArgs bytes.
	Args json.RawMessage
	// CatchUp is the catch-up window: a tick claimed more than CatchUp after it is due is
	// recorded as missed and not run. Default DefaultCatchUp; between MinCatchUp and
	// MaxCatchUp.
	CatchUp time.Duration
	// CatchUpPolicy says which due ticks within the window run. Default CatchUpLatest.
	CatchUpPolicy CatchUpPolicy
	// Overlap is the policy for a tick due while an earlier run still runs. Default
	// OverlapSkip.
	Overlap Overlap
	// Jitter spreads the ticks: each is claimed up to Jitter after it is due, by an amount
	// fixed by (Name, tick) so that every replica agrees. Default 0; at most MaxJitter.
	Jitter time.Duration
	// Deadline, if positive, bounds a run: at Deadline its context is cancelled and the
	// run is recorded as failed. Default 0: no deadline; at most MaxDeadline.
	Deadline time.Duration
	// StartsAt and EndsAt, if set, bound the ticks that run: none before StartsAt, none
	// after EndsAt. EndsAt must be after StartsAt.
	StartsAt, EndsAt time.Time
}

// Info is a stored schedule: its definition and its state.
type Info struct {
	Schedule
	// Version counts the changes of the definition (and pauses and resumes).
	Version int64
	// Paused is set while the schedule is paused, with when, by whom and why.
	Paused     bool
	PausedAt   time.Time
	PausedBy   string
	PausedNote string
	// NextTick is the next tick to run, and DueAt when it is claimed (NextTick plus its
	// jitter); both zero while a change is not applied yet, or when no tick is left.
	NextTick, DueAt time.Time
	// CreatedAt, UpdatedAt and UpdatedBy say when it was created and last changed, and by
	// whom.
	CreatedAt, UpdatedAt time.Time
	UpdatedBy            string
	// The outcomes of its runs, as in singleton.JobStatus.
	LastStartedAt, LastSuccessAt, LastFailureAt time.Time
	LastError                                   string
	ConsecutiveFailures                         int
	// Pending counts its runs waiting to start (state "pending"): buffered behind a
	// running one, queued by CatchUpAll, triggered, backfilled, or waiting for a process
	// with the handler.
	Pending int64
	// HandlerLive says whether a live process (a running Scheduler) has registered
	// Handler. While none has, due ticks are recorded pending, and missed once older
	// than CatchUp.
	HandlerLive bool
	// DBNow is the database clock when it was read.
	DBNow time.Time
}

// ChangeOpts are the options of the calls that change a schedule. A nil *ChangeOpts means
// the defaults.
type ChangeOpts struct {
	// Actor is who makes the change, recorded in the audit log (pgcoord_audit). Default:
	// the database session's user.
	Actor string
}

// UpdateOpts are the options of Update. A nil *UpdateOpts means the defaults.
type UpdateOpts struct {
	// Actor is as in ChangeOpts.
	Actor string
	// Version, if positive, makes Update change the schedule only if its version is still
	// this one (read by Get), else it returns ErrChanged.
	Version int64
}

// normalize fills in the defaults of s and checks it, before any SQL runs: it parses the
// expression in its zone (a *cronspec.ParseError for a bad one, wrapped with
// pgcoord.ErrInvalidArgument).
func (s Schedule) normalize() (Schedule, error) {
	if err := check.Name("schedule", s.Name); err != nil {
		return s, err
	}
	if err := check.Name("handler", s.Handler); err != nil {
		return s, err
	}
	if s.Zone == "" {
		s.Zone = DefaultZone
	}
	if _, err := cronspec.Parse(s.Expr, s.Zone, anchorTime(s.StartsAt)); err != nil {
		return s, check.Invalid("schedule %q: %w", s.Name, unprefixed{err})
	}
	if len(s.Args) == 0 {
		s.Args = json.RawMessage("{}")
	}
	if len(s.Args) > MaxArgs {
		return s, check.Invalid("schedule %q: args are %d bytes, more than %d", s.Name, len(s.Args), MaxArgs)
	}
	if !json.Valid(s.Args) {
		return s, check.Invalid("schedule %q: args are not valid JSON", s.Name)
	}
	if s.CatchUp == 0 {
		s.CatchUp = DefaultCatchUp
	}
	if s.CatchUp < MinCatchUp || s.CatchUp > MaxCatchUp {
		return s, check.Invalid("schedule %q: catch-up window %v is outside [%v, %v]", s.Name, s.CatchUp, MinCatchUp, MaxCatchUp)
	}
	switch s.CatchUpPolicy {
	case "":
		s.CatchUpPolicy = CatchUpLatest
	case CatchUpLatest, CatchUpAll:
	default:
		return s, check.Invalid("schedule %q: catch-up policy %q: want %q or %q", s.Name, s.CatchUpPolicy, CatchUpLatest, CatchUpAll)
	}
	switch s.Overlap {
	case "":
		s.Overlap = OverlapSkip
	case OverlapSkip, OverlapBuffer, OverlapAllow, OverlapReplace:
	default:
		return s, check.Invalid("schedule %q: overlap %q: want %q, %q, %q or %q", s.Name, s.Overlap,
			OverlapSkip, OverlapBuffer, OverlapAllow, OverlapReplace)
	}
	if s.Jitter < 0 || s.Jitter > MaxJitter {
		return s, check.Invalid("schedule %q: jitter %v is outside [0, %v]", s.Name, s.Jitter, MaxJitter)
	}
	if s.Deadline < 0 || s.Deadline > MaxDeadline {
		return s, check.Invalid("schedule %q: deadline %v is outside [0, %v]", s.Name, s.Deadline, MaxDeadline)
	}
	if !s.StartsAt.IsZero() && !s.EndsAt.IsZero() && !s.EndsAt.After(s.StartsAt) {
		return s, check.Invalid("schedule %q: end %s is not after start %s", s.Name,
			s.EndsAt.UTC().Format(time.RFC3339), s.StartsAt.UTC().Format(time.RFC3339))
	}
	return s, nil
}

// unprefixed is an error of internal/cronspec, whose text starts with this package's
// prefix too, without it: "schedules: schedule "x": bad expression ...", once.
type unprefixed struct{ err error }

func (e unprefixed) Error() string { return strings.TrimPrefix(e.err.Error(), "schedules: ") }
func (e unprefixed) Unwrap() error { return e.err }

// changeArgs checks the arguments every change of a named schedule takes, before any
// SQL runs, and returns the options (the defaults for nil).
func changeArgs(db pgcoord.DBTX, name string, opts *ChangeOpts) (ChangeOpts, error) {
	var o ChangeOpts
	if opts != nil {
		o = *opts
	}
	if err := check.DB(db); err != nil {
		return o, err
	}
	if err := check.Name("schedule", name); err != nil {
		return o, err
	}
	return o, checkActor(o.Actor)
}

func checkActor(actor string) error {
	if actor == "" {
		return nil
	}
	return check.Name("actor", actor)
}

func timeArg(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

// deadlineArg is a Deadline as the SQL API takes it: NULL for none.
func deadlineArg(d time.Duration) pgtype.Interval {
	if d == 0 {
		return pgtype.Interval{}
	}
	return dbarg.Interval(d)
}

// Create stores a new schedule and returns it, armed: its first tick is the first one
// after now (by the database clock), and not before StartsAt. Running Schedulers see it
// within a round trip. The change is audited.
//
// It returns an error wrapping pgcoord.ErrInvalidName or pgcoord.ErrInvalidArgument,
// before any SQL runs, for a bad definition (a bad expression's error is a
// *cronspec.ParseError naming the field and column; an unknown zone wraps
// ErrUnknownZone); ErrExists when the name is taken.
func Create(ctx context.Context, db pgcoord.DBTX, s Schedule, opts *ChangeOpts) (Info, error) {
	if err := check.DB(db); err != nil {
		return Info{}, err
	}
	s, err := s.normalize()
	if err != nil {
		return Info{}, err
	}
	var o ChangeOpts
	if opts != nil {
		o = *opts
	}
	if err := checkActor(o.Actor); err != nil {
		return Info{}, err
	}
	row, err := queries.ScheduleCreate(ctx, db, dbsqlc.ScheduleCreateParams{
		Name: s.Name, Expr: s.Expr, Zone: s.Zone, Handler: s.Handler, Args: s.Args,
		CatchUp: dbarg.Interval(s.CatchUp), CatchUpPolicy: string(s.CatchUpPolicy), Overlap: string(s.Overlap),
		Jitter: dbarg.Interval(s.Jitter), Deadline: deadlineArg(s.Deadline),
		StartsAt: timeArg(s.StartsAt), EndsAt: timeArg(s.EndsAt), Actor: o.Actor,
	})
	if err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "23505" {
			return Info{}, fmt.Errorf("%w: %q", ErrExists, s.Name)
		}
		return Info{}, fmt.Errorf("schedules: create %q: %w", s.Name, base.TranslateError(err))
	}
	if err := arm(ctx, db, row); err != nil {
		return Info{}, err
	}
	return Get(ctx, db, s.Name)
}

// Update replaces the definition of the schedule s.Name with s and returns it. The change
// applies from the first tick after it: a tick of the old definition not yet claimed never
// runs, and a claim made with the old definition changes nothing. Runs already running go
// on. The change is audited.
//
// It returns the errors of Create for a bad definition, ErrNotFound, and ErrChanged when
// opts.Version is set and the schedule changed since.
func Update(ctx context.Context, db pgcoord.DBTX, s Schedule, opts *UpdateOpts) (Info, error) {
	if err := check.DB(db); err != nil {
		return Info{}, err
	}
	s, err := s.normalize()
	if err != nil {
		return Info{}, err
	}
	var o UpdateOpts
	if opts != nil {
		o = *opts
	}
	if err := checkActor(o.Actor); err != nil {
		return Info{}, err
	}
	if o.Version < 0 {
		return Info{}, check.Invalid("schedule %q: version %d is negative", s.Name, o.Version)
	}
	var version *int64
	if o.Version > 0 {
		version = &o.Version
	}
	rows, err := queries.ScheduleUpdate(ctx, db, dbsqlc.ScheduleUpdateParams{
		Name: s.Name, Expr: s.Expr, Zone: s.Zone, Handler: s.Handler, Args: s.Args,
		CatchUp: dbarg.Interval(s.CatchUp), CatchUpPolicy: string(s.CatchUpPolicy), Overlap: string(s.Overlap),
		Jitter: dbarg.Interval(s.Jitter), Deadline: deadlineArg(s.Deadline),
		StartsAt: timeArg(s.StartsAt), EndsAt: timeArg(s.EndsAt), Version: version, Actor: o.Actor,
	})
	if err != nil {
		return Info{}, fmt.Errorf("schedules: update %q: %w", s.Name, base.TranslateError(err))
	}
	if len(rows) == 0 {
		if _, err := Get(ctx, db, s.Name); err != nil {
			return Info{}, err
		}
		return Info{}, fmt.Errorf("%w: %q is no longer version %d", ErrChanged, s.Name, o.Version)
	}
	if err := arm(ctx, db, rows[0]); err != nil {
		return Info{}, err
	}
	return Get(ctx, db, s.Name)
}

// Pause pauses a schedule and returns it: no tick runs while it is paused (runs already
// running go on). note (at most MaxNoteLen bytes) says why; pausing a paused schedule keeps
// the first pause's note. The change is audited. It returns ErrNotFound when there is no
// such schedule.
func Pause(ctx context.Context, db pgcoord.DBTX, name, note string, opts *ChangeOpts) (Info, error) {
	if len(note) > MaxNoteLen {
		return Info{}, check.Invalid("pause note is %d bytes, more than %d", len(note), MaxNoteLen)
	}
	o, err := changeArgs(db, name, opts)
	if err != nil {
		return Info{}, err
	}
	var n *string
	if note != "" {
		n = &note
	}
	rows, err := queries.SchedulePause(ctx, db, dbsqlc.SchedulePauseParams{Name: name, Note: n, Actor: o.Actor})
	if err != nil {
		return Info{}, fmt.Errorf("schedules: pause %q: %w", name, base.TranslateError(err))
	}
	if len(rows) == 0 {
		return Info{}, fmt.Errorf("%w: %q", ErrNotFound, name)
	}
	return Get(ctx, db, name)
}

// Resume resumes a paused schedule and returns it: its next tick is the first one after
// now; the ticks that came while it was paused do not run. Resuming a schedule that is not
// paused changes nothing. The change is audited. It returns ErrNotFound when there is no
// such schedule.
func Resume(ctx context.Context, db pgcoord.DBTX, name string, opts *ChangeOpts) (Info, error) {
	o, err := changeArgs(db, name, opts)
	if err != nil {
		return Info{}, err
	}
	rows, err := queries.ScheduleResume(ctx, db, dbsqlc.ScheduleResumeParams{Name: name, Actor: o.Actor})
	if err != nil {
		return Info{}, fmt.Errorf("schedules: resume %q: %w", name, base.TranslateError(err))
	}
	if len(rows) == 0 {
		return Info{}, fmt.Errorf("%w: %q", ErrNotFound, name)
	}
	if err := arm(ctx, db, rows[0]); err != nil {
		return Info{}, err
	}
	return Get(ctx, db, name)
}

// Delete deletes a schedule with its run history. A run still running loses its run (its
// heartbeats and finish fail with singleton.ErrLost). The change is audited. It returns
// ErrNotFound when there is no such schedule.
func Delete(ctx context.Context, db pgcoord.DBTX, name string, opts *ChangeOpts) error {
	o, err := changeArgs(db, name, opts)
	if err != nil {
		return err
	}
	ok, err := queries.ScheduleDelete(ctx, db, dbsqlc.ScheduleDeleteParams{Name: name, Actor: o.Actor})
	if err != nil {
		return fmt.Errorf("schedules: delete %q: %w", name, base.TranslateError(err))
	}
	if !ok {
		return fmt.Errorf("%w: %q", ErrNotFound, name)
	}
	return nil
}

// Get returns a schedule. It returns ErrNotFound when there is none.
func Get(ctx context.Context, db pgcoord.DBTX, name string) (Info, error) {
	if err := check.DB(db); err != nil {
		return Info{}, err
	}
	if err := check.Name("schedule", name); err != nil {
		return Info{}, err
	}
	rows, err := queries.ScheduleGet(ctx, db, name)
	if err != nil {
		return Info{}, fmt.Errorf("schedules: get %q: %w", name, err)
	}
	if len(rows) == 0 {
		return Info{}, fmt.Errorf("%w: %q", ErrNotFound, name)
	}
	return infoOf(dbsqlc.ScheduleListRow(rows[0])), nil
}

// ListOpts are the options of List. A nil *ListOpts lists the first DefaultListLimit
// schedules in name order.
type ListOpts struct {
	// After lists the schedules whose name sorts after it: pass the last name of one page
	// to get the next.
	After string
	// Limit caps the number returned. Default DefaultListLimit; at most MaxListLimit.
	Limit int
	// Prefix, if set, lists only the schedules whose name starts with it.
	Prefix string
}

// DefaultListLimit and MaxListLimit bound one page of List.
const (
	DefaultListLimit = pgcoord.DefaultListLimit
	MaxListLimit     = pgcoord.MaxListLimit
)

// List returns the schedules in name order, one page at a time, never nil.
func List(ctx context.Context, db pgcoord.DBTX, opts *ListOpts) ([]Info, error) {
	if err := check.DB(db); err != nil {
		return nil, err
	}
	var o ListOpts
	if opts != nil {
		o = *opts
	}
	limit, err := check.ListLimit(o.Limit)
	if err != nil {
		return nil, fmt.Errorf("schedules: %w", err)
	}
	if o.Prefix != "" {
		if err := check.Name("prefix of a schedule", o.Prefix); err != nil {
			return nil, err
		}
	}
	rows, err := queries.ScheduleList(ctx, db, dbsqlc.ScheduleListParams{After: o.After, Prefix: o.Prefix, MaxRows: limit})
	if err != nil {
		return nil, fmt.Errorf("schedules: list: %w", err)
	}
	out := make([]Info, 0, len(rows))
	for _, r := range rows {
		out = append(out, infoOf(r))
	}
	return out, nil
}

func infoOf(r dbsqlc.ScheduleListRow) Info {
	return Info{
		Schedule: Schedule{
			Name: r.Name, Expr: r.Expr, Zone: r.Zone, Handler: r.Handler, Args: r.Args,
			CatchUp: dbarg.Duration(r.CatchUp), CatchUpPolicy: CatchUpPolicy(r.CatchUpPolicy), Overlap: Overlap(r.Overlap),
			Jitter: dbarg.Duration(r.Jitter), Deadline: dbarg.Duration(r.Deadline),
			StartsAt: dbarg.Deref(r.StartsAt), EndsAt: dbarg.Deref(r.EndsAt),
		},
		Version: r.Version, Paused: r.PausedAt != nil, PausedAt: dbarg.Deref(r.PausedAt),
		PausedBy: dbarg.Deref(r.PausedBy), PausedNote: dbarg.Deref(r.PausedNote),
		NextTick: dbarg.Deref(r.NextAt), DueAt: dbarg.Deref(r.DueAt),
		CreatedAt: r.CreatedAt, UpdatedAt: r.UpdatedAt, UpdatedBy: r.UpdatedBy,
		LastStartedAt: dbarg.Deref(r.LastStartedAt), LastSuccessAt: dbarg.Deref(r.LastSuccessAt),
		LastFailureAt: dbarg.Deref(r.LastFailureAt), LastError: dbarg.Deref(r.LastError),
		ConsecutiveFailures: int(r.ConsecutiveFailures), Pending: r.Pending, HandlerLive: r.HandlerLive, DBNow: r.DbNow,
	}
}

// NextTicks returns the first n (at most 1000) ticks of s after t, ascending; fewer when
// the schedule ends (EndsAt, or an expression that fires no more within five years).
func NextTicks(s Schedule, t time.Time, n int) ([]time.Time, error) {
	if n < 0 || n > 1000 {
		return nil, check.Invalid("next ticks: n %d is outside [0, 1000]", n)
	}
	s, err := s.normalize()
	if err != nil {
		return nil, err
	}
	spec, err := cronspec.Parse(s.Expr, s.Zone, anchorTime(s.StartsAt))
	if err != nil {
		return nil, check.Invalid("schedule %q: %w", s.Name, unprefixed{err})
	}
	if !s.StartsAt.IsZero() && t.Before(s.StartsAt) {
		t = s.StartsAt.Add(-time.Nanosecond)
	}
	out := make([]time.Time, 0, n)
	for len(out) < n {
		t = spec.Next(t)
		if t.IsZero() || !s.EndsAt.IsZero() && t.After(s.EndsAt) {
			break
		}
		out = append(out, t)
	}
	return out, nil
}

// arm sets the next tick of a schedule a change left unarmed, computed from its
// expression; another process may have armed it first, which is the same.
func arm(ctx context.Context, db pgcoord.DBTX, r dbsqlc.PgcoordSchedule) error {
	if r.ArmFrom == nil {
		return nil
	}
	next, err := firstTick(r.Expr, r.Zone, *r.ArmFrom, r.StartsAt, r.EndsAt)
	if err != nil {
		return err
	}
	if _, err := queries.ScheduleArm(ctx, db, dbsqlc.ScheduleArmParams{Name: r.Name, Version: r.Version, Next: next}); err != nil {
		return fmt.Errorf("schedules: arm %q: %w", r.Name, base.TranslateError(err))
	}
	return nil
}

// firstTick is the first tick of an expression after from, and not before startsAt; nil
// when there is none (before endsAt).
func firstTick(expr, zone string, from time.Time, startsAt, endsAt *time.Time) (*time.Time, error) {
	spec, err := cronspec.Parse(expr, zone, anchorTime(dbarg.Deref(startsAt)))
	if err != nil {
		return nil, fmt.Errorf("schedules: stored expression %q: %w", expr, err)
	}
	if startsAt != nil && from.Before(*startsAt) {
		from = startsAt.Add(-time.Nanosecond)
	}
	next := spec.Next(from)
	if next.IsZero() || endsAt != nil && next.After(*endsAt) {
		return nil, nil
	}
	return &next, nil
}

// RunInfo is a run of a schedule, as the ledger records it.
type RunInfo struct {
	// Schedule, Tick and Cause are as in Run; State is "pending", "running", "succeeded",
	// "failed", "skipped", "replaced" or "missed".
	Schedule string
	Tick     time.Time
	Cause    string
	State    string
	// Ticks is how many ticks a "missed" or "skipped" row stands for (else 1).
	Ticks int64
	// Note is the row's error or reason, if any.
	Note string
}

// Trigger asks for a run of a schedule now, beside its scheduled ones: a pending run (Cause
// "trigger") for the database's now, started by a Scheduler with the handler as soon as
// no run of the schedule is running (whatever the overlap policy). The change is audited. It returns ErrNotFound when there is
// no such schedule.
func Trigger(ctx context.Context, db pgcoord.DBTX, name string, opts *ChangeOpts) (RunInfo, error) {
	o, err := changeArgs(db, name, opts)
	if err != nil {
		return RunInfo{}, err
	}
	rows, err := queries.ScheduleTrigger(ctx, db, dbsqlc.ScheduleTriggerParams{Name: name, Actor: o.Actor})
	if err != nil {
		return RunInfo{}, fmt.Errorf("schedules: trigger %q: %w", name, base.TranslateError(err))
	}
	if len(rows) == 0 {
		return RunInfo{}, fmt.Errorf("%w: %q", ErrNotFound, name)
	}
	r := rows[0]
	return RunInfo{Schedule: r.Job, Tick: r.ScheduledFor, Cause: r.Cause, State: r.State, Ticks: r.Ticks, Note: dbarg.Deref(r.Error)}, nil
}

// Backfill records the ticks of a schedule from from through to (both included; to not
// after now) as pending runs (Cause "backfill"), which Schedulers with the handler run in
// tick order, one at a time. A tick that has a run already (of any state) is left as it
// is, so a backfill can be repeated, or resumed after it was interrupted: each tick runs
// once. It returns how many runs it recorded. The change is audited.
//
// It returns an error wrapping pgcoord.ErrInvalidArgument, before any SQL runs, for a range
// with more than MaxBackfill ticks or none, or to before from; ErrNotFound when there is no
// such schedule.
func Backfill(ctx context.Context, db pgcoord.DBTX, name string, from, to time.Time, opts *ChangeOpts) (int64, error) {
	o, err := changeArgs(db, name, opts)
	if err != nil {
		return 0, err
	}
	if from.IsZero() || to.IsZero() || to.Before(from) {
		return 0, check.Invalid("backfill of %q: the range %s to %s is empty", name,
			from.UTC().Format(time.RFC3339), to.UTC().Format(time.RFC3339))
	}
	info, err := Get(ctx, db, name)
	if err != nil {
		return 0, err
	}
	spec, err := cronspec.Parse(info.Expr, info.Zone, anchorTime(info.StartsAt))
	if err != nil {
		return 0, fmt.Errorf("schedules: stored expression of %q: %w", name, err)
	}
	ticks := spec.Between(nil, from.Add(-time.Nanosecond), to, MaxBackfill+1)
	if len(ticks) == 0 {
		return 0, check.Invalid("backfill of %q: no tick from %s to %s", name, from.UTC().Format(time.RFC3339), to.UTC().Format(time.RFC3339))
	}
	if len(ticks) > MaxBackfill {
		return 0, check.Invalid("backfill of %q: more than %d ticks from %s to %s", name, MaxBackfill,
			from.UTC().Format(time.RFC3339), to.UTC().Format(time.RFC3339))
	}
	n, err := queries.ScheduleBackfill(ctx, db, dbsqlc.ScheduleBackfillParams{Name: name, Ticks: ticks, Actor: o.Actor})
	if err != nil {
		return 0, fmt.Errorf("schedules: backfill %q: %w", name, base.TranslateError(err))
	}
	return n, nil
}

// anchorTime is the origin of @every ticks: the schedule's start, or the Unix epoch.
func anchorTime(startsAt time.Time) time.Time {
	if startsAt.IsZero() {
		return time.Unix(0, 0).UTC()
	}
	return startsAt
}
