package cli

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/spf13/cobra"

	"github.com/pgcoord/pgcoord/outbox"
)

// outboxRetryJSON is the --json output of `outbox retry`.
type outboxRetryJSON struct {
	Retried int64 `json:"retried"`
	DryRun  bool  `json:"dry_run"`
}

func (a *app) outboxRetryCommand() *cobra.Command {
	var (
		allDead bool
		topic   string
		dryRun  bool
		size    int
	)
	cmd := &cobra.Command{
		Use:   "retry ID | --all-dead",
		Short: "Make a message (or every dead one) deliverable now",
		Long: `Make message ID deliverable now: a dead message becomes pending again with a fresh count of
attempts, and a pending one waiting out a backoff or delay becomes due. With --all-dead
every dead message (of --topic, if given) is made pending again, in batches of --batch
messages, each its own short transaction; on a terminal, progress goes to stderr, and the
last line counts the messages and batches. A retried dead message is again the oldest
pending message of its key: it is delivered before the key's messages still pending.

--dry-run changes nothing and says what would be retried. Exit code 1 if no pending or dead
message has that id. With --json: {"retried": N, "dry_run": false}.`,
		Example: `  pgcoord outbox retry 4711
  pgcoord outbox retry --all-dead --topic orders --dry-run`,
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			var id int64
			switch {
			case allDead && len(args) > 0:
				return usagef("give a message ID or --all-dead, not both")
			case allDead:
			case len(args) != 1:
				return usagef("%s takes a message ID (or --all-dead)", cmd.CommandPath())
			default:
				var err error
				if id, err = strconv.ParseInt(args[0], 10, 64); err != nil || id < 1 {
					return usagef("message ID %q: want a positive integer", args[0])
				}
				if topic != "" {
					return usagef("--topic applies to --all-dead only")
				}
			}
			if size < 1 || size > outbox.MaxGCBatch {
				return usagef("--batch %d: want 1 to %d", size, outbox.MaxGCBatch)
			}
			pool, err := a.connect(ctx)
			if err != nil {
				return err
			}
			defer pool.Close()
			var n int64
			p := a.newProgress(dryRun, "dead messages", "retried")
			switch {
			case allDead:
				n, err = outbox.RetryDead(ctx, pool, &outbox.RetryDeadOpts{Topic: topic, DryRun: dryRun, Batch: size, Progress: p.update})
				p.done()
				if !dryRun && n > 0 { // the batches done stay done: record them, even when interrupted
					details := map[string]any{"retried": n}
					if err != nil {
						details["interrupted"] = true
					}
					if rerr := a.record(context.WithoutCancel(ctx), pool, "outbox.retry_dead", topic, details); rerr != nil && err == nil {
						return rerr
					}
				}
				if err != nil {
					if n > 0 {
						fmt.Fprintf(a.errOut, "pgcoord: retried %d dead messages%s before the error\n", n, p.in())
					}
					return argError(err)
				}
			case dryRun:
				m, err := outbox.Get(ctx, pool, id)
				if err != nil {
					return err
				}
				if m.State == outbox.Delivered {
					return fmt.Errorf("%w: message %d was delivered", outbox.ErrNotFound, id)
				}
				n = 1
			default:
				err := a.audited(ctx, pool, "outbox.retry", strconv.FormatInt(id, 10), func(tx pgx.Tx) (map[string]any, error) {
					return map[string]any{}, outbox.Retry(ctx, tx, id)
				})
				if err != nil {
					return err
				}
				n = 1
			}
			if a.json {
				return a.printJSON(outboxRetryJSON{Retried: n, DryRun: dryRun})
			}
			what := fmt.Sprintf("message %d", id)
			if allDead {
				what = fmt.Sprintf("%d dead messages", n)
				if !dryRun {
					what += p.in()
				}
			}
			if dryRun {
				_, err = fmt.Fprintf(a.out, "%s would be retried (--dry-run: nothing changed)\n", what)
			} else {
				_, err = fmt.Fprintf(a.out, "retried %s\n", what)
			}
			return err
		},
	}
	f := cmd.Flags()
	f.BoolVar(&allDead, "all-dead", false, "retry every dead message")
	f.StringVar(&topic, "topic", "", "with --all-dead: only this topic's dead messages")
	f.BoolVar(&dryRun, "dry-run", false, "change nothing; say what would be retried")
	f.IntVar(&size, "batch", outbox.DefaultGCBatch, fmt.Sprintf("with --all-dead: messages retried per statement (1 to %d)", outbox.MaxGCBatch))
	return cmd
}

func (a *app) outboxGCCommand() *cobra.Command {
	var (
		opts   outbox.GCOpts
		dryRun bool
	)
	cmd := &cobra.Command{
		Use:   "gc",
		Short: "Delete delivered messages older than the retention, in batches",
		Long: `Delete the messages delivered longer ago than --older-than (by the database clock), and with
--dead the dead ones declared dead that long ago, in batches of --batch rows, each its own
short transaction, oldest first. Pending messages are never deleted. Keep the retention
shorter than consumers' inbox retention (see docs/outbox.md).

--dry-run counts what would be deleted and deletes nothing. On a terminal, progress goes to
stderr. With --json: {"deleted": N, "would_delete": null, "dry_run": false}, or with
--dry-run {"deleted": 0, "would_delete": N, "dry_run": true}.`,
		Example: `  pgcoord outbox gc
  pgcoord outbox gc --older-than 72h --dead --dry-run`,
		Args: exactArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			if opts.OlderThan <= 0 {
				return usagef("--older-than %v: want a positive duration", opts.OlderThan)
			}
			if opts.Batch < 1 || opts.Batch > outbox.MaxGCBatch {
				return usagef("--batch %d: want 1 to %d", opts.Batch, outbox.MaxGCBatch)
			}
			pool, err := a.connect(ctx)
			if err != nil {
				return err
			}
			defer pool.Close()
			opts.DryRun = dryRun
			return a.runGCOneKind(dryRun, gcRows{progress: "messages", result: "outbox messages"},
				func(progress func(int64)) (int64, error) {
					opts.Progress = progress
					return outbox.GC(ctx, pool, &opts)
				},
				func(n int64) error {
					return a.record(ctx, pool, "outbox.gc", "", map[string]any{"deleted": n, "older_than_seconds": int64(opts.OlderThan / time.Second), "dead": opts.Dead})
				})
		},
	}
	f := cmd.Flags()
	f.DurationVar(&opts.OlderThan, "older-than", outbox.DefaultRetention, "retention: delete what finished longer ago than this")
	f.BoolVar(&opts.Dead, "dead", false, "also delete dead messages past the retention")
	f.IntVar(&opts.Batch, "batch", outbox.DefaultGCBatch, fmt.Sprintf("messages deleted per statement (1 to %d)", outbox.MaxGCBatch))
	f.BoolVar(&dryRun, "dry-run", false, "count what would be deleted, delete nothing")
	return cmd
}
