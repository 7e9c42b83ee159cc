package singleton_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/internal/pgconfig"
	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/pgcoord"
)

func TestMain(m *testing.M) {
	pgtest.NeedsSessionExamples("^ExampleRunSession$") // a session-level lock: ErrPooler behind a pooler
	pgtest.Main(m)
}

// migrated returns a pool of maxConns connections on a fresh schema with pgcoord migrated,
// and the schema's name.
func migrated(t *testing.T, maxConns int32) (*pgxpool.Pool, string) {
	t.Helper()
	_, schema := pgtest.Schema(t)
	pool := poolOn(t, schema, maxConns)
	if _, err := pgcoord.Migrate(t.Context(), pool, nil); err != nil {
		t.Fatal(err)
	}
	return pool, schema
}

// poolOn opens another pool on schema, closed when t ends.
func poolOn(t *testing.T, schema string, maxConns int32) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgconfig.Pool(pgtest.URL(t), pgconfig.Options{AppName: "pgcoord-test", Schema: schema, MaxConns: maxConns})
	if err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// lockHolder returns the backend pid holding the session- or transaction-level advisory
// lock of job's current generation, or 0 if nobody holds it.
func lockHolder(ctx context.Context, t *testing.T, pool *pgxpool.Pool, job string) int32 {
	t.Helper()
	var pid int32
	err := pool.QueryRow(ctx, `SELECT coalesce(max(l.pid), 0) FROM pgcoord_singletons s, pg_locks l
		WHERE s.job = $1 AND l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
		  AND l.classid = ((pgcoord_singleton_key(s.job, s.gen) >> 32) & 4294967295)::oid
		  AND l.objid = (pgcoord_singleton_key(s.job, s.gen) & 4294967295)::oid`, job).Scan(&pid)
	if err != nil {
		t.Fatal(err)
	}
	return pid
}

// eventually polls cond every 10ms until it returns nil or d passes, and then fails t with
// cond's last error.
func eventually(t *testing.T, d time.Duration, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %v: %v", d, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// within waits for ch to deliver, at most d.
func within[T any](t *testing.T, d time.Duration, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(d):
		t.Fatalf("%s: nothing after %v", what, d)
		panic("unreachable")
	}
}

func terminate(ctx context.Context, t *testing.T, pool *pgxpool.Pool, pid int32) {
	t.Helper()
	var ok bool
	if err := pool.QueryRow(ctx, `SELECT pg_terminate_backend($1)`, pid).Scan(&ok); err != nil || !ok {
		t.Fatalf("pg_terminate_backend(%d) = %v, %v", pid, ok, err)
	}
}
