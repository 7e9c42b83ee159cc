//go:build unix

package integration_test

import (
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/internal/workerproc"
)

// Worker processes (see internal/workerproc). A test that needs real processes — to stop
// one with SIGSTOP (a real GC pause, not a simulation), kill one with SIGKILL, or run
// holders that share nothing but the database — starts this test binary again with
// startWorker; TestMain runs the worker's role instead of the tests. Register a role in
// workerRoles from an init function.

// workerRoles maps a role name to the function a worker process runs.
var workerRoles = map[string]workerproc.Role{}

// startWorker starts a worker process, named name, running role against the database url
// and schema, with params as its role parameters. The process is always gone when t ends:
// t's cleanup continues it (in case it is stopped), kills it and waits for it, bounded.
func startWorker(t testing.TB, name, role, url, schema string, params map[string]string) (*workerproc.Proc, error) {
	return startWorkerSpec(t, workerproc.Spec{Name: name, Role: role, URL: url, Schema: schema, Params: params})
}

// startWorkerSpec is startWorker for a spec that sets more (a lifetime).
func startWorkerSpec(t testing.TB, spec workerproc.Spec) (*workerproc.Proc, error) {
	if pgtest.BehindPooler() && spec.URL == pgtest.URL(t) {
		spec.URL = pgtest.PoolerURL(t, spec.Schema) // in pooler mode the workers go through PgBouncer too
	}
	p, err := workerproc.Start(spec)
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() {
		if err := p.Stop(0); err != nil {
			t.Error(err)
		}
	})
	return p, nil
}

// workerDB returns a pool on a fresh test schema, pgcoord migrated, and the schema's name
// for startWorker, after creating in it what the test's workers use (ddl: their tables and
// triggers).
func workerDB(t *testing.T, ddl string) (*pgxpool.Pool, string) {
	t.Helper()
	pool := pgtest.Pool(t)
	var schema string
	if err := pool.QueryRow(t.Context(), "SELECT current_schema()").Scan(&schema); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(t.Context(), ddl); err != nil {
		t.Fatal(err)
	}
	return pool, schema
}
