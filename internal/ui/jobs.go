package ui

import (
	"context"
	"net/url"
	"time"

	"github.com/pgcoord/pgcoord/singleton"
)

// Tick states in the strip beyond the ledger's own (succeeded, failed, running, skipped,
// replaced).
const (
	tickMissed  = "missed"  // a past slot no replica claimed
	tickPending = "pending" // the current slot, not claimed yet
)

type tick struct {
	At    time.Time
	State string
}

type jobRow struct {
	singleton.JobStatus
	Overdue, Failing bool
	// Status is failing, overdue or ok, as `pgcoord jobs check` says.
	Status string
	// Strip is the job's last stripTicks schedule slots, oldest first.
	Strip []tick
}

type jobsData struct {
	Rows         []jobRow
	After, Next  string
	Prefix       string     // filters the list (?prefix=)
	Detail       *jobDetail // the job asked for with ?job=
	MaxStaleness time.Duration
	StripTicks   int
}

func jobStatus(overdue, failing bool) string {
	switch {
	case failing:
		return "failing"
	case overdue:
		return "overdue"
	}
	return "ok"
}

// loadJobs reads one page of jobs, filtered by name prefix, and the recent ledger of each:
// 1 + jobsPageSize queries at most; and with ?job= the job's run history (job_detail.go).
func loadJobs(ctx context.Context, s *Server, q url.Values) (any, error) {
	d := jobsData{MaxStaleness: s.cfg.MaxStaleness, StripTicks: stripTicks}
	var err error
	if d.After, d.Prefix, err = pageParams(q); err != nil {
		return nil, err
	}
	jobs, next, err := listJobs(ctx, s, d.Prefix, d.After, jobsPageSize)
	if err != nil {
		return nil, err
	}
	d.Next = next
	for _, j := range jobs {
		runs, err := singleton.ListRuns(ctx, s.cfg.Pool, j.Name, &singleton.ListRunsOpts{Limit: stripTicks})
		if err != nil {
			return nil, err
		}
		d.Rows = append(d.Rows, s.jobRowOf(j, runs))
	}
	d.Detail, err = detail(q, "job", func(v string) (*jobDetail, error) { return loadJobDetail(ctx, s, v) })
	return d, err
}

// listJobs reads one page of jobs whose names start with prefix, and the next page's After.
func listJobs(ctx context.Context, s *Server, prefix, after string, limit int) ([]singleton.JobStatus, string, error) {
	jobs, err := singleton.ListJobs(ctx, s.cfg.Pool, &singleton.ListJobsOpts{After: after, Prefix: prefix, Limit: limit + 1})
	if err != nil {
		return nil, "", err
	}
	jobs, next := pageOf(jobs, limit, func(j singleton.JobStatus) string { return j.Name })
	return jobs, next, nil
}

func (s *Server) jobRowOf(j singleton.JobStatus, runs []singleton.RunInfo) jobRow {
	overdue, failing := j.Stale(s.cfg.MaxStaleness), j.Failing()
	return jobRow{JobStatus: j, Overdue: overdue, Failing: failing, Status: jobStatus(overdue, failing), Strip: strip(j, runs)}
}

// strip lays the job's recent runs on its schedule: one tick per slot, from the slot that
// contains DBNow back stripTicks slots (not before the first tick). A slot without a row
// is missed, or pending if it is the current one.
func strip(j singleton.JobStatus, runs []singleton.RunInfo) []tick {
	if j.Every <= 0 || j.NextTick.IsZero() {
		return nil
	}
	byTick := make(map[int64]string, len(runs))
	for _, r := range runs {
		byTick[r.ScheduledFor.UnixMicro()] = r.State
	}
	cur := j.NextTick.Add(-j.Every)
	var out []tick
	for i := stripTicks - 1; i >= 0; i-- {
		at := cur.Add(-time.Duration(i) * j.Every)
		if at.Before(j.FirstTick) {
			continue
		}
		state, ok := byTick[at.UnixMicro()]
		switch {
		case ok:
		case i == 0:
			state = tickPending
		default:
			state = tickMissed
		}
		out = append(out, tick{At: at, State: state})
	}
	return out
}

// summarizeJobs counts jobs and flags the overdue and failing ones from one bounded query.
func summarizeJobs(ctx context.Context, s *Server) ([]count, error) {
	jobs, err := singleton.ListJobs(ctx, s.cfg.Pool, &singleton.ListJobsOpts{Limit: summaryRows})
	if err != nil {
		return nil, err
	}
	more := len(jobs) == summaryRows
	var overdue, failing, running int
	for _, j := range jobs {
		o, f := j.Stale(s.cfg.MaxStaleness), j.Failing()
		running += j.Running
		switch {
		case f:
			failing++
		case o:
			overdue++
		}
	}
	return []count{{"jobs", len(jobs), more}, {"running", running, more}, {"overdue", overdue, more},
		{"failing", failing, more}}, nil
}
