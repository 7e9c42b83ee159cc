package cli

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/pgcoord/pgcoord/internal/page"
	"github.com/pgcoord/pgcoord/singleton"
)

// Job statuses as `jobs list` and `jobs check` print them.
const (
	jobOK      = "ok"      // succeeded recently enough, last run did not fail
	jobOverdue = "overdue" // no success within Every + --max-staleness
	jobFailing = "failing" // its last run failed
)

// defaultMaxStaleness is the default of --max-staleness.
const defaultMaxStaleness = 5 * time.Minute

func (a *app) jobsCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "jobs",
		Short: "Inspect scheduled jobs (cron singletons): status, overdue check, run history",
		Long: `Inspect the jobs scheduled with package singleton's ledger (Schedule, RunTick, ClaimTick):
their schedule, last success and failure, missed ticks, and the history of their runs.
'jobs check' is the probe for monitoring: it exits 3 when a job is overdue or failing —
a cron that silently stopped running is a failure too.`,
		Args: noSubcommand,
		RunE: func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	cmd.AddCommand(a.jobsListCommand(), a.jobsCheckCommand(), a.jobsRunsCommand())
	return cmd
}

// jobHealth is the verdict on one job.
type jobHealth struct {
	status   string   // jobOK, jobOverdue or jobFailing
	overdue  bool     // no success within Every + max staleness
	failing  bool     // the last run failed
	problems []string // why, for people
}

// judgeJob applies the check of `jobs check` to s: failing when its last run failed (or
// the runs since the last success all failed), overdue by singleton's Overdue ignoring
// failures.
func judgeJob(s singleton.JobStatus, maxStaleness time.Duration) jobHealth {
	var h jobHealth
	h.failing = s.Failing()
	h.overdue = s.Stale(maxStaleness)
	if h.failing {
		msg := "last run failed"
		if !s.LastFailureAt.IsZero() {
			msg += fmt.Sprintf(" %s ago (%s)", age(s.LastFailureAt, s.DBNow), preciseTime(s.LastFailureAt))
		}
		if s.ConsecutiveFailures > 1 {
			msg += fmt.Sprintf(", %d failures in a row", s.ConsecutiveFailures)
		}
		if s.LastError != "" {
			msg += ": " + oneLine(s.LastError, 200)
		}
		h.problems = append(h.problems, msg)
	}
	if h.overdue {
		var msg string
		switch {
		case !s.LastSuccessAt.IsZero():
			msg = fmt.Sprintf("no success for %s (last at %s)", age(s.LastSuccessAt, s.DBNow), preciseTime(s.LastSuccessAt))
		case !s.FirstTick.IsZero():
			msg = fmt.Sprintf("never succeeded; first tick %s ago (%s)", age(s.FirstTick, s.DBNow), preciseTime(s.FirstTick))
		default:
			msg = "never succeeded"
		}
		when := "every " + jobSchedule(s)
		if s.Cron != "" {
			when = "on " + s.Cron
		}
		msg += fmt.Sprintf("; runs %s, allowed staleness %s", when, compactDuration(maxStaleness))
		if s.MissedTicks > 0 {
			msg += fmt.Sprintf("; %d ticks missed", s.MissedTicks)
		}
		if s.Running > 0 {
			msg += fmt.Sprintf("; %d run(s) in progress", s.Running)
		}
		h.problems = append(h.problems, msg)
	}
	switch {
	case h.failing:
		h.status = jobFailing
	case h.overdue:
		h.status = jobOverdue
	default:
		h.status = jobOK
	}
	return h
}

// jobSchedule is when a job runs: its slot, "1h" (a job of package singleton), or a
// schedule's expression and zone, "0 9 * * MON-FRI (Europe/Berlin)".
func jobSchedule(s singleton.JobStatus) string {
	if s.Cron != "" {
		return s.Cron
	}
	return compactDuration(s.Every)
}

// listAllJobs reads every job, page by page, in name order.
func listAllJobs(ctx context.Context, pool *pgxpool.Pool, prefix string) ([]singleton.JobStatus, error) {
	opts := singleton.ListJobsOpts{Prefix: prefix}
	all, _, err := page.Collect(-1, singleton.MaxListLimit, func(last *singleton.JobStatus, n int) ([]singleton.JobStatus, error) {
		if last != nil {
			opts.After = last.Name
		}
		opts.Limit = n
		return singleton.ListJobs(ctx, pool, &opts)
	})
	if err != nil {
		return nil, argError(err)
	}
	return all, nil
}

// jobJSON is one job in `jobs list --json`. Every key is always present; a time that
// never happened, and a text that does not apply, is null.
type jobJSON struct {
	Name                string   `json:"name"`
	Kind                string   `json:"kind"`
	Cron                string   `json:"cron"`
	EveryMS             int64    `json:"every_ms"`
	Origin              *string  `json:"origin"`
	Overlap             string   `json:"overlap"`
	FenceToken          int64    `json:"fence_token"`
	Status              string   `json:"status"`
	Overdue             bool     `json:"overdue"`
	Failing             bool     `json:"failing"`
	Problems            []string `json:"problems"`
	LastStartedAt       *string  `json:"last_started_at"`
	LastSuccessAt       *string  `json:"last_success_at"`
	LastFailureAt       *string  `json:"last_failure_at"`
	LastError           *string  `json:"last_error"`
	ConsecutiveFailures int      `json:"consecutive_failures"`
	LastState           *string  `json:"last_state"`
	Running             int      `json:"running"`
	MissedTicks         int64    `json:"missed_ticks"`
	FirstTick           *string  `json:"first_tick"`
	NextTick            *string  `json:"next_tick"`
	DBNow               *string  `json:"db_now"`
}

func toJobJSON(s singleton.JobStatus, h jobHealth) jobJSON {
	problems := h.problems
	if problems == nil {
		problems = []string{}
	}
	return jobJSON{
		Name: s.Name, Kind: s.Kind, Cron: s.Cron, EveryMS: s.Every.Milliseconds(), Origin: jsonTime(s.Origin), Overlap: string(s.Overlap),
		FenceToken: s.Token, Status: h.status, Overdue: h.overdue, Failing: h.failing, Problems: problems,
		LastStartedAt: jsonTime(s.LastStartedAt), LastSuccessAt: jsonTime(s.LastSuccessAt),
		LastFailureAt: jsonTime(s.LastFailureAt), LastError: nullString(s.LastError),
		ConsecutiveFailures: s.ConsecutiveFailures, LastState: nullString(s.LastState), Running: s.Running,
		MissedTicks: s.MissedTicks, FirstTick: jsonTime(s.FirstTick), NextTick: jsonTime(s.NextTick), DBNow: jsonTime(s.DBNow),
	}
}

func (a *app) jobsListCommand() *cobra.Command {
	var (
		maxStaleness time.Duration
		lf           listFlags
	)
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List jobs in name order: schedule, last success and failure, missed ticks, status",
		Long: `List the jobs of the ledger (every job that claimed at least one tick) in name order:

  SCHEDULE      the length of a schedule slot (a job of package singleton), or a
                schedule's cron expression and zone (package schedules)
  LAST SUCCESS  how long ago the last successful run finished ("-": never)
  LAST FAILURE  how long ago the last failed run finished ("-": never)
  FAILS         failed runs since the last success
  MISSED        ticks from the first one to now that no replica claimed (a schedule's:
                ticks recorded as missed, older than its catch-up window)
  RUNNING       runs in progress with a live lease
  NEXT TICK     the next slot boundary, or a schedule's next tick, by the database clock
  STATUS        failing (the last run failed, or a schedule's tick was missed), overdue
                (no success within the slot plus --max-staleness; a schedule: its next
                tick unclaimed, or its last run not a success, for --max-staleness), or ok

With --json: an array ([] when empty) of objects with the keys name, kind (interval or
cron), cron (a schedule's expression and zone, else ""), every_ms, origin,
overlap, fence_token, status, overdue, failing, problems, last_started_at,
last_success_at, last_failure_at, last_error, consecutive_failures, last_state, running,
missed_ticks, first_tick, next_tick, db_now. Times are RFC 3339 in UTC, null when never.`,
		Example: `  pgcoord jobs list
  pgcoord jobs list --json | jq -r '.[] | select(.status != "ok") | .name'`,
		Args: exactArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			if maxStaleness < 0 {
				return usagef("--max-staleness %v: want 0 or more", maxStaleness)
			}
			if err := lf.checkPrefix(); err != nil {
				return err
			}
			pool, err := a.connect(ctx)
			if err != nil {
				return err
			}
			defer pool.Close()
			return a.show(ctx, cmd, &lf, func() error { return a.printJobs(ctx, pool, lf.prefix, maxStaleness) })
		},
	}
	cmd.Flags().DurationVar(&maxStaleness, "max-staleness", defaultMaxStaleness, "a job is overdue when it has not succeeded for its period plus this")
	addListFlags(cmd, &lf, "only jobs whose name starts with this")
	return cmd
}

// printJobs reads every job whose name starts with prefix and prints them.
func (a *app) printJobs(ctx context.Context, pool *pgxpool.Pool, prefix string, maxStaleness time.Duration) error {
	jobs, err := listAllJobs(ctx, pool, prefix)
	if err != nil {
		return err
	}
	if a.json {
		js := make([]jobJSON, 0, len(jobs))
		for _, s := range jobs {
			js = append(js, toJobJSON(s, judgeJob(s, maxStaleness)))
		}
		return a.printJSON(js)
	}
	tw := a.table()
	fmt.Fprintln(tw, "JOB\tSCHEDULE\tLAST SUCCESS\tLAST FAILURE\tFAILS\tMISSED\tRUNNING\tNEXT TICK\tSTATUS")
	for _, s := range jobs {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\t%d\t%s\t%s\n", s.Name, jobSchedule(s),
			ago(s.LastSuccessAt, s.DBNow), ago(s.LastFailureAt, s.DBNow), s.ConsecutiveFailures,
			s.MissedTicks, s.Running, dash(rfc3339(s.NextTick)), judgeJob(s, maxStaleness).status)
	}
	return tw.Flush()
}

// runJSON is one run in `jobs runs --json`. Every key is always present; what does not
// apply (no finish yet, no error, no live lease) is null.
type runJSON struct {
	Job          string  `json:"job"`
	ScheduledFor *string `json:"scheduled_for"`
	State        string  `json:"state"`
	FenceToken   int64   `json:"fence_token"`
	Attempt      int     `json:"attempt"`
	Holder       string  `json:"holder"`
	StartedAt    *string `json:"started_at"`
	ExpiresAt    *string `json:"expires_at"`
	FinishedAt   *string `json:"finished_at"`
	DurationMS   *int64  `json:"duration_ms"`
	Error        *string `json:"error"`
}

func toRunJSON(r singleton.RunInfo) runJSON {
	j := runJSON{
		Job: r.Job, ScheduledFor: jsonTime(r.ScheduledFor), State: r.State, FenceToken: r.Token,
		Attempt: r.Attempt, Holder: r.Holder, StartedAt: jsonTime(r.StartedAt), ExpiresAt: jsonTime(r.ExpiresAt),
		FinishedAt: jsonTime(r.FinishedAt), Error: nullString(r.Error),
	}
	if !r.FinishedAt.IsZero() && !r.StartedAt.IsZero() {
		ms := r.FinishedAt.Sub(r.StartedAt).Milliseconds()
		j.DurationMS = &ms
	}
	return j
}

// defaultRunsLimit is how many runs `jobs runs` shows unless --limit says otherwise.
const defaultRunsLimit = 20

func (a *app) jobsRunsCommand() *cobra.Command {
	var (
		limit int
		lf    listFlags
	)
	cmd := &cobra.Command{
		Use:   "runs JOB",
		Short: "Show the history of a job's ticks, newest first (exit 1 if the job never ran)",
		Long: `Show the ledger of JOB, newest tick first: each tick's state (running, succeeded, failed,
skipped by the forbid overlap policy, replaced by the replace policy), attempt (2 or more
when a replica took over a tick whose runner stopped heartbeating), fence token, holder,
start, duration and error. At most --limit ticks (default 20).

A job with no tick in the ledger is an error (exit 1): it never ran, or the name is wrong
('pgcoord jobs list' shows the jobs). With --json: an array of objects with the keys job,
scheduled_for, state, fence_token, attempt, holder, started_at, expires_at, finished_at,
duration_ms, error.`,
		Example: `  pgcoord jobs runs weekly-report
  pgcoord jobs runs nightly-export --limit 100 --json`,
		Args: exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			job := args[0]
			if limit < 1 || limit > singleton.MaxListLimit {
				return usagef("--limit %d: want 1 to %d", limit, singleton.MaxListLimit)
			}
			if err := check.Name("job", job); err != nil {
				return usageError{err}
			}
			pool, err := a.connect(ctx)
			if err != nil {
				return err
			}
			defer pool.Close()
			return a.show(ctx, cmd, &lf, func() error { return a.printRuns(ctx, pool, job, limit) })
		},
	}
	cmd.Flags().IntVar(&limit, "limit", defaultRunsLimit, "show at most this many ticks, newest first")
	addListFlags(cmd, &lf, "")
	return cmd
}

// printRuns reads the newest limit runs of job and prints them.
func (a *app) printRuns(ctx context.Context, pool *pgxpool.Pool, job string, limit int) error {
	runs, err := singleton.ListRuns(ctx, pool, job, &singleton.ListRunsOpts{Limit: limit})
	if err != nil {
		return argError(err)
	}
	if len(runs) == 0 {
		return fmt.Errorf("no such job %q: no tick of it was ever claimed ('pgcoord jobs list' shows the jobs)", job)
	}
	if a.json {
		js := make([]runJSON, 0, len(runs))
		for _, r := range runs {
			js = append(js, toRunJSON(r))
		}
		return a.printJSON(js)
	}
	tw := a.table()
	fmt.Fprintln(tw, "SCHEDULED FOR\tSTATE\tATTEMPT\tTOKEN\tHOLDER\tSTARTED\tDURATION\tERROR")
	for _, r := range runs {
		dur := "-"
		if !r.FinishedAt.IsZero() && r.State != "skipped" {
			dur = roundDuration(r.FinishedAt.Sub(r.StartedAt)).String()
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\t%s\t%s\t%s\n", rfc3339(r.ScheduledFor), r.State, r.Attempt, r.Token,
			r.Holder, preciseTime(r.StartedAt), dur, dash(oneLine(r.Error, 80)))
	}
	return tw.Flush()
}

// compactDuration formats a schedule period or a threshold: "1m", "1h30m", "7d", "500ms".
func compactDuration(d time.Duration) string {
	if d >= 24*time.Hour && d%(24*time.Hour) == 0 {
		return strconv.FormatInt(int64(d/(24*time.Hour)), 10) + "d"
	}
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// roundDuration rounds a run's duration for a table: to the millisecond under a minute,
// to the second above.
func roundDuration(d time.Duration) time.Duration {
	if d < time.Minute {
		return d.Round(time.Millisecond)
	}
	return d.Round(time.Second)
}
