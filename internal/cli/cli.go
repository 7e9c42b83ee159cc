// Package cli implements the pgcoord command. Commands are thin: each calls the same public
// API a Go user calls and formats the result as a table or, with --json, as JSON.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/pgcoord/pgcoord/internal/base"
	"github.com/pgcoord/pgcoord/internal/pgconfig"
	"github.com/pgcoord/pgcoord/internal/ui/audit"
)

// EnvDatabaseURL is the variable read when --database-url is not given. When neither is
// set, the libpq variables (PGHOST, PGPORT, PGUSER, PGPASSWORD, PGDATABASE, ...) apply.
const EnvDatabaseURL = "PGCOORD_DATABASE_URL"

// AppName is the application_name of every connection the CLI opens.
const AppName = "pgcoord-cli"

// app holds the global flags and the output streams of one run.
type app struct {
	out, errOut      io.Writer
	databaseURL      string
	databaseURLFile  string // --database-url-file
	fileURL          string // what it holds
	schema           string
	json             bool
	statementTimeout time.Duration
	actor            string // --actor: who acts, for the audit log
	lookupEnv        func(string) (string, bool)
	in               io.Reader   // standard input: where confirmations are read
	inIsTerminal     func() bool // whether in is a terminal, so a person can be asked
	started          bool        // a command's RunE began: errors from here on are not usage errors
	db               dbSchema    // what connect found
}

// Run runs the pgcoord command with args (without the program name) and returns its exit
// code. Output goes to out, logs and errors to errOut.
func Run(ctx context.Context, args []string, out, errOut io.Writer) int {
	a := &app{out: out, errOut: errOut, lookupEnv: os.LookupEnv, in: os.Stdin, inIsTerminal: stdinIsTerminal}
	return a.run(ctx, args)
}

// run runs the command line args with a's streams and returns the exit code.
func (a *app) run(ctx context.Context, args []string) int {
	out, errOut := a.out, a.errOut
	root := a.rootCommand()
	root.SetIn(a.in)
	root.SetArgs(args)
	root.SetOut(out)
	root.SetErr(errOut)
	cmd, err := root.ExecuteContextC(ctx)
	switch {
	case err == nil:
		return ExitOK
	case errors.Is(err, errCheckFailed):
		return ExitCheck
	case errors.As(err, new(exitCode)): // the command chose its exit status and said why
		return exitCodeOf(err)
	}
	err = a.explainMissingTable(err)
	if timedOut, unknown := pgconfig.IsStatementTimeout(err); timedOut && ctx.Err() == nil && a.statementTimeout > 0 {
		if unknown {
			err = fmt.Errorf("%w (a statement ran longer than --statement-timeout %v; if it was a write, whether it committed is unknown: check before you retry)", err, a.statementTimeout)
		} else {
			err = fmt.Errorf("%w (a statement ran longer than --statement-timeout %v)", err, a.statementTimeout)
		}
	}
	// An error may quote what the database holds (a holder, a stored error): printable
	// line by line, so it cannot drive the terminal.
	msg := base.PrintableLines(err.Error())
	if !strings.HasPrefix(msg, "pgcoord: ") { // errors of package pgcoord name it already
		msg = "pgcoord: " + msg
	}
	fmt.Fprintln(errOut, msg)
	var ue usageError
	if !a.started || errors.As(err, &ue) {
		if cmd == nil {
			cmd = root
		}
		fmt.Fprintf(errOut, "Run '%s --help' for usage.\n", cmd.CommandPath())
		return ExitUsage
	}
	return ExitFailure
}

func (a *app) rootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:   "pgcoord",
		Short: "Operate pgcoord: Postgres-only coordination (leases, fencing, cron singletons, ...)",
		Long: `pgcoord operates the pgcoord coordination toolkit in a PostgreSQL database.

Connection: --database-url or --database-url-file, else $PGCOORD_DATABASE_URL, else the
libpq variables (PGHOST, PGPORT, PGUSER, PGPASSWORD, PGPASSFILE, PGSERVICE, PGDATABASE,
...). A password in --database-url shows in the process list: prefer the others.
pgcoord's objects are resolved through search_path; --schema selects the schema pgcoord
is installed in.

Exit codes: 0 ok, 1 failure, 2 usage error, 3 a check ran and answered "no".`,
		SilenceErrors: true,
		SilenceUsage:  true,
		PersistentPreRunE: func(cmd *cobra.Command, args []string) error {
			a.started = true
			if a.statementTimeout < 0 {
				return usagef("--statement-timeout %v: want 0 (no timeout) or a positive duration", a.statementTimeout)
			}
			if err := audit.CheckActor(a.actorName()); err != nil {
				return usagef("--actor %q: %v", a.actorName(), err)
			}
			if err := a.resolveConnection(); err != nil {
				return err
			}
			hideSecrets(a)
			return nil
		},
	}
	root.SetFlagErrorFunc(flagError)
	pf := root.PersistentFlags()
	pf.StringVar(&a.databaseURL, "database-url", "", "connection string (default $"+EnvDatabaseURL+", then libpq PG* variables); a password in it shows in ps: prefer --database-url-file")
	pf.StringVar(&a.databaseURLFile, "database-url-file", "", "file holding the connection string (one line; mode 600 or stricter)")
	pf.StringVar(&a.schema, "schema", "", "schema pgcoord is installed in (default: the connection's search_path)")
	pf.BoolVar(&a.json, "json", false, "print JSON instead of a table (read commands)")
	pf.DurationVar(&a.statementTimeout, "statement-timeout", 30*time.Second, "timeout of each statement: one running longer is cancelled on the server (0: none)")
	pf.StringVar(&a.actor, "actor", "", "who acts, recorded in the audit log by state-changing commands (default $USER@host)")
	root.AddCommand(a.versionCommand(), a.migrateCommand(), a.benchCommand(), a.leasesCommand(), a.fenceCommand(), a.dedupeCommand(), a.jobsCommand(), a.semaphoresCommand())
	root.AddCommand(a.outboxCommand())
	root.AddCommand(a.idempotencyCommand(), a.ratelimitCommand(), a.schedulesCommand(), a.partitionsCommand())
	root.AddCommand(a.uiCommand(), a.metricsCommand(), a.auditCommand())
	root.AddCommand(a.doctorCommand(), a.gcCommand())
	setUpGroups(root)
	return root
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
