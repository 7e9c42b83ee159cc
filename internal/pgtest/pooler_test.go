package pgtest_test

import (
	"context"
	"testing"

	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/pgcoord"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// In pooler mode a test's pool really goes through PgBouncer — the server's process id
// differs from the one the connection was handed, as behind any pooler — yet resolves the
// test's own schema, migrated; in the normal mode it is a direct connection.
func TestPoolerModePoolsGoThroughThePooler(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t)
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	var schema string
	var pid uint32
	if err := conn.QueryRow(ctx, "SELECT current_schema(), pg_backend_pid()").Scan(&schema, &pid); err != nil {
		t.Fatal(err)
	}
	if want := pool.Config().ConnConfig.RuntimeParams["search_path"]; `"`+schema+`"` != want {
		t.Fatalf("the pool resolves schema %q, want %s", schema, want)
	}
	if direct := pid == conn.Conn().PgConn().PID(); direct == pgtest.BehindPooler() {
		t.Fatalf("BehindPooler() = %v, but the connection is direct = %v", pgtest.BehindPooler(), direct)
	}
	st, err := pgcoord.CheckSchema(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Pending()) != 0 || st.Schema != schema {
		t.Fatalf("schema %s: %d migrations pending", st.Schema, len(st.Pending()))
	}
}

// Two tests' schemas never mix through the pooler: each alias's server connections keep
// their own search_path, whichever server connection a transaction lands on.
func TestPoolerModeSchemasStayApart(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	a, b := pgtest.Pool(t), pgtest.Pool(t)
	if _, err := a.Exec(ctx, "CREATE TABLE mine (v text)"); err != nil {
		t.Fatal(err)
	}
	for range 20 {
		var n int
		if err := b.QueryRow(ctx, "SELECT count(*) FROM pg_tables WHERE tablename = 'mine' AND schemaname = current_schema()").Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n != 0 {
			t.Fatal("schema b sees the table created in schema a")
		}
		if _, err := a.Exec(ctx, "INSERT INTO mine VALUES ('x')"); err != nil {
			t.Fatal(err)
		}
	}
}

// PoolerURL hands a worker process or the CLI a URL that reaches the schema, through the
// pooler in pooler mode.
func TestPoolerURLReachesTheSchema(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, schema := pgtest.Schema(t)
	pool := pgtest.NewPool(t, pgtest.PoolerURL(t, schema), "")
	var got string
	if err := pool.QueryRow(ctx, "SELECT current_schema()").Scan(&got); err != nil {
		t.Fatal(err)
	}
	if got != schema {
		t.Fatalf("PoolerURL resolves schema %q, want %q", got, schema)
	}
}
