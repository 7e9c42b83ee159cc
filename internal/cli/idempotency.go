package cli

import (
	"context"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/pgcoord/pgcoord/idempotency"
	"github.com/pgcoord/pgcoord/internal/base"
	"github.com/pgcoord/pgcoord/internal/page"
)

// idemPageSize is how many keys one idempotency.List call reads.
const idemPageSize = 1000

// idemShowBody is how much of a stored body `idempotency show` prints in a table.
const idemShowBody = 2000

func (a *app) idempotencyCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "idempotency",
		Short: "Inspect idempotency keys: list, show, gc",
		Long: `Operate pgcoord's idempotency keys (package idempotency): (scope, key) pairs whose first
request executed and whose response is stored, so that a repeat is replayed instead of
executed again. Every subcommand calls the same public API a Go program calls.

A key is in flight while an attempt runs. An attempt holds its key with a transaction-level
advisory lock: an in-flight key whose lock nobody holds is stuck — its holder died after
recording a recovery point — and the next request with the key recovers it at once.`,
		Args: noSubcommand,
		RunE: func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	cmd.AddCommand(a.idempotencyListCommand(), a.idempotencyShowCommand(), a.idempotencyGCCommand())
	return cmd
}

// idemKeyJSON is one key in `idempotency list --json` (and the top of `show --json`).
// Every key is always present; a value that does not apply is null.
type idemKeyJSON struct {
	Scope         string  `json:"scope"`
	Key           string  `json:"key"`
	State         string  `json:"state"`
	Held          bool    `json:"held"`
	Stuck         bool    `json:"stuck"`
	Holder        string  `json:"holder"`
	Attempts      int     `json:"attempts"`
	RecoveryPoint *string `json:"recovery_point"`
	Status        *int    `json:"status"`
	BodyBytes     int     `json:"body_bytes"`
	Fingerprint   string  `json:"fingerprint"`
	CreatedAt     *string `json:"created_at"`
	UpdatedAt     *string `json:"updated_at"`
	CompletedAt   *string `json:"completed_at"`
	ExpiresAt     *string `json:"expires_at"`
	DBNow         *string `json:"db_now"`
}

func toIdemKeyJSON(k idempotency.KeyInfo) idemKeyJSON {
	var status *int
	if k.State == idempotency.StateCompleted {
		status = &k.Status
	}
	return idemKeyJSON{
		Scope: k.Scope, Key: k.Key, State: k.State, Held: k.Held, Stuck: k.Stuck(), Holder: k.Holder,
		Attempts: k.Attempts, RecoveryPoint: nullString(k.RecoveryPoint), Status: status, BodyBytes: k.BodyBytes,
		Fingerprint: hex.EncodeToString(k.Fingerprint), CreatedAt: jsonTime(k.CreatedAt), UpdatedAt: jsonTime(k.UpdatedAt),
		CompletedAt: jsonTime(k.CompletedAt), ExpiresAt: jsonTime(k.ExpiresAt), DBNow: jsonTime(k.DBNow),
	}
}

// idemState is a key's one-word state for tables: completed, in_flight (held) or stuck.
func idemState(k idempotency.KeyInfo) string {
	if k.Stuck() {
		return "stuck"
	}
	return k.State
}

// idemStatus is the stored status for tables, "-" while in flight.
func idemStatus(k idempotency.KeyInfo) string {
	if k.State != idempotency.StateCompleted {
		return "-"
	}
	return fmt.Sprint(k.Status)
}

func (a *app) idempotencyListCommand() *cobra.Command {
	var (
		inFlight, stuck bool
		limit           int
		lf              listFlags
	)
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List idempotency keys in (scope, key) order: state, attempts, status, expiry",
		Long: `List idempotency keys in (scope, key) order, judged by the database clock:

  STATE     completed (its response is stored), in_flight (a live attempt holds it) or
            stuck (in flight, but its holder's lease lapsed; the next request recovers it)
  ATTEMPTS  attempts that have held the key (more than 1: recovered from a dead holder)
  POINT     the last recovery point recorded ("-": none)
  STATUS    the stored response's status, and BODY its size in bytes
  EXPIRES   when the retention passes (then 'idempotency gc' removes it)

--in-flight lists only keys in flight, --stuck only stuck ones. An attempt's claim
commits at once, so every running attempt is listed. At most --limit keys are shown (a
note on stderr says when there are more).

With --json: an array ([] when empty) of objects with the keys scope, key, state, held,
stuck, holder, attempts, recovery_point, status, body_bytes, fingerprint (hex),
created_at, updated_at, completed_at, expires_at, db_now.`,
		Example: `  pgcoord idempotency list
  pgcoord idempotency list --stuck
  pgcoord idempotency list --in-flight --json | jq -r '.[] | .scope + " " + .key'`,
		Args: exactArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			if inFlight && stuck {
				return usagef("--in-flight and --stuck are mutually exclusive")
			}
			if limit < 1 {
				return usagef("--limit %d: want at least 1", limit)
			}
			if err := lf.checkPrefix(); err != nil {
				return err
			}
			pool, err := a.connect(ctx)
			if err != nil {
				return err
			}
			defer pool.Close()
			return a.show(ctx, cmd, &lf, func() error {
				return a.printIdemKeys(ctx, pool, idempotency.ListOpts{InFlight: inFlight, Stuck: stuck, ScopePrefix: lf.prefix}, limit)
			})
		},
	}
	f := cmd.Flags()
	f.BoolVar(&inFlight, "in-flight", false, "only keys in flight (held, or stuck)")
	f.BoolVar(&stuck, "stuck", false, "only in-flight keys whose holder died")
	f.IntVar(&limit, "limit", defaultListLimit, "show at most this many keys")
	addListFlags(cmd, &lf, "only keys whose scope starts with this")
	return cmd
}

// printIdemKeys reads at most limit keys by opts and prints them.
func (a *app) printIdemKeys(ctx context.Context, pool *pgxpool.Pool, opts idempotency.ListOpts, limit int) error {
	all, more, err := page.Collect(limit, idemPageSize, func(last *idempotency.KeyInfo, n int) ([]idempotency.KeyInfo, error) {
		if last != nil {
			opts.AfterScope, opts.AfterKey = last.Scope, last.Key
		}
		opts.Limit = n
		return idempotency.List(ctx, pool, &opts)
	})
	if err != nil {
		return argError(err)
	}
	if more {
		fmt.Fprintf(a.errOut, "pgcoord: showing the first %d idempotency keys; there are more (raise --limit)\n", limit)
	}
	if a.json {
		js := make([]idemKeyJSON, 0, len(all))
		for _, k := range all {
			js = append(js, toIdemKeyJSON(k))
		}
		return a.printJSON(js)
	}
	tw := a.table()
	fmt.Fprintln(tw, "SCOPE\tKEY\tSTATE\tATTEMPTS\tPOINT\tSTATUS\tBODY\tAGE\tEXPIRES")
	for _, k := range all {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\t%d\t%s\t%s\n", k.Scope, k.Key, idemState(k), k.Attempts,
			dash(k.RecoveryPoint), idemStatus(k), k.BodyBytes, age(k.CreatedAt, k.DBNow), rfc3339(k.ExpiresAt))
	}
	return tw.Flush()
}

// idemShowJSON is the --json output of `idempotency show`.
type idemShowJSON struct {
	idemKeyJSON
	Headers    http.Header `json:"headers"`
	BodyBase64 *string     `json:"body_base64"`
}

func (a *app) idempotencyShowCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "show SCOPE KEY",
		Short: "Show one idempotency key and its stored response (exit 1 if no such key)",
		Long: `Show one idempotency key — state, holder, attempts, recovery point, times — and its stored
response: status, stored headers and body (printed when it is text, at most 2000 bytes). A
key that does not exist is an error (exit 1).

With --json: the object of 'idempotency list --json' plus "headers" (an object of arrays,
null while in flight) and "body_base64" (the whole body, null while in flight).`,
		Example: `  pgcoord idempotency show http 8e03978e-40d5-43e8-bc93-6894a57f9324
  pgcoord idempotency show user:42 order-7 --json | jq -r .body_base64 | base64 -d`,
		Args: exactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			scope, key := args[0], args[1]
			if err := check.Name("idempotency scope", scope); err != nil {
				return usageError{err}
			}
			if err := idempotency.ValidateKey(key); err != nil {
				return usageError{err}
			}
			pool, err := a.connect(ctx)
			if err != nil {
				return err
			}
			defer pool.Close()
			k, err := idempotency.Get(ctx, pool, scope, key)
			if errors.Is(err, idempotency.ErrNotFound) {
				return fmt.Errorf("no such idempotency key %q in scope %q ('pgcoord idempotency list' shows the keys)", key, scope)
			}
			if err != nil {
				return argError(err)
			}
			if a.json {
				js := idemShowJSON{idemKeyJSON: toIdemKeyJSON(k)}
				if k.Response != nil {
					b := base64.StdEncoding.EncodeToString(k.Response.Body)
					js.Headers, js.BodyBase64 = k.Response.Header, &b
				}
				return a.printJSON(js)
			}
			tw := a.table()
			fmt.Fprintf(tw, "scope:\t%s\n", k.Scope)
			fmt.Fprintf(tw, "key:\t%s\n", k.Key)
			fmt.Fprintf(tw, "state:\t%s\n", idemState(k))
			fmt.Fprintf(tw, "holder:\t%s\n", k.Holder)
			fmt.Fprintf(tw, "attempts:\t%d\n", k.Attempts)
			fmt.Fprintf(tw, "recovery point:\t%s\n", dash(k.RecoveryPoint))
			fmt.Fprintf(tw, "fingerprint:\t%s\n", hex.EncodeToString(k.Fingerprint))
			fmt.Fprintf(tw, "created:\t%s (%s ago)\n", preciseTime(k.CreatedAt), age(k.CreatedAt, k.DBNow))
			fmt.Fprintf(tw, "completed:\t%s\n", preciseTime(k.CompletedAt))
			fmt.Fprintf(tw, "expires:\t%s (in %s)\n", preciseTime(k.ExpiresAt), age(k.DBNow, k.ExpiresAt))
			if k.Response != nil {
				fmt.Fprintf(tw, "status:\t%d\n", k.Response.Status)
				names := make([]string, 0, len(k.Response.Header))
				for name := range k.Response.Header {
					names = append(names, name)
				}
				sort.Strings(names)
				for _, name := range names {
					fmt.Fprintf(tw, "header:\t%s: %s\n", name, strings.Join(k.Response.Header[name], ", "))
				}
				fmt.Fprintf(tw, "body:\t%d bytes\n", len(k.Response.Body))
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			if k.Response != nil && len(k.Response.Body) > 0 {
				body := k.Response.Body
				if !utf8.Valid(body) {
					_, err = fmt.Fprintln(a.out, "(binary body; --json gives it in base64)")
					return err
				}
				if len(body) > idemShowBody {
					body = append(body[:idemShowBody:idemShowBody], "..."...)
				}
				_, err = fmt.Fprintf(a.out, "\n%s\n", base.PrintableLines(string(body)))
				return err
			}
			return nil
		},
	}
}

func (a *app) idempotencyGCCommand() *cobra.Command {
	var (
		batch     int
		tombstone time.Duration
		dryRun    bool
	)
	cmd := &cobra.Command{
		Use:   "gc",
		Short: "Delete expired idempotency keys in batches, leaving tombstones",
		Long: `Delete the idempotency keys whose retention has passed, by the database clock, in batches
of --batch keys, each its own short transaction, until none is left. Each deleted key leaves
a tombstone (scope, key, fingerprint) kept for --tombstone, during which a late retry with
the key is refused rather than executed again; expired tombstones are deleted too. A key
held by a live attempt is skipped.

--dry-run counts the expired keys and deletes nothing. On a terminal, progress goes to
stderr. With --json: {"deleted": N, "would_delete": null, "dry_run": false}, or with
--dry-run {"deleted": 0, "would_delete": N, "dry_run": true}.`,
		Example: `  pgcoord idempotency gc
  pgcoord idempotency gc --dry-run
  pgcoord idempotency gc --tombstone 720h --batch 10000 --json`,
		Args: exactArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			if batch < 1 || batch > idempotency.MaxGCBatch {
				return usagef("--batch %d: want 1 to %d", batch, idempotency.MaxGCBatch)
			}
			if tombstone <= 0 || tombstone > idempotency.MaxRetention {
				return usagef("--tombstone %v: want a positive duration up to %v", tombstone, idempotency.MaxRetention)
			}
			pool, err := a.connect(ctx)
			if err != nil {
				return err
			}
			defer pool.Close()
			rows := gcRows{progress: "expired idempotency keys", result: "expired idempotency keys",
				suffix: fmt.Sprintf(" (tombstones kept %v)", tombstone)}
			return a.runGCOneKind(dryRun, rows, func(progress func(int64)) (int64, error) {
				return idempotency.GC(ctx, pool, &idempotency.GCOpts{Tombstone: tombstone, Batch: batch, DryRun: dryRun, Progress: progress})
			}, func(n int64) error {
				return a.record(ctx, pool, "idempotency.gc", "", map[string]any{"deleted": n, "tombstone_seconds": int64(tombstone / time.Second)})
			})
		},
	}
	f := cmd.Flags()
	f.IntVar(&batch, "batch", idempotency.DefaultGCBatch, fmt.Sprintf("keys deleted per statement (1 to %d)", idempotency.MaxGCBatch))
	f.DurationVar(&tombstone, "tombstone", idempotency.DefaultTombstone, "how long a deleted key's tombstone refuses late retries")
	f.BoolVar(&dryRun, "dry-run", false, "count the expired keys, delete nothing")
	return cmd
}
