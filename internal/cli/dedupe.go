package cli

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/pgcoord/pgcoord/dedupe"
)

func (a *app) dedupeCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "dedupe",
		Short: "Operate dedupe claims: remove the ones whose retention has passed",
		Long: `Operate pgcoord's dedupe claims (package dedupe): (scope, key) pairs claimed once, inside
the claimer's transaction, so that an effect happens once however often it is retried.`,
		Args: noSubcommand,
		RunE: func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	cmd.AddCommand(a.dedupeGCCommand())
	return cmd
}

func (a *app) dedupeGCCommand() *cobra.Command {
	var (
		batch  int
		dryRun bool
	)
	cmd := &cobra.Command{
		Use:   "gc",
		Short: "Delete expired dedupe claims, in batches",
		Long: `Delete the dedupe claims whose retention has passed, by the database clock, in batches of
--batch rows, each its own short transaction, until none is left. Claims made without a
retention are kept forever and never deleted; a claim not yet expired is never deleted.
A deleted claim can be claimed again, so choose retentions longer than any retry or
redelivery can arrive.

--dry-run counts the expired claims and deletes nothing. On a terminal, progress goes to
stderr. With --json: {"deleted": N, "would_delete": null, "dry_run": false}, or with
--dry-run {"deleted": 0, "would_delete": N, "dry_run": true}.`,
		Example: `  pgcoord dedupe gc
  pgcoord dedupe gc --dry-run
  pgcoord dedupe gc --batch 10000 --json`,
		Args: exactArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			if batch < 1 || batch > dedupe.MaxGCBatch {
				return usagef("--batch %d: want 1 to %d", batch, dedupe.MaxGCBatch)
			}
			pool, err := a.connect(ctx)
			if err != nil {
				return err
			}
			defer pool.Close()
			return a.runGCOneKind(dryRun, gcRows{progress: "expired claims", result: "expired dedupe claims"},
				func(progress func(int64)) (int64, error) {
					return dedupe.GC(ctx, pool, &dedupe.GCOpts{Batch: batch, DryRun: dryRun, Progress: progress})
				},
				func(n int64) error { return a.record(ctx, pool, "dedupe.gc", "", map[string]any{"deleted": n}) })
		},
	}
	f := cmd.Flags()
	f.IntVar(&batch, "batch", dedupe.DefaultGCBatch, fmt.Sprintf("claims deleted per statement (1 to %d)", dedupe.MaxGCBatch))
	f.BoolVar(&dryRun, "dry-run", false, "count the expired claims, delete nothing")
	return cmd
}
