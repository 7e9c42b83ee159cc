package pgcoord_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/pgcoord"
)

// objects counts pgcoord's objects (functions and tables named pgcoord_*) in schema.
func objects(t *testing.T, pool *pgxpool.Pool, schema string) int {
	t.Helper()
	var n int
	err := pool.QueryRow(context.Background(), `
		SELECT (SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
		         WHERE n.nspname = $1 AND p.proname LIKE 'pgcoord\_%')
		     + (SELECT count(*) FROM pg_tables WHERE schemaname = $1 AND tablename LIKE 'pgcoord\_%'
		         AND tablename <> 'pgcoord_migrations')`, schema).Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func TestMigrateRoundTrip(t *testing.T) {
	needsSession(t)
	t.Parallel()
	ctx := context.Background()
	pool, schema := pgtest.Schema(t)

	st, err := pgcoord.CheckSchema(ctx, pool)
	if !errors.Is(err, pgcoord.ErrSchemaOutdated) {
		t.Fatalf("CheckSchema on an empty schema: err = %v, want ErrSchemaOutdated", err)
	}
	if st.Schema != schema || st.Current != 0 || len(st.Pending()) != len(pgcoord.Migrations()) {
		t.Fatalf("empty schema status = %+v", st)
	}

	for round := 0; round < 2; round++ {
		applied, err := pgcoord.Migrate(ctx, pool, nil)
		if err != nil {
			t.Fatalf("round %d: Migrate: %v", round, err)
		}
		if len(applied) != len(pgcoord.Migrations()) {
			t.Fatalf("round %d: applied %d migrations, want %d", round, len(applied), len(pgcoord.Migrations()))
		}
		for i, r := range applied {
			if r.Version != pgcoord.Migrations()[i].Version || r.Direction != "up" || r.Name == "" {
				t.Fatalf("round %d: result %d = %+v", round, i, r)
			}
		}
		st, err = pgcoord.CheckSchema(ctx, pool)
		if err != nil || st.Current != pgcoord.LatestVersion() || len(st.Pending()) != 0 {
			t.Fatalf("round %d: after Migrate: status %+v, err %v", round, st, err)
		}
		for _, m := range st.Migrations {
			if m.AppliedAt.IsZero() {
				t.Fatalf("round %d: migration %d has no applied time", round, m.Version)
			}
		}
		if objects(t, pool, schema) == 0 {
			t.Fatalf("round %d: Migrate created no pgcoord objects in %s", round, schema)
		}
		again, err := pgcoord.Migrate(ctx, pool, nil)
		if err != nil || len(again) != 0 {
			t.Fatalf("round %d: second Migrate applied %v, err %v; want nothing", round, again, err)
		}

		rolled, err := pgcoord.Rollback(ctx, pool, &pgcoord.RollbackOpts{All: true})
		if err != nil || len(rolled) != len(pgcoord.Migrations()) {
			t.Fatalf("round %d: Rollback all = %v, %v", round, rolled, err)
		}
		if n := objects(t, pool, schema); n != 0 {
			t.Fatalf("round %d: %d pgcoord objects left after rolling back everything", round, n)
		}
		if _, err := pgcoord.CheckSchema(ctx, pool); !errors.Is(err, pgcoord.ErrSchemaOutdated) {
			t.Fatalf("round %d: CheckSchema after rollback: %v", round, err)
		}
	}
}

func TestRollbackOneStepAndNothingLeft(t *testing.T) {
	needsSession(t)
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t)
	rolled, err := pgcoord.Rollback(ctx, pool, nil)
	if err != nil || len(rolled) != 1 || rolled[0].Version != pgcoord.LatestVersion() || rolled[0].Direction != "down" {
		t.Fatalf("Rollback one step = %+v, %v", rolled, err)
	}
	if _, err := pgcoord.Rollback(ctx, pool, &pgcoord.RollbackOpts{All: true}); err != nil {
		t.Fatal(err)
	}
	rolled, err = pgcoord.Rollback(ctx, pool, nil)
	if err != nil || len(rolled) != 0 {
		t.Fatalf("Rollback with nothing applied = %+v, %v; want nothing, no error", rolled, err)
	}
}

func TestMigrateBadInput(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	if _, err := pgcoord.Migrate(ctx, nil, nil); err == nil {
		t.Error("Migrate(nil pool) succeeded")
	}
	// Validation happens before any SQL: no pool is needed to see these errors.
	for _, to := range []int64{-1, pgcoord.LatestVersion() + 1} {
		if _, err := pgcoord.Migrate(ctx, nil, &pgcoord.MigrateOpts{To: to}); err == nil || !strings.Contains(err.Error(), "no version") {
			t.Errorf("Migrate To=%d: err = %v, want 'no version'", to, err)
		}
	}
	if _, err := pgcoord.Rollback(ctx, nil, &pgcoord.RollbackOpts{All: true, To: 1}); err == nil || !strings.Contains(err.Error(), "mutually exclusive") {
		t.Errorf("Rollback All+To: err = %v", err)
	}
	if _, err := pgcoord.CheckSchema(ctx, nil); err == nil {
		t.Error("CheckSchema(nil) succeeded")
	}
}

func TestMigrateWithoutSchemaRefuses(t *testing.T) {
	t.Parallel()
	pool := pgtest.NewPool(t, pgtest.URL(t), pgtest.SchemaName(t)) // search_path names a schema that does not exist
	_, err := pgcoord.Migrate(context.Background(), pool, nil)
	if err == nil || !strings.Contains(err.Error(), "no existing schema") {
		t.Fatalf("Migrate with no schema on search_path: err = %v", err)
	}
}

// Replicas of a service typically all call Migrate at startup: each migration must be
// applied exactly once.
func TestMigrateConcurrentCallsApplyOnce(t *testing.T) {
	needsSession(t)
	t.Parallel()
	ctx := context.Background()
	pool, _ := pgtest.Schema(t)
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		total int
		errs  []error
	)
	for range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			applied, err := pgcoord.Migrate(ctx, pool, nil)
			mu.Lock()
			defer mu.Unlock()
			total += len(applied)
			if err != nil {
				errs = append(errs, err)
			}
		}()
	}
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("concurrent Migrate errors: %v", errs)
	}
	if total != len(pgcoord.Migrations()) {
		t.Fatalf("6 concurrent Migrate calls applied %d migrations in total, want %d", total, len(pgcoord.Migrations()))
	}
}

// An application that uses goose for its own migrations, in the same schema, keeps its
// version table and its lock; pgcoord's never touch them.
func TestMigrateLeavesApplicationGooseAlone(t *testing.T) {
	needsSession(t)
	t.Parallel()
	ctx := context.Background()
	pool, _ := pgtest.Schema(t)
	_, err := pool.Exec(ctx, `
		CREATE TABLE goose_db_version (id serial PRIMARY KEY, version_id bigint NOT NULL,
			is_applied boolean NOT NULL, tstamp timestamp NOT NULL DEFAULT now());
		INSERT INTO goose_db_version (version_id, is_applied) VALUES (0, true), (20240101, true), (20240202, true);`)
	if err != nil {
		t.Fatal(err)
	}
	// Hold goose's default advisory lock the way a running application migration would.
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock(4097083626)`); err != nil {
		t.Fatal(err)
	}
	defer conn.Exec(ctx, `SELECT pg_advisory_unlock(4097083626)`)

	if _, err := pgcoord.Migrate(ctx, pool, nil); err != nil {
		t.Fatalf("Migrate beside the application's goose: %v", err)
	}
	var appVersions int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM goose_db_version WHERE version_id > 0`).Scan(&appVersions); err != nil {
		t.Fatal(err)
	}
	if appVersions != 2 {
		t.Fatalf("application's goose_db_version has %d versions, want its 2 untouched", appVersions)
	}
	if _, err := pgcoord.CheckSchema(ctx, pool); err != nil {
		t.Fatal(err)
	}
}

// The migration lock is derived from the schema, so schemas migrate independently: a
// migration held up in one schema does not block another.
func TestMigrateLockIsPerSchema(t *testing.T) {
	needsSession(t)
	t.Parallel()
	ctx := context.Background()
	poolA, schemaA := pgtest.Schema(t)
	poolB, _ := pgtest.Schema(t)
	conn, err := poolA.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	// Take schema A's migration lock, as a slow migration in A would hold it.
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock(hashtextextended('pgcoord.migrate:' || $1, 0))`, schemaA); err != nil {
		t.Fatal(err)
	}
	defer conn.Exec(ctx, `SELECT pg_advisory_unlock_all()`)
	if _, err := pgcoord.Migrate(ctx, poolB, nil); err != nil {
		t.Fatalf("Migrate of schema B while A's lock is held: %v", err)
	}
	// And A's lock is really the one Migrate takes: with it held, a Migrate of A waits.
	short, cancel := context.WithTimeout(ctx, 1500*time.Millisecond)
	defer cancel()
	if _, err := pgcoord.Migrate(short, poolA, nil); err == nil {
		t.Fatal("Migrate of schema A succeeded while A's migration lock was held elsewhere")
	}
}

// A team that applies the SQL script with its own tool ends in the same state as Migrate.
func TestMigrationScriptMatchesMigrate(t *testing.T) {
	needsSession(t)
	t.Parallel()
	ctx := context.Background()
	pool, schema := pgtest.Schema(t)
	script, err := pgcoord.MigrationScript(0)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(script, "+goose") {
		t.Fatalf("script still has goose annotations:\n%s", script)
	}
	if _, err := pool.Exec(ctx, script); err != nil {
		t.Fatalf("applying the script: %v\n%s", err, script)
	}
	st, err := pgcoord.CheckSchema(ctx, pool)
	if err != nil || st.Current != pgcoord.LatestVersion() {
		t.Fatalf("after the script: %+v, %v", st, err)
	}
	if applied, err := pgcoord.Migrate(ctx, pool, nil); err != nil || len(applied) != 0 {
		t.Fatalf("Migrate after the script applied %v, %v; want nothing", applied, err)
	}
	if _, err := pgcoord.Rollback(ctx, pool, &pgcoord.RollbackOpts{All: true}); err != nil {
		t.Fatalf("Rollback after the script: %v", err)
	}
	if n := objects(t, pool, schema); n != 0 {
		t.Fatalf("%d objects left", n)
	}

	upgrade, err := pgcoord.MigrationScript(pgcoord.LatestVersion())
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(upgrade, "VALUES (") {
		t.Fatalf("script after the latest version still applies migrations:\n%s", upgrade)
	}
	if _, err := pgcoord.MigrationScript(-1); err == nil {
		t.Fatal("MigrationScript(-1) succeeded")
	}
}

// needsSession skips a test of migrating itself in pooler mode: migrations need a session
// (goose's session lock), and behind a pooler Migrate refuses (pooler_test.go).
func needsSession(t *testing.T) {
	t.Helper()
	pgtest.NeedsSession(t, "migrations (goose's session lock); behind a pooler Migrate returns ErrPooler (pooler_test.go)")
}
