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

// dedupeGCJSON is the --json output of `dedupe gc`.
type dedupeGCJSON struct {
	Deleted     int64  `json:"deleted"`
	WouldDelete *int64 `json:"would_delete"` // null unless --dry-run
	DryRun      bool   `json:"dry_run"`
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
			opts := &dedupe.GCOpts{Batch: batch, DryRun: dryRun}
			tty := benchTTY(a.errOut)
			if tty && !dryRun {
				opts.Progress = func(deleted int64) {
					fmt.Fprintf(a.errOut, "\rpgcoord: deleted %d expired claims...", deleted)
				}
			}
			n, err := dedupe.GC(ctx, pool, opts)
			if opts.Progress != nil && n > 0 {
				fmt.Fprintln(a.errOut)
			}
			if err != nil {
				if n > 0 {
					fmt.Fprintf(a.errOut, "pgcoord: deleted %d expired claims before the error\n", n)
				}
				return argError(err)
			}
			if a.json {
				out := dedupeGCJSON{Deleted: n, DryRun: dryRun}
				if dryRun {
					out.Deleted, out.WouldDelete = 0, &n
				}
				return a.printJSON(out)
			}
			if dryRun {
				_, err = fmt.Fprintf(a.out, "%d expired dedupe claims would be deleted (--dry-run: nothing changed)\n", n)
				return err
			}
			_, err = fmt.Fprintf(a.out, "deleted %d expired dedupe claims\n", n)
			return err
		},
	}
	f := cmd.Flags()
	f.IntVar(&batch, "batch", dedupe.DefaultGCBatch, fmt.Sprintf("claims deleted per statement (1 to %d)", dedupe.MaxGCBatch))
	f.BoolVar(&dryRun, "dry-run", false, "count the expired claims, delete nothing")
	return cmd
}
