package ui

import (
	"context"
	"time"

	"github.com/pgcoord/pgcoord/singleton"
)

// jobDetail is one job with its run history: the newest detailRows rows of its ledger.
type jobDetail struct {
	Name    string
	Job     *jobRow // nil: no such job in the ledger
	Missing string
	Runs    []runRow
	// Outcomes counts the listed rows by state, in the order of the legend.
	Outcomes []outcome
	Rows     int
}

type runRow struct {
	singleton.RunInfo
	Took time.Duration // from claim to finish (0 while running)
}

type outcome struct {
	State string
	N     int
}

// loadJobDetail reads the job's status (singleton.ListJobs with its name as the prefix:
// the job sorts first among the names it starts) and the newest detailRows rows of its
// ledger (singleton.ListRuns): two queries.
func loadJobDetail(ctx context.Context, s *Server, name string) (*jobDetail, error) {
	d := &jobDetail{Name: name, Rows: detailRows}
	jobs, _, err := listJobs(ctx, s, name, "", 1)
	if err != nil {
		return nil, err
	}
	if len(jobs) == 0 || jobs[0].Name != name {
		// A link's text is not shown back (it could say anything): only known names are.
		d.Name, d.Missing = "", "no job of that name in the ledger"
		return d, nil
	}
	runs, err := singleton.ListRuns(ctx, s.cfg.Pool, name, &singleton.ListRunsOpts{Limit: detailRows})
	if err != nil {
		return nil, err
	}
	row := s.jobRowOf(jobs[0], runs)
	d.Job = &row
	counts := map[string]int{}
	for _, r := range runs {
		rr := runRow{RunInfo: r}
		if !r.FinishedAt.IsZero() {
			rr.Took = max(r.FinishedAt.Sub(r.StartedAt), 0)
		}
		d.Runs = append(d.Runs, rr)
		counts[r.State]++
	}
	for _, st := range []string{"succeeded", "failed", "running", "skipped", "replaced"} {
		d.Outcomes = append(d.Outcomes, outcome{State: st, N: counts[st]})
	}
	return d, nil
}
