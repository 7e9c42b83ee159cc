package cli

import (
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/pgcoord/pgcoord/internal/base"
	"github.com/pgcoord/pgcoord/internal/pgconfig"
	"github.com/pgcoord/pgcoord/pgcoord"
)

func (a *app) migrateCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "migrate",
		Short: "Apply, roll back, inspect or print pgcoord's schema migrations",
		Args:  noSubcommand,
		RunE:  func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	cmd.AddCommand(a.migrateUpCommand(), a.migrateDownCommand(), a.migrateStatusCommand(), a.migrateSQLCommand())
	return cmd
}

// migrationJSON is one migration in --json output.
type migrationJSON struct {
	Version    int64   `json:"version"`
	Name       string  `json:"name"`
	Direction  string  `json:"direction,omitempty"`
	DurationMS float64 `json:"duration_ms,omitempty"`
	Applied    *bool   `json:"applied,omitempty"`
	AppliedAt  string  `json:"applied_at,omitempty"`
}

func resultsJSON(rs []pgcoord.MigrationResult) []migrationJSON {
	out := make([]migrationJSON, 0, len(rs))
	for _, r := range rs {
		out = append(out, migrationJSON{Version: r.Version, Name: r.Name, Direction: r.Direction,
			DurationMS: float64(r.Duration.Microseconds()) / 1000})
	}
	return out
}

func (a *app) migrateUpCommand() *cobra.Command {
	var to int64
	cmd := &cobra.Command{
		Use:   "up",
		Short: "Apply pending migrations (creating the --schema if it does not exist)",
		Args:  exactArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			if to < 0 || to > pgcoord.LatestVersion() {
				return usagef("--to %d: this build has versions 1 to %d", to, pgcoord.LatestVersion())
			}
			pool, err := a.connect(ctx)
			if err != nil {
				return err
			}
			defer pool.Close()
			if a.schema != "" {
				if _, err := pool.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+pgconfig.QuoteIdent(a.schema)); err != nil {
					return fmt.Errorf("create schema %q: %w", a.schema, err)
				}
			}
			applied, err := pgcoord.Migrate(ctx, pool, &pgcoord.MigrateOpts{To: to})
			a.printResults(applied, "applied")
			if err != nil {
				return err
			}
			if a.json {
				return a.printJSON(map[string]any{"applied": resultsJSON(applied)})
			}
			return nil
		},
	}
	cmd.Flags().Int64Var(&to, "to", 0, "migrate up to this version (default: the latest)")
	return cmd
}

// printResults prints one line per migration in human mode (to stderr when --json is set,
// so scripts get clean JSON and people still see progress).
func (a *app) printResults(rs []pgcoord.MigrationResult, verb string) {
	w := a.out
	if a.json {
		w = a.errOut
	}
	if len(rs) == 0 {
		fmt.Fprintf(w, "nothing %s\n", verb)
		return
	}
	for _, r := range rs {
		fmt.Fprintf(w, "%s %05d_%s (%s)\n", verb, r.Version, r.Name, r.Duration.Round(time.Millisecond))
	}
}

func (a *app) migrateStatusCommand() *cobra.Command {
	var check bool
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show applied and pending migrations; with --check, exit 3 if any is pending",
		Args:  exactArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			pool, err := a.connect(ctx)
			if err != nil {
				return err
			}
			defer pool.Close()
			st, err := pgcoord.CheckSchema(ctx, pool)
			if err != nil && !errors.Is(err, pgcoord.ErrSchemaOutdated) {
				return err
			}
			pending := st.Pending()
			if a.json {
				ms := make([]migrationJSON, 0, len(st.Migrations))
				for _, m := range st.Migrations {
					applied := m.Applied
					ms = append(ms, migrationJSON{Version: m.Version, Name: m.Name, Applied: &applied, AppliedAt: rfc3339(m.AppliedAt)})
				}
				if err := a.printJSON(map[string]any{
					"schema": st.Schema, "current_version": st.Current, "latest_version": st.Latest,
					"pending": len(pending), "migrations": ms,
				}); err != nil {
					return err
				}
			} else {
				fmt.Fprintf(a.out, "schema %s: version %d of %d, %d pending\n\n", base.Printable(st.Schema), st.Current, st.Latest, len(pending))
				tw := a.table()
				fmt.Fprintln(tw, "VERSION\tNAME\tAPPLIED AT")
				for _, m := range st.Migrations {
					at := "pending"
					if m.Applied {
						at = rfc3339(m.AppliedAt)
					}
					name := m.Name
					if m.Unknown {
						name = "(unknown to this build: migrated by a newer pgcoord)"
					}
					fmt.Fprintf(tw, "%05d\t%s\t%s\n", m.Version, name, at)
				}
				tw.Flush()
			}
			if check && len(pending) > 0 {
				fmt.Fprintf(a.errOut, "pgcoord: %d migration(s) pending in schema %s; run 'pgcoord migrate up'\n", len(pending), base.Printable(st.Schema))
				return errCheckFailed
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&check, "check", false, "exit 3 if any migration is pending")
	return cmd
}

func (a *app) migrateSQLCommand() *cobra.Command {
	var from int64
	cmd := &cobra.Command{
		Use:   "sql",
		Short: "Print the migrations as one SQL script, for psql or your own migration tool",
		Long: `Print pgcoord's up migrations as one plain SQL script. Each migration runs in its own
transaction and records itself in the pgcoord_migrations table, exactly as 'migrate up'
would. Needs no database. Apply it with: pgcoord migrate sql | psql -v ON_ERROR_STOP=1`,
		Args: exactArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if from < 0 {
				return usagef("--from %d: versions start at 0", from)
			}
			script, err := pgcoord.MigrationScript(from)
			if err != nil {
				return err
			}
			_, err = fmt.Fprint(a.out, script)
			return err
		},
	}
	cmd.Flags().Int64Var(&from, "from", 0, "print only migrations above this version (the schema's current one, to upgrade)")
	return cmd
}
