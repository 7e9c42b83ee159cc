package cli

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"regexp"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/pgcoord/pgcoord/pgcoord"
)

// leasesVersion is the migration that creates pgcoord_leases and the fence registers:
// rolling it back (or anything below it) forgets every lease and restarts fence tokens.
const leasesVersion = 2

func (a *app) migrateDownCommand() *cobra.Command {
	var (
		to                      int64
		all, dryRun, yes, force bool
	)
	cmd := &cobra.Command{
		Use:   "down",
		Short: "Roll back the newest migration, or down to --to N, or --all (drops pgcoord's tables and data)",
		Long: `Roll back the newest migration, or every one above --to N, or --all.

It first lists what it will roll back and the tables and sequences each migration drops,
then asks for confirmation (y/N) on a terminal; when standard input is not a terminal it
needs --yes. While any lease is held (an unexpired row in pgcoord_leases) it refuses to
roll back the leases migration unless --force: the holders would lose their leases, and
fence tokens would start again at 1, so guarded tables would refuse every writer.`,
		Args: exactArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			if all && cmd.Flags().Changed("to") {
				return usagef("--to and --all are mutually exclusive")
			}
			if to < 0 {
				return usagef("--to %d: versions start at 0", to)
			}
			pool, err := a.connect(ctx)
			if err != nil {
				return err
			}
			defer pool.Close()
			st, err := pgcoord.CheckSchema(ctx, pool)
			if err != nil && !errors.Is(err, pgcoord.ErrSchemaOutdated) {
				return err
			}
			var would []pgcoord.MigrationResult
			for i := len(st.Migrations) - 1; i >= 0; i-- {
				m := st.Migrations[i]
				if !m.Applied || m.Version <= to {
					continue
				}
				would = append(would, pgcoord.MigrationResult{Migration: m.Migration, Direction: "down"})
				if !all && !cmd.Flags().Changed("to") {
					break // the default rolls back the newest migration only
				}
			}
			if dryRun {
				if a.json {
					return a.printJSON(map[string]any{"dry_run": true, "would_roll_back": resultsJSON(would)})
				}
				a.printResults(would, "would roll back")
				return nil
			}
			if len(would) > 0 {
				if err := a.confirmRollback(ctx, pool, st.Schema, would, yes, force); err != nil {
					return err
				}
			}
			return a.rollBack(ctx, pool, to, all)
		},
	}
	f := cmd.Flags()
	f.Int64Var(&to, "to", 0, "roll back every migration above this version")
	f.BoolVar(&all, "all", false, "roll back every migration")
	f.BoolVar(&dryRun, "dry-run", false, "show what would be rolled back, change nothing")
	f.BoolVar(&yes, "yes", false, "do not ask for confirmation (needed when standard input is not a terminal)")
	f.BoolVar(&force, "force", false, "roll back the leases migration even while leases are held")
	return cmd
}

// confirmRollback shows what rolling back would drop and returns nil only if it may go
// ahead: no lease held (or force), and yes or a person's "y" on the terminal.
func (a *app) confirmRollback(ctx context.Context, pool *pgxpool.Pool, schema string, would []pgcoord.MigrationResult, yes, force bool) error {
	fmt.Fprintf(a.errOut, "pgcoord: migrate down in schema %q rolls back:\n", schema)
	dropsLeases := false
	for _, m := range would {
		dropped := "no table"
		if objs := droppedObjects(m.Version, m.Name); len(objs) > 0 {
			dropped = strings.Join(objs, ", ")
		}
		fmt.Fprintf(a.errOut, "  %05d_%s: drops %s\n", m.Version, m.Name, dropped)
		dropsLeases = dropsLeases || m.Version <= leasesVersion
	}
	if dropsLeases {
		var held int64
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM pgcoord_leases WHERE expires_at > pgcoord_now()`).Scan(&held); err != nil {
			return fmt.Errorf("count held leases: %w", err)
		}
		fmt.Fprintf(a.errOut, "  every lease and fence register goes, and fence tokens start again at 1: tables guarded by "+
			"'fence guard' then refuse every writer\n")
		if held > 0 && !force {
			return fmt.Errorf("refused: %d lease(s) are held in schema %q; nothing rolled back (wait until they are "+
				"released or expire, see 'pgcoord leases list --held', or pass --force)", held, schema)
		}
	}
	if yes {
		return nil
	}
	if !a.inIsTerminal() {
		return usagef("refused: standard input is not a terminal, so nobody can confirm; nothing rolled back (pass --yes)")
	}
	fmt.Fprintf(a.errOut, "Roll back %d migration(s)? [y/N] ", len(would))
	answer, _ := bufio.NewReader(a.in).ReadString('\n')
	switch strings.ToLower(strings.TrimSpace(answer)) {
	case "y", "yes":
		return nil
	}
	return errors.New("not confirmed: nothing rolled back")
}

// rollBack rolls back and records it in the audit log, when the log survives.
func (a *app) rollBack(ctx context.Context, pool *pgxpool.Pool, to int64, all bool) error {
	rolled, err := pgcoord.Rollback(ctx, pool, &pgcoord.RollbackOpts{To: to, All: all})
	a.printResults(rolled, "rolled back")
	if err != nil {
		return err
	}
	// Recorded where the audit log survives the rollback (it is dropped with its migration),
	// in the form it has after it: without session_role below migration 9.
	var logKept, hasSessionRole bool
	if err := pool.QueryRow(ctx, `
		SELECT to_regclass('pgcoord_audit') IS NOT NULL,
		       EXISTS (SELECT FROM pg_attribute WHERE attrelid = to_regclass('pgcoord_audit')
		                  AND attname = 'session_role' AND NOT attisdropped)`).Scan(&logKept, &hasSessionRole); err != nil {
		return err
	}
	if logKept && len(rolled) > 0 {
		versions := make([]int64, len(rolled))
		for i, m := range rolled {
			versions[i] = m.Version
		}
		details := map[string]any{"rolled_back": versions}
		record := func() error { return a.record(ctx, pool, "migrate.down", "", details) }
		if !hasSessionRole {
			record = func() error { return a.recordBefore9(ctx, pool, "migrate.down", details) }
		}
		if err := record(); err != nil {
			return err
		}
	}
	if a.json {
		return a.printJSON(map[string]any{"rolled_back": resultsJSON(rolled)})
	}
	return nil
}

// recordBefore9 writes the audit row of a rollback that left the audit log as migrations
// 7 and 8 made it, without session_role (which the generated query returns).
func (a *app) recordBefore9(ctx context.Context, pool *pgxpool.Pool, action string, details map[string]any) error {
	js, err := json.Marshal(details)
	if err != nil {
		return err
	}
	_, err = pool.Exec(ctx, `
		INSERT INTO pgcoord_audit (actor, remote_addr, action, target, details)
		VALUES ($1, coalesce(host(inet_client_addr()), 'local socket'), $2, '', $3::jsonb)`,
		a.actorName(), action, string(js))
	if err != nil {
		return fmt.Errorf("audit: %w", err)
	}
	return nil
}

var dropStatement = regexp.MustCompile(`(?im)^\s*DROP\s+(TABLE|SEQUENCE)\s+(?:IF\s+EXISTS\s+)?([a-z0-9_]+)`)

// droppedObjects lists the tables and sequences the Down section of a migration drops.
func droppedObjects(version int64, name string) []string {
	src, err := fs.ReadFile(pgcoord.MigrationsFS, fmt.Sprintf("%05d_%s.sql", version, name))
	if err != nil {
		return nil
	}
	_, down, _ := strings.Cut(string(src), "-- +goose Down")
	var out []string
	for _, m := range dropStatement.FindAllStringSubmatch(down, -1) {
		out = append(out, strings.ToLower(m[1])+" "+m[2])
	}
	return out
}

// stdinIsTerminal reports whether standard input is a terminal, where a person can answer.
func stdinIsTerminal() bool { return term.IsTerminal(int(os.Stdin.Fd())) }
