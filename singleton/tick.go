package singleton

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/pgcoord/pgcoord/internal/base"
	"github.com/pgcoord/pgcoord/internal/dbarg"
	"github.com/pgcoord/pgcoord/internal/dbsqlc"
	"github.com/pgcoord/pgcoord/pgcoord"
)

// Errors returned by this package. Driver errors are wrapped, so a *pgconn.PgError stays
// reachable with errors.As.
var (
	// ErrNoTick means there is no tick to run here: the current tick already ran, is
	// running with a live runner, or was skipped by the overlap policy (OverlapForbid while
	// an earlier run is still running).
	ErrNoTick = errors.New("singleton: no tick to run")
	// ErrLost means the run a call names (job + tick + token) is no longer current: it was
	// taken over by another replica after its lease expired, replaced by a newer run
	// (OverlapReplace), or already finished. A HeartbeatTick or FinishTick that returns it
	// changed nothing.
	ErrLost = errors.New("singleton: run lost")
	// ErrLockLost means RunSession's session-level lock is gone: its connection failed
	// while fn ran (the server releases the lock of a closed session), or the lock was not
	// held any more when fn returned.
	ErrLockLost = errors.New("singleton: session lock lost")
)

// Overlap says what a new tick does while an earlier run of the same job is still running
// (with a live lease), like a Kubernetes CronJob's concurrencyPolicy.
type Overlap string

// The overlap policies.
const (
	// OverlapAllow runs the new tick beside the earlier run.
	OverlapAllow Overlap = "allow"
	// OverlapForbid skips the new tick: it is recorded as "skipped" and never runs. It is
	// the default (the zero value means forbid).
	OverlapForbid Overlap = "forbid"
	// OverlapReplace marks the earlier run "replaced" (its heartbeats and finish then
	// fail with ErrLost, and RunTick cancels its function) and runs the new tick.
	OverlapReplace Overlap = "replace"
	// OverlapBuffer keeps the new tick waiting (a "pending" run) until the earlier run
	// finishes, then runs it; a further tick that comes meanwhile is skipped. Only
	// schedules stored as rows (package schedules) have it: a Job refuses it.
	OverlapBuffer Overlap = "buffer"
)

// Limits of a Job.
const (
	// MaxEvery is the longest schedule slot.
	MaxEvery = 366 * 24 * time.Hour
	// DefaultTTL is the lease of a running tick when Job.TTL is zero.
	DefaultTTL = 30 * time.Second
	// MinTTL and MaxTTL bound Job.TTL and the ttl of HeartbeatTick.
	MinTTL = time.Millisecond
	MaxTTL = 24 * time.Hour
	// MaxErrorLen is the longest error text FinishTick records, in bytes; longer texts
	// are cut.
	MaxErrorLen = 8192
)

// Job is a scheduled job: its name and schedule. Every replica that runs the job passes
// the same Job; each claim records the schedule in pgcoord_jobs.
type Job struct {
	// Name identifies the job (at most pgcoord.MaxNameLen bytes).
	Name string
	// Every is the length of a schedule slot; the ticks are the slot starts,
	// date_bin(Every, database now, Origin). It must be positive, a whole number of
	// microseconds (the database's precision) and at most MaxEvery.
	Every time.Duration
	// Origin aligns the slots: a tick falls on Origin + k*Every. Zero means the Unix epoch
	// (so Every = time.Hour ticks on the hour, in UTC); set it to, say, a Monday 09:00 in
	// your time zone with Every = 7*24*time.Hour for a weekly job. Fixed-length slots do
	// not follow daylight saving time.
	Origin time.Time
	// SyncCommit is the synchronous_commit level of each claim's commit, as
	// leases.AcquireOpts.SyncCommit: "on", "remote_write" or "remote_apply" make the claim
	// wait for the synchronous standbys, so a tick claimed before a failover is not run
	// again after it (see docs/failover.md). Default "": the server's setting.
	SyncCommit string
	// Overlap is the policy for a tick that comes while an earlier run is still running.
	// Empty means OverlapForbid.
	Overlap Overlap
	// TTL is the lease of a running tick, extended by heartbeats while it runs (RunTick
	// heartbeats every TTL/3): a runner that stops heartbeating for TTL is presumed dead
	// and another replica may take the tick over, while the tick's slot is current.
	// Default DefaultTTL (30s); at most MaxTTL. Keep it well below Every, or a tick whose
	// runner died is never taken over (see the package documentation).
	TTL time.Duration
}

// Run is one claim of a tick: the runner's grant, to pass to HeartbeatTick and FinishTick.
type Run struct {
	// Job is the job's name.
	Job string
	// ScheduledFor is the tick (the start of the slot), by the database clock.
	ScheduledFor time.Time
	// Token is the fence token of the run: higher than every earlier run's of the job
	// (tokens come from one counter shared by all of pgcoord's grants in the schema, so a
	// job's tokens increase but are not consecutive). Fence the run's writes with it, under the resource "job:"+Job (package fenced), so
	// a runner that was taken over cannot write after its successor.
	Token int64
	// Attempt is 1 for the first claim of a tick, 2 or more when this run took over a
	// tick whose runner stopped heartbeating.
	Attempt int
	// Holder identifies the runner.
	Holder string
	// StartedAt is when the run was claimed and ExpiresAt when its lease expires unless
	// heartbeated, by the database clock.
	StartedAt, ExpiresAt time.Time
}

// ClaimOpts are the options of ClaimTick. A nil *ClaimOpts means the defaults.
type ClaimOpts struct {
	// Holder identifies the runner. Default: a new identity, "host/pid/random".
	Holder string
}

var epoch = time.Unix(0, 0).UTC()

// normalize validates j and fills in its defaults. It runs no SQL.
func (j Job) normalize() (Job, error) {
	if err := check.Name("job", j.Name); err != nil {
		return j, err
	}
	if j.Every <= 0 || j.Every > MaxEvery {
		return j, check.Invalid("job %q: Every %v is outside (0, %v]", j.Name, j.Every, MaxEvery)
	}
	if j.Every%time.Microsecond != 0 {
		return j, check.Invalid("job %q: Every %v is not a whole number of microseconds", j.Name, j.Every)
	}
	if j.Origin.IsZero() {
		j.Origin = epoch
	}
	j.Origin = j.Origin.Truncate(time.Microsecond)
	switch j.Overlap {
	case "":
		j.Overlap = OverlapForbid
	case OverlapAllow, OverlapForbid, OverlapReplace:
	default:
		return j, check.Invalid("job %q: overlap policy %q: want %q, %q or %q", j.Name, j.Overlap, OverlapAllow, OverlapForbid, OverlapReplace)
	}
	if err := check.SyncCommit(j.SyncCommit); err != nil {
		return j, fmt.Errorf("singleton: job %q: %w", j.Name, err)
	}
	if j.TTL == 0 {
		j.TTL = DefaultTTL
	}
	if err := checkTTL(j.TTL); err != nil {
		return j, fmt.Errorf("singleton: job %q: %w", j.Name, err)
	}
	return j, nil
}

func checkTTL(ttl time.Duration) error {
	if ttl < MinTTL || ttl > MaxTTL {
		return check.Invalid("TTL %v is outside %v..%v", ttl, MinTTL, MaxTTL)
	}
	return nil
}

func holderOrNew(h string) (string, error) {
	if h == "" {
		return base.NewHolderID(), nil
	}
	if err := check.Name("holder", h); err != nil {
		return "", err
	}
	return h, nil
}

// ClaimTick claims the current tick of job — the slot date_bin(job.Every, now,
// job.Origin) of the database clock — for one runner, in one round trip, and returns the
// run, whose fence token is higher than every earlier run's of the job. It returns
// ErrNoTick if the tick needs no run here: it already ran, is running with a live runner
// (one whose lease has not expired), or was skipped by the overlap policy. A tick whose
// runner let its lease expire is taken over, as the next attempt. It also records the
// job's schedule (Every, Origin, Overlap) for ListJobs.
//
// Claims of one job are serialized by the database: of any number of concurrent claimers
// of a tick, exactly one gets the run. The run's lease lasts job.TTL: heartbeat it
// (HeartbeatTick) while working and record the outcome with FinishTick. RunTick does all
// of that.
//
// An invalid job (a bad name, Every, TTL, Overlap or SyncCommit; see Job), a bad holder or
// a nil db returns an error wrapping pgcoord.ErrInvalidName or pgcoord.ErrInvalidArgument
// before any SQL runs. On a standby it returns an error wrapping pgcoord.ErrReadOnly.
func ClaimTick(ctx context.Context, db pgcoord.DBTX, job Job, opts *ClaimOpts) (Run, error) {
	j, err := job.normalize()
	if err != nil {
		return Run{}, err
	}
	var o ClaimOpts
	if opts != nil {
		o = *opts
	}
	holder, err := holderOrNew(o.Holder)
	if err != nil {
		return Run{}, err
	}
	if err := check.DB(db); err != nil {
		return Run{}, err
	}
	run, _, err := claim(ctx, db, j, holder)
	return run, err
}

// claim claims the current tick of the normalized job j and also returns the database
// clock at the claim.
func claim(ctx context.Context, db pgcoord.DBTX, j Job, holder string) (Run, time.Time, error) {
	row, err := queries.ClaimTick(ctx, db, dbsqlc.ClaimTickParams{
		Job: j.Name, Every: dbarg.Interval(j.Every), Origin: j.Origin,
		Overlap: string(j.Overlap), Holder: holder, Ttl: dbarg.Interval(j.TTL), SyncCommit: j.SyncCommit,
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return Run{}, time.Time{}, fmt.Errorf("%w: job %q", ErrNoTick, j.Name)
	}
	if err != nil {
		return Run{}, time.Time{}, fmt.Errorf("singleton: claim %q: %w", j.Name, base.TranslateError(err))
	}
	return runOf(dbsqlc.PgcoordJobRun{
		Job: row.Job, ScheduledFor: row.ScheduledFor, FenceToken: row.FenceToken, Attempt: row.Attempt,
		Holder: row.Holder, StartedAt: row.StartedAt, ExpiresAt: row.ExpiresAt,
	}), row.DbNow, nil
}

// HeartbeatTick extends the lease of a running tick to ttl from now (by the database
// clock), in one round trip, and returns the run with its new ExpiresAt. It returns
// ErrLost, having changed nothing, if run is no longer current: taken over, replaced,
// finished — or expired, even if nobody took it over yet (a runner that let its lease
// lapse must not trust it again).
//
// The heartbeat commits asynchronously (synchronous_commit off for its transaction):
// losing one in a crash only shortens the lease. So do not pass a transaction that also
// carries other writes.
//
// A run no claim returned (a bad job name, a zero ScheduledFor, a token that is not
// positive), a ttl outside MinTTL..MaxTTL or a nil db returns an error wrapping
// pgcoord.ErrInvalidName or pgcoord.ErrInvalidArgument before any SQL runs.
func HeartbeatTick(ctx context.Context, db pgcoord.DBTX, run Run, ttl time.Duration) (Run, error) {
	if err := run.check(); err != nil {
		return Run{}, err
	}
	if err := checkTTL(ttl); err != nil {
		return Run{}, fmt.Errorf("singleton: heartbeat %q: %w", run.Job, base.TranslateError(err))
	}
	if err := check.DB(db); err != nil {
		return Run{}, err
	}
	next, _, err := heartbeat(ctx, db, run, ttl)
	return next, err
}

func heartbeat(ctx context.Context, db pgcoord.DBTX, run Run, ttl time.Duration) (Run, time.Time, error) {
	row, err := queries.HeartbeatTick(ctx, db, dbsqlc.HeartbeatTickParams{
		Job: run.Job, ScheduledFor: run.ScheduledFor, FenceToken: run.Token, Ttl: dbarg.Interval(ttl),
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return Run{}, time.Time{}, fmt.Errorf("%w: job %q tick %s token %d is no longer current",
			ErrLost, run.Job, run.ScheduledFor.UTC().Format(time.RFC3339Nano), run.Token)
	}
	if err != nil {
		return Run{}, time.Time{}, fmt.Errorf("singleton: heartbeat %q: %w", run.Job, base.TranslateError(err))
	}
	return runOf(dbsqlc.PgcoordJobRun{
		Job: row.Job, ScheduledFor: row.ScheduledFor, FenceToken: row.FenceToken, Attempt: row.Attempt,
		Holder: row.Holder, StartedAt: row.StartedAt, ExpiresAt: row.ExpiresAt,
	}), row.DbNow, nil
}

// FinishTick records the outcome of run, in one round trip: success when runErr is nil,
// failure otherwise, with runErr's text (cut to MaxErrorLen bytes) as the run's error.
// The job's summary (JobStatus: last success, last failure, consecutive failures) is
// updated in the same transaction. It returns ErrLost, having changed nothing, if run is
// no longer current (taken over, replaced or already finished). A run whose lease expired
// but that nobody took over can still be finished.
//
// A run no claim returned (a bad job name, a zero ScheduledFor, a token that is not
// positive) or a nil db returns an error wrapping pgcoord.ErrInvalidName or
// pgcoord.ErrInvalidArgument before any SQL runs.
func FinishTick(ctx context.Context, db pgcoord.DBTX, run Run, runErr error) error {
	if err := run.check(); err != nil {
		return err
	}
	if err := check.DB(db); err != nil {
		return err
	}
	var msg *string
	if runErr != nil {
		s := errorText(runErr)
		msg = &s
	}
	n, err := queries.FinishTick(ctx, db, dbsqlc.FinishTickParams{
		Job: run.Job, ScheduledFor: run.ScheduledFor, FenceToken: run.Token, Error: msg,
	})
	if err != nil {
		return fmt.Errorf("singleton: finish %q: %w", run.Job, base.TranslateError(err))
	}
	if n == 0 {
		return fmt.Errorf("%w: job %q tick %s token %d was not current at finish",
			ErrLost, run.Job, run.ScheduledFor.UTC().Format(time.RFC3339Nano), run.Token)
	}
	return nil
}

// errorText is err's text as Postgres text can hold it: valid UTF-8, no NUL byte, at most
// MaxErrorLen bytes, never empty.
func errorText(err error) string {
	s := strings.ReplaceAll(strings.ToValidUTF8(err.Error(), "\uFFFD"), "\x00", "")
	if len(s) > MaxErrorLen {
		cut := MaxErrorLen
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		s = s[:cut]
	}
	if s == "" {
		s = "error"
	}
	return s
}

// check refuses a Run that no claim returned, before any SQL runs: a bad job name (an
// error wrapping pgcoord.ErrInvalidName), no tick or a token that is not positive (an
// error wrapping pgcoord.ErrInvalidArgument).
func (r Run) check() error {
	if err := check.Name("job", r.Job); err != nil {
		return err
	}
	if r.ScheduledFor.IsZero() {
		return check.Invalid("run of %q has no tick (ScheduledFor is zero): pass the Run a claim returned", r.Job)
	}
	if r.Token < 1 {
		return check.Invalid("run of %q has token %d; tokens are positive: pass the Run a claim returned", r.Job, r.Token)
	}
	return nil
}

func runOf(r dbsqlc.PgcoordJobRun) Run {
	return Run{
		Job: r.Job, ScheduledFor: r.ScheduledFor, Token: r.FenceToken, Attempt: int(r.Attempt),
		Holder: r.Holder, StartedAt: r.StartedAt, ExpiresAt: dbarg.Deref(r.ExpiresAt),
	}
}

// slotOf returns the start of the slot containing t: date_bin(every, t, origin), computed
// in whole microseconds as the database does.
func slotOf(t time.Time, every time.Duration, origin time.Time) time.Time {
	e := every.Microseconds()
	d := t.UnixMicro() - origin.UnixMicro()
	k := d / e
	if d%e < 0 {
		k--
	}
	return time.UnixMicro(origin.UnixMicro() + k*e).In(t.Location())
}

var queries dbsqlc.Queries
