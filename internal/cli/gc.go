package cli

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/pgcoord/pgcoord/pgcoord"
)

// gcKindJSON is one kind of rows in the --json output of `gc`.
type gcKindJSON struct {
	Kind        string `json:"kind"`
	Deleted     int64  `json:"deleted"`
	WouldDelete *int64 `json:"would_delete"` // null unless --dry-run
}

// gcJSON is the --json output of `gc`.
type gcJSON struct {
	OlderThanSeconds int64        `json:"older_than_seconds"`
	DryRun           bool         `json:"dry_run"`
	Deleted          int64        `json:"deleted"`
	WouldDelete      *int64       `json:"would_delete"` // null unless --dry-run
	Kinds            []gcKindJSON `json:"kinds"`
}

func (a *app) gcCommand() *cobra.Command {
	var (
		olderThan = days(pgcoord.DefaultGCRetention)
		batch     int
		dryRun    bool
	)
	cmd := &cobra.Command{
		Use:   "gc",
		Short: "Collect what pgcoord no longer needs: old leases, registers, permits, runs, messages, ...",
		Long: `Collect, by the database clock, what pgcoord no longer needs, so that its tables stay
bounded (pgcoord.GC, the SQL function pgcoord_gc). With a retention R (--older-than,
default 30d):

  leases       lease rows free (released, or expired) for longer than R
  fences       fence registers not written for longer than R
  permits      semaphore permits expired, and waiters gone, for longer than R
  semaphores   keys with no demand, permit or waiter, unchanged for longer than R,
               whose limit was never set (set-limit keys are configuration: kept)
  job_runs     runs finished longer than R ago, except each job's latest
  dedupe       dedupe claims past their own retention
  idempotency  idempotency keys past their own retention (each leaves a tombstone
               for R, refusing a late retry) and expired tombstones
  outbox       messages delivered longer than R ago (dead messages are kept)
  inbox        inbox records applied longer than R ago
  singletons   lock generations of RunOnce/RunSession jobs not run for longer than R
  outbox_keys  per-key order rows of outbox keys with no pending message (any age)
  ratelimit    rows of rate limit keys at rest, which carry no state (any age)
  schedule_handlers
               registrations of schedule handlers that ran out longer than R ago
  partition_members
               members of partition groups whose lease ran out longer than R ago

Job definitions, configured semaphore keys, partition groups, dead messages, the pending
runs of schedules and the audit log are never collected. Collection never lets a fence token repeat or a stale one through; the one
write it may refuse although no newer holder wrote is one with a grant older than R, to a
resource without a fence register (never written, or collected). Choose R longer than any
retry, redelivery or holder pause can last.

It deletes in batches of --batch rows of each kind, each its own short transaction, until
every kind has fewer than a batch left; concurrent runs are safe. --dry-run counts what
would be deleted now and deletes nothing. On a terminal, progress goes to stderr. --older-than
takes a Go duration or days: 30d, 1d12h, 720h (at least 1s).`,
		Example: `  pgcoord gc
  pgcoord gc --dry-run
  pgcoord gc --older-than 90d --json`,
		Args: exactArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			r := time.Duration(olderThan)
			if r < pgcoord.MinGCRetention || r > pgcoord.MaxGCRetention {
				return usagef("--older-than %s: want %v to %s", fmtDays(r), pgcoord.MinGCRetention, fmtDays(pgcoord.MaxGCRetention))
			}
			if batch < 1 || batch > pgcoord.MaxGCBatch {
				return usagef("--batch %d: want 1 to %d", batch, pgcoord.MaxGCBatch)
			}
			pool, err := a.connect(ctx)
			if err != nil {
				return err
			}
			defer pool.Close()
			opts := &pgcoord.GCOpts{OlderThan: r, Batch: batch, DryRun: dryRun}
			p := a.newProgress(dryRun, "rows", "deleted")
			opts.Progress = func(res pgcoord.GCResult) { p.update(res.Total()) }
			res, err := pgcoord.GC(ctx, pool, opts)
			p.done()
			if err != nil {
				if n := res.Total(); n > 0 {
					fmt.Fprintf(a.errOut, "pgcoord: gc: deleted %d rows%s before the error\n", n, p.in())
				}
				return argError(err)
			}
			if !dryRun && res.Total() > 0 {
				details := map[string]any{"older_than_seconds": int64(r / time.Second)}
				for _, k := range res.Kinds {
					details[k.Kind] = k.Removed
				}
				if err := a.record(ctx, pool, "gc", "", details); err != nil {
					return err
				}
			}
			if a.json {
				return a.printJSON(gcOutput(res, r, dryRun))
			}
			return a.printGC(res, r, dryRun, p.in())
		},
	}
	f := cmd.Flags()
	f.Var(&olderThan, "older-than", "retention: collect what is older (a duration or days: 30d, 720h; at least 1s)")
	f.IntVar(&batch, "batch", pgcoord.DefaultGCBatch, fmt.Sprintf("rows of each kind deleted per statement (1 to %d)", pgcoord.MaxGCBatch))
	f.BoolVar(&dryRun, "dry-run", false, "count what would be deleted, delete nothing")
	return cmd
}

// gcOutput is res as the --json output.
func gcOutput(res pgcoord.GCResult, olderThan time.Duration, dryRun bool) gcJSON {
	out := gcJSON{OlderThanSeconds: int64(olderThan / time.Second), DryRun: dryRun, Kinds: []gcKindJSON{}}
	total := res.Total()
	if dryRun {
		out.WouldDelete = &total
	} else {
		out.Deleted = total
	}
	for _, k := range res.Kinds {
		kj := gcKindJSON{Kind: k.Kind}
		if dryRun {
			n := k.Removed
			kj.WouldDelete = &n
		} else {
			kj.Deleted = k.Removed
		}
		out.Kinds = append(out.Kinds, kj)
	}
	return out
}

// printGC prints res as a table of kinds and counts, and a summary line.
func (a *app) printGC(res pgcoord.GCResult, olderThan time.Duration, dryRun bool, in string) error {
	w := a.table()
	head := "DELETED"
	if dryRun {
		head = "WOULD DELETE"
	}
	fmt.Fprintf(w, "KIND\t%s\n", head)
	for _, k := range res.Kinds {
		fmt.Fprintf(w, "%s\t%d\n", k.Kind, k.Removed)
	}
	if err := w.Flush(); err != nil {
		return err
	}
	var err error
	if dryRun {
		_, err = fmt.Fprintf(a.out, "%d rows older than %s would be deleted (--dry-run: nothing changed)\n", res.Total(), fmtDays(olderThan))
	} else {
		_, err = fmt.Fprintf(a.out, "deleted %d rows older than %s%s\n", res.Total(), fmtDays(olderThan), in)
	}
	return err
}

// gcOneKindJSON is the --json output of a collector of one kind: `dedupe gc`,
// `idempotency gc`, `outbox gc`.
type gcOneKindJSON struct {
	Deleted     int64  `json:"deleted"`
	WouldDelete *int64 `json:"would_delete"` // null unless --dry-run
	DryRun      bool   `json:"dry_run"`
}

// gcRows names what a collector of one kind deletes: as progress and errors count it
// ("expired claims"), as its result counts it ("expired dedupe claims"), and what the
// result line adds after the count (" (tombstones kept 720h0m0s)").
type gcRows struct {
	progress, result, suffix string
}

// runGCOneKind runs gc, a collector of one kind, with progress lines on a terminal unless
// dryRun, and prints its outcome: "deleted N ...", or with dryRun "N ... would be
// deleted", or with --json a gcOneKindJSON. After an error it says how many rows were
// deleted before it.
//
// A collection that deleted rows is recorded in the audit log by record, once it finished.
func (a *app) runGCOneKind(dryRun bool, rows gcRows, gc func(progress func(deleted int64)) (int64, error), record func(deleted int64) error) error {
	p := a.newProgress(dryRun, rows.progress, "deleted")
	n, err := gc(p.update)
	p.done()
	if err != nil {
		if n > 0 {
			fmt.Fprintf(a.errOut, "pgcoord: deleted %d %s%s before the error\n", n, rows.progress, p.in())
		}
		return argError(err)
	}
	if !dryRun && n > 0 {
		if err := record(n); err != nil {
			return err
		}
	}
	if a.json {
		out := gcOneKindJSON{Deleted: n, DryRun: dryRun}
		if dryRun {
			out.Deleted, out.WouldDelete = 0, &n
		}
		return a.printJSON(out)
	}
	if dryRun {
		_, err = fmt.Fprintf(a.out, "%d %s would be deleted (--dry-run: nothing changed)\n", n, rows.result)
		return err
	}
	_, err = fmt.Fprintf(a.out, "deleted %d %s%s%s\n", n, rows.result, p.in(), rows.suffix)
	return err
}

// days is a duration flag that also takes whole days: "30d", "1d12h", "720h", "-1s".
type days time.Duration

func (d *days) String() string { return fmtDays(time.Duration(*d)) }
func (d *days) Type() string   { return "duration" }

func (d *days) Set(s string) error {
	v, err := parseDays(s)
	if err != nil {
		return err
	}
	*d = days(v)
	return nil
}

// fmtDays formats d as whole days ("30d") when it is a positive number of them, else as a
// Go duration.
func fmtDays(d time.Duration) string {
	if d > 0 && d%(24*time.Hour) == 0 {
		return strconv.FormatInt(int64(d/(24*time.Hour)), 10) + "d"
	}
	return d.String()
}

// parseDays parses a Go duration, optionally led by a number of days ("30d", "1d12h").
func parseDays(s string) (time.Duration, error) {
	rest, neg := strings.CutPrefix(s, "-")
	n, after, ok := strings.Cut(rest, "d")
	if !ok {
		return time.ParseDuration(s)
	}
	nd, err := strconv.ParseInt(n, 10, 64)
	if err != nil || nd > 1e6 {
		return 0, fmt.Errorf("time: invalid duration %q", s)
	}
	d := time.Duration(nd) * 24 * time.Hour
	if after != "" {
		more, err := time.ParseDuration(after)
		if err != nil || strings.HasPrefix(after, "-") || strings.HasPrefix(after, "+") {
			return 0, fmt.Errorf("time: invalid duration %q", s)
		}
		d += more
	}
	if neg {
		d = -d
	}
	return d, nil
}
