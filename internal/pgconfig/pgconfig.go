// Package pgconfig builds the connection pools that pgcoord's own programs open: the CLI, the
// bench and the tests. (Library users bring their own pool.)
package pgconfig

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
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
// environment variables — and applies opts. Parse errors never contain the password.
func Pool(connString string, opts Options) (*pgxpool.Config, error) {
	cfg, err := pgxpool.ParseConfig(connString)
	if err != nil {
		return nil, err // pgconn redacts passwords in parse errors
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
