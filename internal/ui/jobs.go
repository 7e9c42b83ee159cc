package ui

import (
	"context"
	"net/url"
	"time"

	"github.com/pgcoord/pgcoord/singleton"
)

func init() {
	registerPage(page{rank: 20, path: "/jobs", title: "Jobs", tmpl: "jobs", summarize: summarizeJobs, load: loadJobs})
}

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

// loadJobs reads one page of jobs and the recent ledger of each: 1 + jobsPageSize queries
// at most.
func loadJobs(ctx context.Context, s *Server, q url.Values) (any, error) {
	after := q.Get("after")
	jobs, err := singleton.ListJobs(ctx, s.cfg.Pool, &singleton.ListJobsOpts{After: after, Limit: jobsPageSize + 1})
	if err != nil {
		return nil, err
	}
	d := jobsData{After: after, MaxStaleness: s.cfg.MaxStaleness, StripTicks: stripTicks}
	if len(jobs) > jobsPageSize {
		jobs = jobs[:jobsPageSize]
		d.Next = jobs[jobsPageSize-1].Name
	}
	for _, j := range jobs {
		runs, err := singleton.ListRuns(ctx, s.cfg.Pool, j.Name, &singleton.ListRunsOpts{Limit: stripTicks})
		if err != nil {
			return nil, err
		}
		overdue, failing := j.Stale(s.cfg.MaxStaleness), j.Failing()
		d.Rows = append(d.Rows, jobRow{JobStatus: j, Overdue: overdue, Failing: failing,
			Status: jobStatus(overdue, failing), Strip: strip(j, runs)})
	}
	return d, nil
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
func summarizeJobs(ctx context.Context, s *Server) summary {
	sum := summary{Name: "Jobs", Path: "/jobs"}
	jobs, err := singleton.ListJobs(ctx, s.cfg.Pool, &singleton.ListJobsOpts{Limit: summaryRows})
	if err != nil {
		sum.Err = err.Error()
		return sum
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
	sum.Counts = []count{{"jobs", len(jobs), more}, {"running", running, more}, {"overdue", overdue, more},
		{"failing", failing, more}}
	return sum
}
