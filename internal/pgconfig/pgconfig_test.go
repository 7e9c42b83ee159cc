package pgconfig_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/internal/pgconfig"
	"github.com/pgcoord/pgcoord/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// The server applies what Pool sets: application_name, search_path (quoted, so any schema
// name works) and statement_timeout, which really cancels a slow statement.
func TestPoolSettingsReachTheServer(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cfg, err := pgconfig.Pool(pgtest.URL(t), pgconfig.Options{
		AppName: "pgcoord-config-test", Schema: `odd "schema" name`, StatementTimeout: 200 * time.Millisecond, MaxConns: 2,
	})
	if err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	var app, path, timeout string
	if err := pool.QueryRow(ctx, `SELECT current_setting('application_name'), current_setting('search_path'),
		current_setting('statement_timeout')`).Scan(&app, &path, &timeout); err != nil {
		t.Fatal(err)
	}
	if app != "pgcoord-config-test" || path != `"odd ""schema"" name"` || timeout != "200ms" {
		t.Fatalf("server sees application_name %q, search_path %q, statement_timeout %q", app, path, timeout)
	}
	if _, err := pool.Exec(ctx, `SELECT pg_sleep(5)`); err == nil {
		t.Fatal("a 5 s statement outlived the 200 ms statement_timeout")
	}
	if pool.Config().MaxConns != 2 {
		t.Fatalf("MaxConns = %d", pool.Config().MaxConns)
	}
}

func TestParseErrorsHidePassword(t *testing.T) {
	t.Parallel()
	_, err := pgconfig.Pool("postgres://u:hunter2@host:notaport/db", pgconfig.Options{})
	if err == nil {
		t.Fatal("a bad port parsed")
	}
	if got := err.Error(); strings.Contains(got, "hunter2") {
		t.Fatalf("parse error shows the password: %s", got)
	}
}
