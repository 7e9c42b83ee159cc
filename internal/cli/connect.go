package cli

import (
	"context"
	"errors"
	"fmt"
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
			return nil, usagef("no database given: --database-url, $%s and the libpq variables (%s) are all unset, "+
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
