package cli

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/pgcoord/pgcoord/internal/base"
	"github.com/pgcoord/pgcoord/singleton"
)

// checkJSON is one job in `jobs check --json`.
type checkJSON struct {
	Name     string   `json:"name"`
	Status   string   `json:"status"` // ok, overdue, failing, or missing (--job named a job with no ticks)
	Problems []string `json:"problems"`
}

func (a *app) jobsCheckCommand() *cobra.Command {
	var (
		maxStaleness time.Duration
		only         []string
	)
	cmd := &cobra.Command{
		Use:   "check",
		Short: "Exit 3 if any job is overdue or its last run failed, saying which and why",
		Long: `Check every job of the ledger (or only the --job ones) and exit 3 if any needs attention:

  failing  its last run failed (the error is shown)
  overdue  it has not succeeded for its period (the slot) plus --max-staleness, counting
           from its last success, or from its first tick if it never succeeded: it
           stopped running, or runs but never finishes; a schedule (package schedules)
           is overdue when its next tick is --max-staleness past and unclaimed, or its
           last run is not a success --max-staleness after it started
  missing  (with --job) the named job has never claimed a tick: it never ran at all

Each job that needs attention is printed with why; exit 0 when all are healthy. Pick
--max-staleness longer than a run takes. With no jobs in the ledger (and no --job) there
is nothing to check: exit 0 with a note on stderr — name the jobs you expect with --job
so that a job that never ran fails the check.

With --json: an array of {"name", "status", "problems"} for every job checked.`,
		Example: `  pgcoord jobs check
  pgcoord jobs check --max-staleness 15m --job weekly-report --job nightly-export`,
		Args: exactArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			if maxStaleness < 0 {
				return usagef("--max-staleness %v: want 0 or more", maxStaleness)
			}
			for _, name := range only {
				if err := check.Name("job", name); err != nil {
					return usageError{err}
				}
			}
			pool, err := a.connect(ctx)
			if err != nil {
				return err
			}
			defer pool.Close()
			jobs, err := listAllJobs(ctx, pool, "")
			if err != nil {
				return err
			}

			var results []checkJSON
			if len(only) == 0 {
				for _, s := range jobs {
					h := judgeJob(s, maxStaleness)
					results = append(results, checkJSON{Name: s.Name, Status: h.status, Problems: h.problems})
				}
			} else {
				for _, name := range uniqueNames(only) {
					i := slices.IndexFunc(jobs, func(s singleton.JobStatus) bool { return s.Name == name })
					if i < 0 {
						results = append(results, checkJSON{Name: name, Status: "missing",
							Problems: []string{"no tick of this job was ever claimed: it never ran (or runs under another name or schema)"}})
						continue
					}
					h := judgeJob(jobs[i], maxStaleness)
					results = append(results, checkJSON{Name: name, Status: h.status, Problems: h.problems})
				}
			}

			bad := 0
			for i := range results {
				if results[i].Problems == nil {
					results[i].Problems = []string{}
				}
				if results[i].Status != jobOK {
					bad++
				}
			}
			if a.json {
				if results == nil {
					results = []checkJSON{}
				}
				if err := a.printJSON(results); err != nil {
					return err
				}
			} else {
				for _, r := range results {
					if r.Status == jobOK {
						continue
					}
					fmt.Fprintf(a.out, "%s %s: %s\n", strings.ToUpper(r.Status), base.Printable(r.Name), base.Printable(strings.Join(r.Problems, "; ")))
				}
			}
			switch {
			case len(results) == 0:
				fmt.Fprintln(a.errOut, "pgcoord: note: no jobs in the ledger: nothing to check (name the jobs you expect with --job)")
				return nil
			case bad > 0:
				fmt.Fprintf(a.errOut, "pgcoord: %d of %d jobs need attention\n", bad, len(results))
				return errCheckFailed
			}
			if !a.json {
				fmt.Fprintf(a.out, "all %d jobs healthy (max staleness %s)\n", len(results), compactDuration(maxStaleness))
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.DurationVar(&maxStaleness, "max-staleness", defaultMaxStaleness, "a job is overdue when it has not succeeded for its period plus this")
	f.StringArrayVar(&only, "job", nil, "check only this job, and fail if it never ran (repeatable)")
	return cmd
}

// uniqueNames returns names without repeats, in their first order.
func uniqueNames(names []string) []string {
	var out []string
	for _, n := range names {
		if !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	return out
}
