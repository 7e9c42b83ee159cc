package pgtest

import (
	"context"
	"net/url"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/internal/pgconfig"
)

// Stranger creates a role that can log in and has nothing else — no grant on any pgcoord
// table, function or schema, nor any attribute but LOGIN — the "other application" of the
// shared database, and returns a connection URL for it to the database pool reaches
// (directly, never through a pooler). The role is dropped when t ends, after its sessions
// are terminated. pool must be a pool of the shared test server (Pool, Schema).
func Stranger(t testing.TB, pool *pgxpool.Pool) string {
	t.Helper()
	ctx := context.Background()
	var db string
	if err := pool.QueryRow(ctx, `SELECT current_database()`).Scan(&db); err != nil {
		t.Fatalf("pgtest: stranger: %v", err)
	}
	u, err := url.Parse(URL(t))
	if err != nil {
		t.Fatalf("pgtest: stranger: %v", err)
	}
	role, password := "pgcoord_stranger_"+randomHex(6), randomHex(16)
	admin := adminPool(t, u.String())
	if _, err := admin.Exec(ctx, `CREATE ROLE `+pgconfig.QuoteIdent(role)+
		` LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOINHERIT NOREPLICATION NOBYPASSRLS PASSWORD '`+password+`'`); err != nil {
		t.Fatalf("pgtest: stranger: %v", err)
	}
	t.Cleanup(func() {
		_, _ = admin.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1`, role)
		if _, err := admin.Exec(ctx, `DROP ROLE `+pgconfig.QuoteIdent(role)); err != nil {
			t.Errorf("pgtest: drop stranger role: %v", err)
		}
	})
	u.User = url.UserPassword(role, password)
	u.Path = "/" + db
	q := u.Query()
	q.Set("application_name", "pgcoord-test-stranger")
	u.RawQuery = q.Encode()
	return u.String()
}
