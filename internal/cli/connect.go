package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/internal/pgconfig"
	"github.com/pgcoord/pgcoord/pgcoord"
)

// libpqVars are the libpq environment variables that choose a server, database or role;
// when none of them (nor --database-url, nor $PGCOORD_DATABASE_URL) is set, the CLI says
// so if the libpq defaults it then tries fail.
var libpqVars = []string{"PGHOST", "PGHOSTADDR", "PGPORT", "PGDATABASE", "PGUSER", "PGPASSWORD",
	"PGPASSFILE", "PGSERVICE", "PGSERVICEFILE", "PGSSLMODE", "PGOPTIONS", "PGCONNECT_TIMEOUT"}

// noDatabaseGiven reports whether nothing names a database: no flag, no $PGCOORD_DATABASE_URL,
// no libpq variable.
func (a *app) noDatabaseGiven() bool {
	if a.connString() != "" {
		return false
	}
	for _, v := range libpqVars {
		if _, ok := a.lookupEnv(v); ok {
			return false
		}
	}
	return true
}

// connString returns the connection string by the documented precedence.
func (a *app) connString() string {
	if a.databaseURL != "" {
		return a.databaseURL
	}
	if a.fileURL != "" {
		return a.fileURL
	}
	if u, ok := a.lookupEnv(EnvDatabaseURL); ok {
		return u
	}
	return "" // libpq PG* variables
}

// connSource names where connString came from, for messages.
func (a *app) connSource() string {
	switch {
	case a.databaseURL != "":
		return "--database-url"
	case a.fileURL != "":
		return "--database-url-file " + a.databaseURLFile
	case a.connString() != "":
		return "$" + EnvDatabaseURL
	}
	return "the libpq variables"
}

// maxURLFile bounds what --database-url-file reads.
const maxURLFile = 64 << 10

// resolveConnection checks the connection flags and reads --database-url-file, before a
// command runs; it warns on stderr when the command line holds a password.
func (a *app) resolveConnection() error {
	if a.databaseURL != "" && a.databaseURLFile != "" {
		return usagef("--database-url and --database-url-file: give one of them")
	}
	if a.databaseURLFile != "" {
		u, err := readURLFile(a.databaseURLFile)
		if err != nil {
			return usagef("--database-url-file %s: %v", a.databaseURLFile, err)
		}
		a.fileURL = u
	}
	if connStringHasPassword(a.databaseURL) {
		fmt.Fprintf(a.errOut, "pgcoord: warning: --database-url holds a password, which every user of this host "+
			"can see in the process list (ps) while pgcoord starts: give it with --database-url-file, $%s, "+
			"PGPASSFILE or PGSERVICE instead (docs/cli.md#keeping-the-password-secret)\n", EnvDatabaseURL)
	}
	if p := a.passFile(); p != "" {
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && runtime.GOOS != "windows" && fi.Mode().Perm()&0o077 != 0 {
			fmt.Fprintf(a.errOut, "pgcoord: warning: password file %s: group or others may access it (mode %04o); "+
				"libpq would ignore it, pgcoord reads it: chmod 600 %s\n", p, fi.Mode().Perm(), shellQuote(p))
		}
	}
	return nil
}

// passFile is the libpq password file pgx reads: $PGPASSFILE, else ~/.pgpass.
func (a *app) passFile() string {
	if p, ok := a.lookupEnv("PGPASSFILE"); ok {
		return p
	}
	if home, ok := a.lookupEnv("HOME"); ok && home != "" {
		return filepath.Join(home, ".pgpass")
	}
	return ""
}

// readURLFile reads the connection string a --database-url-file holds: one line (surrounding
// blanks and the final newline are dropped), from a file that neither the group nor others
// may read or write, as libpq asks of a password file.
func readURLFile(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		var pe *os.PathError
		if errors.As(err, &pe) {
			err = pe.Err // the path is in the message already
		}
		return "", err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return "", err
	}
	if fi.IsDir() {
		return "", errors.New("is a directory")
	}
	if perm := fi.Mode().Perm(); runtime.GOOS != "windows" && perm&0o077 != 0 {
		return "", fmt.Errorf("group or others may access it (mode %04o): it holds a password, so make it readable by "+
			"its owner only: chmod 600 %s", perm, shellQuote(path))
	}
	b, err := io.ReadAll(io.LimitReader(f, maxURLFile+1))
	if err != nil {
		return "", err
	}
	if len(b) > maxURLFile {
		return "", fmt.Errorf("larger than %d KiB: want one connection string", maxURLFile>>10)
	}
	u := strings.TrimSpace(string(b))
	switch {
	case u == "":
		return "", errors.New("is empty: want one connection string")
	case strings.ContainsAny(u, "\r\n"):
		return "", errors.New("holds more than one line: want one connection string")
	}
	return u, nil
}

// kvPassword finds a password in a key=value connection string.
var kvPassword = regexp.MustCompile(`(?:^|\s)(?:ssl)?password\s*=`)

// urlPassword finds a password in a connection URL's parameters.
var urlPassword = regexp.MustCompile(`[?&](?:ssl)?password=`)

// connStringHasPassword reports whether s holds a password: in a URL's user information
// (found as libpq finds it) or parameters, or as a key=value password.
func connStringHasPassword(s string) bool {
	p, ok := strings.CutPrefix(s, "postgresql://")
	if !ok {
		p, ok = strings.CutPrefix(s, "postgres://")
	}
	if !ok {
		return kvPassword.MatchString(s)
	}
	if i := strings.IndexAny(p, "@/"); i >= 0 && p[i] == '@' {
		if _, pw, _ := strings.Cut(p[:i], ":"); pw != "" {
			return true
		}
	}
	return urlPassword.MatchString(p)
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
		var pe *pgconfig.ParseError
		switch {
		case errors.As(err, &pe):
			return nil, usagef("cannot parse the connection string from %s: %s", a.connSource(), pe.Reason)
		case errors.Is(err, pgconfig.ErrAmbiguousURL):
			return nil, usagef("%s: %v", a.connSource(), err)
		}
		return nil, usagef("bad connection string from %s: %v", a.connSource(), err)
	}
	return cfg, nil
}

// dbSchema is what connect found: the schema the connection resolves pgcoord's objects in
// (nil when its search_path names no existing schema) and whether pgcoord is installed there.
type dbSchema struct {
	found     bool
	current   *string
	installed bool
}

// connect opens a pool and checks that the server answers, noting the schema it resolves.
func (a *app) connect(ctx context.Context) (*pgxpool.Pool, error) {
	cfg, err := a.poolConfig(4)
	if err != nil {
		return nil, err
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	var s dbSchema
	err = pool.QueryRow(ctx, `SELECT current_schema(), EXISTS (
		SELECT 1 FROM pg_catalog.pg_tables WHERE schemaname = current_schema() AND tablename = $1)`,
		pgcoord.VersionTable).Scan(&s.current, &s.installed)
	if err != nil {
		pool.Close()
		if a.noDatabaseGiven() {
			return nil, usagef("no database given: --database-url, --database-url-file, $%s and the libpq variables (%s) are all unset, "+
				"so the libpq defaults were tried: %s (user and database: your login name; host: the local socket "+
				"directory, else localhost; port 5432), which failed: %v", EnvDatabaseURL, strings.Join(libpqVars, ", "), pgconfig.Describe(cfg), err)
		}
		hint := ""
		if strings.Contains(err.Error(), "unsupported startup parameter") {
			hint = " (a pooler such as PgBouncer refuses startup parameters: select pgcoord's schema with a pooler " +
				"database alias rather than --schema; see docs/pgbouncer.md)"
		}
		return nil, fmt.Errorf("connect to %s: %w%s", pgconfig.Describe(cfg), err, hint)
	}
	s.found = true
	a.db = s
	return pool, nil
}

// explainMissingTable turns "relation pgcoord_... does not exist" (SQLSTATE 42P01) into what
// to do about it, naming the schema that was looked in; other errors are returned unchanged.
func (a *app) explainMissingTable(err error) error {
	var pgErr *pgconn.PgError
	if !a.db.found || !errors.As(err, &pgErr) || pgErr.Code != "42P01" || !strings.Contains(pgErr.Message, `"pgcoord_`) {
		return err
	}
	how := "the connection's search_path"
	if a.schema != "" {
		how = "--schema"
	}
	switch {
	case a.db.current == nil:
		return fmt.Errorf("%s: no schema found: %s names none that exists; install pgcoord with 'pgcoord%s migrate up' "+
			"(which creates the --schema), or pass --schema with the schema pgcoord is installed in", pgErr.Message, how, a.schemaFlag())
	case !a.db.installed:
		return fmt.Errorf("%s: pgcoord is not installed in schema %q (from %s): run 'pgcoord%s migrate up' to install it, "+
			"or pass --schema with the schema pgcoord is installed in", pgErr.Message, *a.db.current, how, a.schemaFlag())
	default:
		return fmt.Errorf("%s: schema %q (from %s) lacks a migration this command needs: run 'pgcoord%s migrate up' "+
			"('pgcoord migrate status' lists what is pending)", pgErr.Message, *a.db.current, how, a.schemaFlag())
	}
}

// currentSchema names, quoted, the schema connect found the connection resolves, or says
// there is none.
func (a *app) currentSchema() string {
	if a.db.current == nil {
		return "(none: the search_path names no existing schema)"
	}
	return fmt.Sprintf("%q", *a.db.current)
}

// schemaFlag is " --schema NAME" when --schema was given, for commands the CLI suggests.
func (a *app) schemaFlag() string {
	if a.schema == "" {
		return ""
	}
	return " --schema " + shellQuote(a.schema)
}

// shellQuote quotes s for a POSIX shell, unless it needs no quoting.
func shellQuote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.:/") == "" {
		return s
	}
	if !strings.ContainsAny(s, "\"$`\\!") { // reads better inside the single-quoted hints
		return `"` + s + `"`
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
