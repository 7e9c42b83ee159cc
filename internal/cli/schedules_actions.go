package cli

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/pgcoord/pgcoord/schedules"
)

func (a *app) schedulesPauseCommand() *cobra.Command {
	var note string
	cmd := &cobra.Command{
		Use:   "pause NAME [--note N]",
		Short: "Pause a schedule: no tick runs until it is resumed",
		Long: fmt.Sprintf(`Pause the schedule NAME: no tick runs while it is paused; runs already running go on.
--note (at most %d bytes) says why; pausing a paused schedule keeps the first pause's note.
An unknown schedule is an error (exit 1). Audited.

With --json: the schedule afterwards, as in 'schedules list --json'.`, schedules.MaxNoteLen),
		Example: `  pgcoord schedules pause weekly-report --note "INC-123: report service down"`,
		Args:    exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			pool, err := a.connect(ctx)
			if err != nil {
				return err
			}
			defer pool.Close()
			i, err := schedules.Pause(ctx, pool, args[0], note, a.changeOpts())
			if err != nil {
				return argError(err)
			}
			return a.printChanged(i, "paused")
		},
	}
	cmd.Flags().StringVar(&note, "note", "", "why it is paused, shown by 'schedules get'")
	return cmd
}

func (a *app) schedulesResumeCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "resume NAME",
		Short: "Resume a paused schedule from its next tick after now",
		Long: `Resume the schedule NAME: its next tick is the first one after now; the ticks that came
while it was paused do not run (see 'backfill'). Resuming a schedule that is not paused
changes nothing. An unknown schedule is an error (exit 1). Audited.

With --json: the schedule afterwards, as in 'schedules list --json'.`,
		Example: `  pgcoord schedules resume weekly-report`,
		Args:    exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			pool, err := a.connect(ctx)
			if err != nil {
				return err
			}
			defer pool.Close()
			i, err := schedules.Resume(ctx, pool, args[0], a.changeOpts())
			if err != nil {
				return argError(err)
			}
			return a.printChanged(i, "resumed")
		},
	}
}

// scheduleRunJSON is `schedules trigger --json`.
type scheduleRunJSON struct {
	Schedule string  `json:"schedule"`
	Tick     *string `json:"tick"`
	Cause    string  `json:"cause"`
	State    string  `json:"state"`
}

func (a *app) schedulesTriggerCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "trigger NAME",
		Short: "Ask for a run of a schedule now, beside its scheduled ticks",
		Long: `Record a pending run of the schedule NAME for the database's now; a Scheduler with its
handler starts it as soon as the overlap policy lets it. An unknown schedule is an error
(exit 1). Audited.

With --json: {"schedule", "tick", "cause", "state"}.`,
		Example: `  pgcoord schedules trigger weekly-report`,
		Args:    exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			pool, err := a.connect(ctx)
			if err != nil {
				return err
			}
			defer pool.Close()
			r, err := schedules.Trigger(ctx, pool, args[0], a.changeOpts())
			if err != nil {
				return argError(err)
			}
			if a.json {
				return a.printJSON(scheduleRunJSON{Schedule: r.Schedule, Tick: jsonTime(r.Tick), Cause: r.Cause, State: r.State})
			}
			fmt.Fprintf(a.out, "schedule %q triggered: a run for %s is %s\n", r.Schedule, preciseTime(r.Tick), r.State)
			return nil
		},
	}
}

// backfillJSON is `schedules backfill --json`.
type backfillJSON struct {
	Schedule string `json:"schedule"`
	From     string `json:"from"`
	To       string `json:"to"`
	Recorded int64  `json:"recorded"`
}

func (a *app) schedulesBackfillCommand() *cobra.Command {
	var from, to string
	cmd := &cobra.Command{
		Use:   "backfill NAME --from RFC3339 --to RFC3339",
		Short: "Record the ticks of a past range as pending runs, each run once",
		Long: fmt.Sprintf(`Record the ticks of the schedule NAME from --from through --to (both included; --to not
after now) as pending runs, which Schedulers with its handler run in tick order, one at a
time. A tick that has a run already is left as it is, so a backfill can be repeated or
resumed: each tick runs once. It prints how many runs it recorded. A range with no tick or
more than %d exits 2; an unknown schedule exits 1. Audited.

With --json: {"schedule", "from", "to", "recorded"}.`, schedules.MaxBackfill),
		Example: `  pgcoord schedules backfill weekly-report --from 2027-01-04T00:00:00Z --to 2027-01-08T23:59:59Z`,
		Args:    exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			for _, f := range []string{"from", "to"} {
				if !cmd.Flags().Changed(f) {
					return usagef("--%s is required", f)
				}
			}
			start, err := timeFlag("from", from)
			if err != nil {
				return err
			}
			end, err := timeFlag("to", to)
			if err != nil {
				return err
			}
			pool, err := a.connect(ctx)
			if err != nil {
				return err
			}
			defer pool.Close()
			n, err := schedules.Backfill(ctx, pool, args[0], start, end, a.changeOpts())
			if err != nil {
				return argError(err)
			}
			if a.json {
				return a.printJSON(backfillJSON{Schedule: args[0], From: rfc3339(start), To: rfc3339(end), Recorded: n})
			}
			fmt.Fprintf(a.out, "schedule %q: %d runs recorded from %s to %s (ticks with a run already are left as they are)\n",
				args[0], n, start.UTC().Format(time.RFC3339), end.UTC().Format(time.RFC3339))
			return nil
		},
	}
	cmd.Flags().StringVar(&from, "from", "", "the first time of the range (RFC 3339)")
	cmd.Flags().StringVar(&to, "to", "", "the last time of the range (RFC 3339), not after now")
	return cmd
}

// scheduleDeleteJSON is `schedules delete --json`.
type scheduleDeleteJSON struct {
	DryRun   bool         `json:"dry_run"`
	Deleted  bool         `json:"deleted"`
	Schedule scheduleJSON `json:"schedule"`
}

func (a *app) schedulesDeleteCommand() *cobra.Command {
	var dryRun bool
	cmd := &cobra.Command{
		Use:   "delete NAME [--dry-run]",
		Short: "Delete a schedule and its run history; --dry-run shows what it would delete",
		Long: `Delete the schedule NAME and its run history. A run still running loses its run (its
heartbeats and finish fail). An unknown schedule is an error (exit 1). Audited.

--dry-run reads the schedule and says what would be deleted, changing nothing; it exits as
the real command would. With --json: {"dry_run", "deleted", "schedule"}, where schedule is
the schedule as it was before (the object of 'schedules list --json').`,
		Example: `  pgcoord schedules delete weekly-report --dry-run
  pgcoord schedules delete weekly-report`,
		Args: exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			pool, err := a.connect(ctx)
			if err != nil {
				return err
			}
			defer pool.Close()
			i, err := schedules.Get(ctx, pool, args[0])
			if err != nil {
				return argError(err)
			}
			if !dryRun {
				if err := schedules.Delete(ctx, pool, args[0], a.changeOpts()); err != nil {
					return argError(err)
				}
			}
			if a.json {
				return a.printJSON(scheduleDeleteJSON{DryRun: dryRun, Deleted: !dryRun, Schedule: toScheduleJSON(i)})
			}
			if dryRun {
				fmt.Fprintf(a.out, "would delete schedule %q (%q in %s, handler %q) and its run history\nnothing changed (--dry-run)\n",
					i.Name, i.Expr, i.Zone, i.Handler)
				return nil
			}
			fmt.Fprintf(a.out, "schedule %q deleted with its run history\n", i.Name)
			return nil
		},
	}
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "show what would be deleted, change nothing")
	return cmd
}
