// Package pgconfig builds the connection pools that pgcoord's own programs open: the CLI, the
// bench and the tests. (Library users bring their own pool.)
package pgconfig

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Options says how to connect.
type Options struct {
	// AppName is the application_name the server shows in pg_stat_activity.
	AppName string
	// Schema, if set, becomes the connection's search_path, so pgcoord's objects are
	// created in and resolved from that schema. Every new connection checks that the server
	// resolves it (see ErrSchemaNotApplied).
	Schema string
	// StatementTimeout, if positive, bounds every statement: one still running after it is
	// cancelled (SQLSTATE 57014) by a cancel request, which works through any pooler. A
	// statement that may commit fails with a timeout error instead, its outcome unknown:
	// see IsStatementTimeout.
	StatementTimeout time.Duration
	// MaxConns, if positive, caps the pool's size.
	MaxConns int32
}

// Pool parses connString — a postgres:// URL or key=value string; empty means the libpq PG*
// environment variables (PGPASSFILE and PGSERVICE included) — and applies opts. Parse
// errors never contain the connection string nor any value quoted from it (see ParseError),
// and a URL whose parts cannot be told apart for sure is refused (see ErrAmbiguousURL).
func Pool(connString string, opts Options) (*pgxpool.Config, error) {
	if err := checkURL(connString); err != nil {
		return nil, err
	}
	cfg, err := pgxpool.ParseConfig(connString)
	if err != nil {
		return nil, parseError(err)
	}
	params := cfg.ConnConfig.RuntimeParams
	if opts.AppName != "" {
		params["application_name"] = opts.AppName
	}
	if opts.Schema != "" {
		params["search_path"] = QuoteIdent(opts.Schema)
		cfg.AfterConnect = checkSchema(opts.Schema)
	}
	if opts.StatementTimeout > 0 {
		withStatementTimeout(cfg.ConnConfig, opts.StatementTimeout)
	}
	if opts.MaxConns > 0 {
		cfg.MaxConns = opts.MaxConns
	}
	return cfg, nil
}

// ErrSchemaNotApplied is the error (wrapped) of a new connection on which the server resolves
// a schema other than Options.Schema: the search_path startup parameter did not reach the
// server. PgBouncer does that when its ignore_startup_parameters lists search_path (it
// drops the parameter silently; without that setting it refuses the connection with
// "unsupported startup parameter: search_path"). pgcoord would otherwise read and write
// another schema's tables. Behind PgBouncer, select the schema with a database alias whose
// connect_query sets search_path (see docs/pgbouncer.md).
var ErrSchemaNotApplied = errors.New("pgconfig: the server did not apply the requested schema (search_path); a pooler such as PgBouncer drops it: select the schema with a pooler database alias (connect_query) instead, see docs/pgbouncer.md")

// checkSchema returns an AfterConnect hook that fails a connection whose current schema is
// an existing schema other than schema. (A search_path naming only a schema that does not
// exist yet resolves to none, which is how pgcoord's migrate finds out; that passes.) It
// uses the simple protocol, which works through any pooler.
func checkSchema(schema string) func(context.Context, *pgx.Conn) error {
	return func(ctx context.Context, conn *pgx.Conn) error {
		var current *string
		err := conn.QueryRow(ctx, "SELECT current_schema()", pgx.QueryExecModeSimpleProtocol).Scan(&current)
		if err != nil {
			return fmt.Errorf("pgconfig: checking the connection's schema: %w", err)
		}
		if current != nil && *current != schema {
			return fmt.Errorf("%w: asked for %q, the server resolves %q", ErrSchemaNotApplied, schema, *current)
		}
		return nil
	}
}

// QuoteIdent quotes a Postgres identifier (a schema name, say) for use in SQL text.
func QuoteIdent(name string) string {
	return pgx.Identifier{name}.Sanitize()
}

// Describe names the server and database of a config for messages, without the password.
func Describe(cfg *pgxpool.Config) string {
	c := cfg.ConnConfig
	return fmt.Sprintf("%s@%s:%d/%s", c.User, c.Host, c.Port, c.Database)
}

// ErrAmbiguousURL is the error of a postgres:// URL with a raw '@' after its user
// information. libpq (and pgx, which parses as libpq does) ends the user information at the
// first '@', or finds none when a '/' comes first: a password holding a raw '@' or '/' is
// cut there, and the rest of it becomes the host, the port or the database — which a
// connection error then shows. Percent-encode such characters (%40 for '@', %2F for '/').
var ErrAmbiguousURL = errors.New("the connection URL has an '@' after its user information: " +
	"percent-encode '@' as %40 and '/' as %2F in a password (or user, database or parameter), " +
	"else part of the password is taken for the host, port or database")

// checkURL refuses a postgres:// URL with a raw '@' after the user information as libpq
// finds it (up to the first '@' before any '/').
func checkURL(connString string) error {
	p, ok := strings.CutPrefix(connString, "postgresql://")
	if !ok {
		if p, ok = strings.CutPrefix(connString, "postgres://"); !ok {
			return nil
		}
	}
	if i := strings.IndexAny(p, "@/"); i >= 0 && p[i] == '@' {
		p = p[i+1:]
	}
	if strings.Contains(p, "@") {
		return ErrAmbiguousURL
	}
	return nil
}

// ParseError is a connection string that did not parse. Its text says what was wrong
// without the connection string and without any value quoted from it: pgx masks the
// password in its own message only as well as it can tell where the password is, which a
// malformed string makes uncertain ("password = x", a stray word after a space).
type ParseError struct {
	// Reason is what was wrong ("invalid port"), with no value quoted from the string.
	Reason string
}

func (e *ParseError) Error() string { return "cannot parse the connection string: " + e.Reason }

// quoted is a value pgx's parse errors quote ("parsing \"x\": invalid syntax").
var quoted = regexp.MustCompile(`"[^"]*"`)

// parseError turns an error of pgx's ParseConfig into a ParseError.
func parseError(err error) error {
	var pe *pgconn.ParseConfigError
	if !errors.As(err, &pe) {
		return &ParseError{Reason: "malformed"}
	}
	// pgx's text is "cannot parse `<masked string>`: <what> (<cause>)"; the prefix is known
	// exactly by asking for the same text with no <what>.
	full := pe.Error()
	tail, ok := strings.CutPrefix(full, pgconn.NewParseConfigError(pe.ConnString, "", nil).Error())
	if !ok || tail == "" {
		return &ParseError{Reason: "malformed"}
	}
	return &ParseError{Reason: quoted.ReplaceAllString(tail, `"…"`)}
}
