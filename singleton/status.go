package singleton

import (
	"context"
	"fmt"
	"time"

	"github.com/pgcoord/pgcoord/internal/dbarg"
	"github.com/pgcoord/pgcoord/internal/dbsqlc"
	"github.com/pgcoord/pgcoord/pgcoord"
)

// JobStatus is the state of a scheduled job as operators and probes see it: its schedule,
// its last outcomes and whether ticks were missed. Times are by the database clock; a zero
// time means "never".
type JobStatus struct {
	// Kind is "interval" for a job of Schedule or RunTick (fixed slots, Every and Origin)
	// and "cron" for a schedule stored as a row (package schedules: a cron expression in
	// a zone; Every and Origin are zero).
	Kind string
	// Cron is a schedule's expression and zone, "0 9 * * MON-FRI (Europe/Berlin)"; empty
	// for Kind "interval".
	Cron string
	// Name, Every, Origin and Overlap are the job's schedule as last claimed.
	Name    string
	Every   time.Duration
	Origin  time.Time
	Overlap Overlap
	// Token is the fence token of the job's latest run.
	Token int64
	// LastStartedAt is when the latest run was claimed; LastSuccessAt and LastFailureAt
	// when the latest successful and failed runs finished.
	LastStartedAt, LastSuccessAt, LastFailureAt time.Time
	// LastError is the error of the latest failed run, kept after later successes.
	LastError string
	// ConsecutiveFailures counts the runs that failed since the last success.
	ConsecutiveFailures int
	// LastState is the state of the job's newest tick that was not skipped or pending:
	// "running", "succeeded", "failed", "replaced" or (a schedule's tick older than its
	// catch-up window) "missed"; "" if there is none.
	LastState string
	// Running counts the job's runs whose lease is live (running and not expired).
	Running int
	// MissedTicks counts the slots from FirstTick through the current slot (the one that
	// contains DBNow) that have no row in the ledger: ticks no replica claimed. The
	// current slot counts until a replica claims it, so just after a boundary — before
	// the first replica's timer fires, ScheduleOpts.Delay later — it is one higher than in
	// steady state: alert on an increase that persists, or on Overdue. It is 0 for a job
	// whose schedule (Every, Origin) changed since its first tick only if the ticks line up
	// with the new schedule; treat it as an estimate then. For a schedule (Kind "cron") it
	// is the number of ticks recorded as missed.
	MissedTicks int64
	// NextTick is the next slot boundary after DBNow; for a schedule, its next tick to
	// claim (zero when it has none left, or a change has not been applied yet).
	NextTick time.Time
	// FirstTick is the job's oldest tick in the ledger.
	FirstTick time.Time
	// DBNow is the database clock when the status was read.
	DBNow time.Time
}

// Overdue reports whether the job needs attention: it is Failing or Stale. A job that runs
// zero times is a failure too, and this is how it shows: pick maxStaleness longer than a
// run takes, plus the delay a claim may have after the boundary.
func (s JobStatus) Overdue(maxStaleness time.Duration) bool {
	return s.Failing() || s.Stale(maxStaleness)
}

// Failing reports whether the job's last run to finish failed, or its newest tick was
// missed.
func (s JobStatus) Failing() bool {
	return s.ConsecutiveFailures > 0 || s.LastState == "failed" || s.LastState == "missed"
}

// Stale reports whether the job has not succeeded within Every plus maxStaleness of DBNow,
// counting from its last success, or from its first tick if it never succeeded. A schedule
// (Kind "cron") is stale when its next tick is more than maxStaleness past and still not
// claimed, or it has run and its newest run is not a success after maxStaleness.
func (s JobStatus) Stale(maxStaleness time.Duration) bool {
	if s.Kind == "cron" {
		now := s.DBNow
		if now.IsZero() {
			now = time.Now()
		}
		return !s.NextTick.IsZero() && now.After(s.NextTick.Add(maxStaleness)) ||
			!s.LastStartedAt.IsZero() && s.LastState != "succeeded" && s.LastState != "running" &&
				now.After(s.LastStartedAt.Add(maxStaleness))
	}
	since := s.LastSuccessAt
	if since.IsZero() {
		since = s.FirstTick
	}
	if since.IsZero() {
		return true // no tick at all
	}
	now := s.DBNow
	if now.IsZero() {
		now = time.Now()
	}
	return now.After(since.Add(s.Every).Add(maxStaleness))
}

// ListJobsOpts are the options of ListJobs. A nil *ListJobsOpts lists the first
// DefaultListLimit jobs in name order.
type ListJobsOpts struct {
	// After lists the jobs whose name sorts after it: pass the last name of one page to
	// get the next.
	After string
	// Limit caps the number of jobs returned. Default DefaultListLimit; at most
	// MaxListLimit.
	Limit int
	// Prefix, if set, lists only the jobs whose name starts with it, character for
	// character ('%' and '_' are plain characters). At most 255 bytes, as a name.
	Prefix string
}

// DefaultListLimit and MaxListLimit bound one page of ListJobs and ListRuns.
const (
	DefaultListLimit = pgcoord.DefaultListLimit
	MaxListLimit     = pgcoord.MaxListLimit
)

// ListJobs returns the status of the jobs recorded in the ledger (every job that was
// claimed at least once), in name order, one page at a time (see ListJobsOpts.After),
// never nil.
func ListJobs(ctx context.Context, db pgcoord.DBTX, opts *ListJobsOpts) ([]JobStatus, error) {
	if err := check.DB(db); err != nil {
		return nil, err
	}
	var o ListJobsOpts
	if opts != nil {
		o = *opts
	}
	limit, err := check.ListLimit(o.Limit)
	if err != nil {
		return nil, fmt.Errorf("singleton: %w", err)
	}
	if o.Prefix != "" {
		if err := check.Name("prefix of a job", o.Prefix); err != nil {
			return nil, err
		}
	}
	rows, err := queries.ListJobs(ctx, db, dbsqlc.ListJobsParams{After: o.After, Prefix: o.Prefix, MaxRows: limit})
	if err != nil {
		return nil, fmt.Errorf("singleton: list jobs: %w", err)
	}
	out := make([]JobStatus, 0, len(rows))
	for _, r := range rows {
		out = append(out, statusOf(r))
	}
	return out, nil
}

func statusOf(r dbsqlc.ListJobsRow) JobStatus {
	s := JobStatus{
		Kind: r.Kind, Cron: r.ScheduleExpr, Name: r.Name, Every: dbarg.Duration(r.Every), Origin: dbarg.Deref(r.Origin), Overlap: Overlap(r.Overlap),
		Token:         r.FenceToken,
		LastStartedAt: dbarg.Deref(r.LastStartedAt), LastSuccessAt: dbarg.Deref(r.LastSuccessAt), LastFailureAt: dbarg.Deref(r.LastFailureAt),
		LastError: dbarg.Deref(r.LastError), ConsecutiveFailures: int(r.ConsecutiveFailures),
		LastState: r.LastState, Running: int(r.Running), FirstTick: r.FirstTick, DBNow: r.DbNow,
	}
	if r.Kind == "cron" {
		s.MissedTicks, s.NextTick = r.TicksMissed, dbarg.Deref(r.ScheduleNextAt)
		return s
	}
	s.MissedTicks, s.NextTick = missedTicks(s.Every, s.Origin, s.FirstTick, s.DBNow, r.TicksRecorded)
	return s
}

// missedTicks returns the number of slots from first through the slot containing now that
// have no row (recorded rows in all), and the next slot boundary after now.
func missedTicks(every time.Duration, origin, first, now time.Time, recorded int64) (int64, time.Time) {
	if every < time.Microsecond {
		return 0, time.Time{}
	}
	cur := slotOf(now, every, origin)
	next := cur.Add(every)
	if first.IsZero() || first.After(cur) {
		return 0, next
	}
	slots := (cur.UnixMicro()-first.UnixMicro())/every.Microseconds() + 1
	return max(0, slots-recorded), next
}

// RunInfo is one row of a job's ledger: a run, or a skipped tick.
type RunInfo struct {
	Run
	// State is "running", "succeeded", "failed", "skipped" (OverlapForbid) or "replaced"
	// (OverlapReplace). A running row whose ExpiresAt has passed was abandoned by its
	// runner; it is taken over only while its slot is current.
	State string
	// FinishedAt is when the run finished, was replaced or was skipped; zero while running.
	FinishedAt time.Time
	// Error is the failed run's error, or why the tick was skipped or replaced.
	Error string
}

// ListRunsOpts are the options of ListRuns. A nil *ListRunsOpts lists the newest
// DefaultListLimit rows.
type ListRunsOpts struct {
	// Before lists the rows whose tick is before it: pass the ScheduledFor of the last row
	// of one page to get the next. Zero means no bound.
	Before time.Time
	// Limit caps the number of rows returned. Default DefaultListLimit; at most
	// MaxListLimit.
	Limit int
}

// ListRuns returns the ledger of job, newest tick first, one page at a time (see
// ListRunsOpts.Before), never nil; empty for a job that never ran.
func ListRuns(ctx context.Context, db pgcoord.DBTX, job string, opts *ListRunsOpts) ([]RunInfo, error) {
	if err := check.Name("job", job); err != nil {
		return nil, err
	}
	if err := check.DB(db); err != nil {
		return nil, err
	}
	var o ListRunsOpts
	if opts != nil {
		o = *opts
	}
	limit, err := check.ListLimit(o.Limit)
	if err != nil {
		return nil, fmt.Errorf("singleton: %w", err)
	}
	var before *time.Time
	if !o.Before.IsZero() {
		before = &o.Before
	}
	rows, err := queries.ListRuns(ctx, db, dbsqlc.ListRunsParams{Job: job, Before: before, MaxRows: limit})
	if err != nil {
		return nil, fmt.Errorf("singleton: list runs of %q: %w", job, err)
	}
	out := make([]RunInfo, 0, len(rows))
	for _, r := range rows {
		out = append(out, RunInfo{Run: runOf(r), State: r.State, FinishedAt: dbarg.Deref(r.FinishedAt), Error: dbarg.Deref(r.Error)})
	}
	return out, nil
}
