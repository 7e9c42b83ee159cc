package ui

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"time"

	"github.com/pgcoord/pgcoord/schedules"
	"github.com/pgcoord/pgcoord/singleton"
)

// nextTicksShown is how many fire times a schedule's page shows, as `pgcoord schedules get`.
const nextTicksShown = 5

// scheduleDetail is one schedule: its definition and state, its next fire times and the
// newest detailRows rows of its ledger.
type scheduleDetail struct {
	schedules.Info
	Next    []time.Time
	NextErr string // why the fire times could not be computed
	Runs    []scheduleRun
	Rows    int
}

// scheduleRun is a row of a schedule's ledger, with why it exists and how many ticks it
// stands for.
type scheduleRun struct {
	singleton.RunInfo
	Cause string // "schedule", "catch-up", "trigger" or "backfill"; "" if unknown
	Ticks int64  // the ticks a missed or skipped row stands for; 0 if unknown
	Took  time.Duration
}

// loadSchedule reads the schedule named by the path (schedules.Get), the newest
// detailRows rows of its ledger (singleton.ListRuns) and their causes and tick counts,
// which ListRuns lacks (one bounded statement of the ledger's primary key): three
// queries. An unknown name is a 404 that does not show the name.
func loadSchedule(ctx context.Context, s *Server, q url.Values) (any, error) {
	name, err := param(q, "name")
	if err != nil {
		return nil, err
	}
	info, err := schedules.Get(ctx, s.cfg.Pool, name)
	if errors.Is(err, schedules.ErrNotFound) {
		return nil, userErrorf(http.StatusNotFound, "no schedule of that name")
	}
	if err != nil {
		return nil, err
	}
	d := &scheduleDetail{Info: info, Rows: detailRows}
	if d.Next, err = schedules.NextTicks(info.Schedule, info.DBNow, nextTicksShown); err != nil {
		d.NextErr = err.Error()
	}
	runs, err := singleton.ListRuns(ctx, s.cfg.Pool, name, &singleton.ListRunsOpts{Limit: detailRows})
	if err != nil {
		return nil, err
	}
	causes, err := runCauses(ctx, s, name)
	if err != nil {
		return nil, err
	}
	for _, r := range runs {
		c := causes[r.ScheduledFor.UnixMicro()]
		sr := scheduleRun{RunInfo: r, Cause: c.cause, Ticks: c.ticks}
		if !r.FinishedAt.IsZero() {
			sr.Took = max(r.FinishedAt.Sub(r.StartedAt), 0)
		}
		d.Runs = append(d.Runs, sr)
	}
	return d, nil
}

type runCause struct {
	cause string
	ticks int64
}

// runCauses reads the cause and tick count of the newest detailRows rows of a schedule's
// ledger, by tick (in microseconds): the rows ListRuns returns, in the same order.
func runCauses(ctx context.Context, s *Server, name string) (map[int64]runCause, error) {
	rows, err := s.cfg.Pool.Query(ctx, `
		SELECT scheduled_for, cause, ticks FROM pgcoord_job_runs
		WHERE job = $1 ORDER BY scheduled_for DESC LIMIT $2`, name, detailRows)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := make(map[int64]runCause, detailRows)
	for rows.Next() {
		var at time.Time
		var c runCause
		if err := rows.Scan(&at, &c.cause, &c.ticks); err != nil {
			return nil, err
		}
		out[at.UnixMicro()] = c
	}
	return out, rows.Err()
}
