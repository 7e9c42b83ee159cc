// Package pgconfig builds the connection pools that pgcoord's own programs open: the CLI, the
// bench and the tests. (Library users bring their own pool.)
package pgconfig

import (
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Options says how to connect.
type Options struct {
	// AppName is the application_name the server shows in pg_stat_activity.
	AppName string
	// Schema, if set, becomes the connection's search_path, so pgcoord's objects are
	// created in and resolved from that schema.
	Schema string
	// StatementTimeout, if positive, is set as statement_timeout on every connection.
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
	}
	if opts.StatementTimeout > 0 {
		params["statement_timeout"] = strconv.FormatInt(opts.StatementTimeout.Milliseconds(), 10)
	}
	if opts.MaxConns > 0 {
		cfg.MaxConns = opts.MaxConns
	}
	return cfg, nil
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
