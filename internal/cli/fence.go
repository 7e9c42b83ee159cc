package cli

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/pgcoord/pgcoord/fenced"
	"github.com/pgcoord/pgcoord/pgcoord"
)

func (a *app) fenceCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "fence",
		Short: "Fenced writes: make the database refuse writes with a stale fence token",
		Args:  noSubcommand,
		RunE:  func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	cmd.AddCommand(a.fenceGuardCommand())
	return cmd
}

// guardJSON is the --json output of `fence guard`.
type guardJSON struct {
	Table          string `json:"table"`
	Column         string `json:"column"`
	ResourceColumn string `json:"resource_column"`
	ResourcePrefix string `json:"resource_prefix"`
	Events         string `json:"events"`
	Trigger        string `json:"trigger"`
	Installed      bool   `json:"installed"`
}

func (a *app) fenceGuardCommand() *cobra.Command {
	var (
		remove bool
		opts   fenced.GuardOpts
	)
	cmd := &cobra.Command{
		Use:   "guard TABLE COLUMN",
		Short: "Install (or --remove) the trigger that makes the database refuse stale fence tokens",
		Long: `Install on TABLE (optionally schema.table, resolved through the search path) a trigger
that refuses stale writes with SQLSTATE PGC01, whichever code path sends them. COLUMN is
the table's integer fence column (the token each row was written with).

Without --resource-column the trigger judges UPDATEs only: it refuses an UPDATE that would
lower COLUMN or set it to NULL. INSERTs are not judged, so an insert-only table (a ledger)
is not protected, and neither is an UPDATE that leaves COLUMN unchanged.

With --resource-column C the trigger judges every INSERT and UPDATE: the row's token must
pass the fence register of the resource named --resource-prefix followed by the row's C
(e.g. --resource-column order_id --resource-prefix order: judges a row of order 42 as
resource "order:42"), exactly as fenced.Check would, which refuses a token lower than the
newest grant of the lease of that name or than the highest token written for it. A row
without a token or a resource is refused.

The trigger is named pgcoord_fence_guard_<COLUMN>; installing it again is harmless, and
with other options replaces it. --remove drops it (removing a guard that is not there is
not an error).

TABLE, COLUMN and C must be plain identifiers (letters, digits, _), COLUMN a bigint,
integer or smallint column of TABLE and C a column of TABLE; anything else is a usage
error (exit 2). With --json: {"table", "column", "resource_column", "resource_prefix",
"events", "trigger", "installed"}.`,
		Example: `  pgcoord fence guard payments fence_token
  pgcoord fence guard charges fence_token --resource-column order_id --resource-prefix order:
  pgcoord fence guard billing.invoices fence_token --remove`,
		Args: exactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			table, column := args[0], args[1]
			if remove && (opts.ResourceColumn != "" || opts.ResourcePrefix != "") {
				return usageError{errors.New("--remove takes no --resource-column or --resource-prefix")}
			}
			pool, err := a.connect(ctx)
			if err != nil {
				return err
			}
			defer pool.Close()
			action := "fence.guard_install"
			if remove {
				action = "fence.guard_remove"
			}
			err = a.audited(ctx, pool, action, table+"."+column, func(tx pgx.Tx) (map[string]any, error) {
				if remove {
					return map[string]any{}, fenced.RemoveGuard(ctx, tx, table, column)
				}
				return map[string]any{"resource_column": opts.ResourceColumn, "resource_prefix": opts.ResourcePrefix},
					fenced.InstallGuard(ctx, tx, table, column, &opts)
			})
			if err != nil {
				if errors.Is(err, pgcoord.ErrInvalidArgument) && tableMissing(ctx, pool, table) {
					return fmt.Errorf("%w (an unqualified TABLE is looked up through the search path, first in schema %s; "+
						"name another schema's table as schema.table)", err, a.currentSchema())
				}
				return argError(err)
			}
			trigger := fenced.GuardTriggerName(column)
			events := "UPDATE"
			if opts.ResourceColumn != "" {
				events = "INSERT, UPDATE"
			}
			if a.json {
				g := guardJSON{Table: table, Column: column, ResourceColumn: opts.ResourceColumn, ResourcePrefix: opts.ResourcePrefix,
					Events: events, Trigger: trigger, Installed: !remove}
				if remove {
					g.Events = ""
				}
				return a.printJSON(g)
			}
			switch {
			case remove:
				_, err = fmt.Fprintf(a.out, "guard trigger %s is not on %s (any more): the database no longer checks writes of %s\n", trigger, table, column)
			case opts.ResourceColumn != "":
				_, err = fmt.Fprintf(a.out, "installed guard trigger %s on %s: an INSERT or UPDATE whose %s is stale for the resource %q || %s now fails with SQLSTATE %s\n",
					trigger, table, column, opts.ResourcePrefix, opts.ResourceColumn, fenced.GuardSQLState)
			default:
				_, err = fmt.Fprintf(a.out, "installed guard trigger %s on %s: an UPDATE that lowers %s or sets it to NULL now fails with SQLSTATE %s (INSERTs are not checked: see --resource-column)\n",
					trigger, table, column, fenced.GuardSQLState)
			}
			return err
		},
	}
	cmd.Flags().BoolVar(&remove, "remove", false, "remove the guard trigger instead of installing it")
	cmd.Flags().StringVar(&opts.ResourceColumn, "resource-column", "", "judge every INSERT and UPDATE against the fence register of the resource this column names")
	cmd.Flags().StringVar(&opts.ResourcePrefix, "resource-prefix", "", "put before the resource column's value to name the resource (e.g. order:)")
	return cmd
}

// tableMissing reports whether table, a name that parses, resolves to no relation: a table
// that does not exist is a failure (exit 1), not a usage error. parse_ident refuses a name
// that does not parse on every server version (to_regclass answers NULL for it from
// PostgreSQL 16 on).
func tableMissing(ctx context.Context, pool *pgxpool.Pool, table string) bool {
	var missing bool
	err := pool.QueryRow(ctx, `SELECT cardinality(parse_ident($1)) > 0 AND to_regclass($1) IS NULL`, table).Scan(&missing)
	return err == nil && missing
}
