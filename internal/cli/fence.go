package cli

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/pgcoord/pgcoord/fenced"
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
	Table     string `json:"table"`
	Column    string `json:"column"`
	Trigger   string `json:"trigger"`
	Installed bool   `json:"installed"`
}

func (a *app) fenceGuardCommand() *cobra.Command {
	var remove bool
	cmd := &cobra.Command{
		Use:   "guard TABLE COLUMN",
		Short: "Install (or --remove) the trigger that refuses any UPDATE lowering a fence column",
		Long: `Install on TABLE (optionally schema.table, resolved through the search path) a trigger
that refuses, with SQLSTATE PGC01, any UPDATE that would lower the integer fence column
COLUMN or set it to NULL, whichever code path sends it. The trigger is named
pgcoord_fence_guard_<COLUMN>; installing it again is harmless. It cannot catch an UPDATE
that leaves the column unchanged: writes that skip fencing altogether must still be
prevented in code. --remove drops the trigger (removing a guard that is not there is not
an error).

TABLE and COLUMN must be plain identifiers (letters, digits, _), and COLUMN a bigint,
integer or smallint column of TABLE; anything else is a usage error (exit 2). With --json:
{"table", "column", "trigger", "installed"}.`,
		Example: `  pgcoord fence guard payments fence_token
  pgcoord fence guard billing.invoices fence_token --remove`,
		Args: exactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			table, column := args[0], args[1]
			pool, err := a.connect(ctx)
			if err != nil {
				return err
			}
			defer pool.Close()
			if remove {
				err = fenced.RemoveGuard(ctx, pool, table, column)
			} else {
				err = fenced.InstallGuard(ctx, pool, table, column)
			}
			if err != nil {
				return argError(err)
			}
			trigger := "pgcoord_fence_guard_" + column // the name fenced gives it (see InstallGuard)
			if a.json {
				return a.printJSON(guardJSON{Table: table, Column: column, Trigger: trigger, Installed: !remove})
			}
			if remove {
				_, err = fmt.Fprintf(a.out, "guard trigger %s is not on %s (any more): the database no longer checks UPDATEs of %s\n", trigger, table, column)
				return err
			}
			_, err = fmt.Fprintf(a.out, "installed guard trigger %s on %s: an UPDATE that lowers %s or sets it to NULL now fails with SQLSTATE %s\n",
				trigger, table, column, fenced.GuardSQLState)
			return err
		},
	}
	cmd.Flags().BoolVar(&remove, "remove", false, "remove the guard trigger instead of installing it")
	return cmd
}
