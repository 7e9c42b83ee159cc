// Package cli implements the pgcoord command. Commands are thin: each calls the same public
// API a Go user calls and formats the result as a table or, with --json, as JSON.
package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/pgcoord/pgcoord/internal/pgconfig"
)

// Exit codes of the pgcoord command.
const (
	ExitOK      = 0 // success
	ExitFailure = 1 // the command failed
	ExitUsage   = 2 // bad flags, arguments or command
	ExitCheck   = 3 // a check ran and answered "no" (pending migrations, overdue job, ...)
)

// EnvDatabaseURL is the variable read when --database-url is not given. When neither is
// set, the libpq variables (PGHOST, PGPORT, PGUSER, PGPASSWORD, PGDATABASE, ...) apply.
const EnvDatabaseURL = "PGCOORD_DATABASE_URL"

// AppName is the application_name of every connection the CLI opens.
const AppName = "pgcoord-cli"

// usageError marks an error in how the command was called (exit code 2).
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

func usagef(format string, args ...any) error { return usageError{fmt.Errorf(format, args...)} }

// errCheckFailed reports that a check ran and answered "no" (exit code 3); the command has
// already printed why.
var errCheckFailed = errors.New("check failed")

// app holds the global flags and the output streams of one run.
type app struct {
	out, errOut      io.Writer
	databaseURL      string
	schema           string
	json             bool
	statementTimeout time.Duration
	lookupEnv        func(string) (string, bool)
	started          bool // a command's RunE began: errors from here on are not usage errors
}

// Run runs the pgcoord command with args (without the program name) and returns its exit
// code. Output goes to out, logs and errors to errOut.
func Run(ctx context.Context, args []string, out, errOut io.Writer) int {
	a := &app{out: out, errOut: errOut, lookupEnv: os.LookupEnv}
	root := a.rootCommand()
	root.SetArgs(args)
	root.SetOut(out)
	root.SetErr(errOut)
	err := root.ExecuteContext(ctx)
	switch {
	case err == nil:
		return ExitOK
	case errors.Is(err, errCheckFailed):
		return ExitCheck
	case errors.As(err, new(exitCode)): // the command chose its exit status and said why
		return exitCodeOf(err)
	}
	msg := err.Error()
	if !strings.HasPrefix(msg, "pgcoord: ") { // errors of package pgcoord name it already
		msg = "pgcoord: " + msg
	}
	fmt.Fprintln(errOut, msg)
	var ue usageError
	if !a.started || errors.As(err, &ue) {
		fmt.Fprintln(errOut, "Run 'pgcoord --help' for usage.")
		return ExitUsage
	}
	return ExitFailure
}

func (a *app) rootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:   "pgcoord",
		Short: "Operate pgcoord: Postgres-only coordination (leases, fencing, cron singletons, ...)",
		Long: `pgcoord operates the pgcoord coordination toolkit in a PostgreSQL database.

Connection: --database-url, else $PGCOORD_DATABASE_URL, else the libpq variables
(PGHOST, PGPORT, PGUSER, PGPASSWORD, PGDATABASE, ...). pgcoord's objects are resolved
through search_path; --schema selects the schema pgcoord is installed in.

Exit codes: 0 ok, 1 failure, 2 usage error, 3 a check ran and answered "no".`,
		SilenceErrors: true,
		SilenceUsage:  true,
		PersistentPreRunE: func(cmd *cobra.Command, args []string) error {
			a.started = true
			if a.statementTimeout < 0 {
				return usagef("--statement-timeout %v: want 0 (no timeout) or a positive duration", a.statementTimeout)
			}
			return nil
		},
	}
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	pf := root.PersistentFlags()
	pf.StringVar(&a.databaseURL, "database-url", "", "connection string (default $"+EnvDatabaseURL+", then libpq PG* variables)")
	pf.StringVar(&a.schema, "schema", "", "schema pgcoord is installed in (default: the connection's search_path)")
	pf.BoolVar(&a.json, "json", false, "print JSON instead of a table (read commands)")
	pf.DurationVar(&a.statementTimeout, "statement-timeout", 30*time.Second, "server-side timeout of each statement (0: none)")
	root.AddCommand(a.versionCommand(), a.migrateCommand(), a.benchCommand(), a.leasesCommand(), a.fenceCommand(), a.dedupeCommand(), a.jobsCommand(), a.semaphoresCommand())
	root.AddCommand(a.outboxCommand())
	root.AddCommand(a.idempotencyCommand())
	root.AddCommand(a.uiCommand(), a.metricsCommand(), a.auditCommand())
	root.AddCommand(a.doctorCommand(), a.gcCommand())
	return root
}

// connString returns the connection string by the documented precedence.
func (a *app) connString() string {
	if a.databaseURL != "" {
		return a.databaseURL
	}
	if u, ok := a.lookupEnv(EnvDatabaseURL); ok {
		return u
	}
	return "" // libpq PG* variables
}

// poolConfig builds the pool configuration for this run.
func (a *app) poolConfig(maxConns int32) (*pgxpool.Config, error) {
	cfg, err := pgconfig.Pool(a.connString(), pgconfig.Options{
		AppName:          AppName,
		Schema:           a.schema,
		StatementTimeout: a.statementTimeout,
		MaxConns:         maxConns,
	})
	if err != nil {
		return nil, usagef("bad connection string: %v", err)
	}
	return cfg, nil
}

// connect opens a pool and checks that the server answers.
func (a *app) connect(ctx context.Context) (*pgxpool.Pool, error) {
	cfg, err := a.poolConfig(4)
	if err != nil {
		return nil, err
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		hint := ""
		if strings.Contains(err.Error(), "unsupported startup parameter") {
			hint = " (a pooler such as PgBouncer refuses startup parameters: pass --statement-timeout 0, and " +
				"select pgcoord's schema with a pooler database alias rather than --schema; see docs/pgbouncer.md)"
		}
		return nil, fmt.Errorf("connect to %s: %w%s", pgconfig.Describe(cfg), err, hint)
	}
	return pool, nil
}

// printJSON writes v as indented JSON followed by a newline.
func (a *app) printJSON(v any) error {
	enc := json.NewEncoder(a.out)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// table returns a tab-aligned writer on the output; call Flush when done.
func (a *app) table() *tabwriter.Writer {
	return tabwriter.NewWriter(a.out, 0, 4, 2, ' ', 0)
}

// exactArgs is cobra.ExactArgs reporting a usage error.
func exactArgs(n int) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) != n {
			return usagef("%s takes %d argument(s), got %d", cmd.CommandPath(), n, len(args))
		}
		return nil
	}
}

// rfc3339 formats t in UTC for JSON and tables; the zero time becomes "".
func rfc3339(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format(time.RFC3339)
}

// noSubcommand is the Args of a command that only groups subcommands: any argument is an
// unknown subcommand, a usage error (exit 2), rather than a reason to print help and exit 0.
func noSubcommand(cmd *cobra.Command, args []string) error {
	if len(args) > 0 {
		return usagef("unknown command %q for %q", args[0], cmd.CommandPath())
	}
	return nil
}
