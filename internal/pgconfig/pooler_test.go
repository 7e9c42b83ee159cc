package pgconfig_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/internal/pgconfig"
	"github.com/pgcoord/pgcoord/internal/pgtest"
)

// schemaCheck opens a pool with cfg and returns the first query's error.
func schemaCheck(t *testing.T, cfg *pgxpool.Config) error {
	t.Helper()
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	var schema *string
	return pool.QueryRow(context.Background(), "SELECT current_schema()").Scan(&schema)
}

// A requested schema that does not reach the server — the search_path startup parameter
// dropped on the way, as a pooler does — fails the connection with ErrSchemaNotApplied
// instead of letting pgcoord resolve another schema. (Simulated here by not sending it.)
func TestSchemaNotAppliedIsDetected(t *testing.T) {
	t.Parallel()
	_, schema := pgtest.Schema(t)
	cfg, err := pgconfig.Pool(pgtest.URL(t), pgconfig.Options{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	if err := schemaCheck(t, cfg); err != nil {
		t.Fatalf("the schema applied: %v", err)
	}
	delete(cfg.ConnConfig.RuntimeParams, "search_path") // dropped on the way
	if err := schemaCheck(t, cfg); !errors.Is(err, pgconfig.ErrSchemaNotApplied) {
		t.Fatalf("search_path dropped: %v, want ErrSchemaNotApplied", err)
	}
	// A schema that does not exist yet resolves to none: that is for migrate to report.
	cfg, err = pgconfig.Pool(pgtest.URL(t), pgconfig.Options{Schema: pgtest.SchemaName(t)})
	if err != nil {
		t.Fatal(err)
	}
	if err := schemaCheck(t, cfg); err != nil {
		t.Fatalf("a schema not created yet: %v", err)
	}
}

// Through a real PgBouncer that drops search_path (ignore_startup_parameters), a schema
// asked for against a plain pooler database is caught.
func TestSchemaDroppedByPgBouncerIsDetected(t *testing.T) {
	pgtest.NeedsPooler(t)
	t.Parallel()
	_, schema := pgtest.Schema(t)
	cfg, err := pgconfig.Pool(pgtest.PoolerURL(t, ""), pgconfig.Options{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	if err := schemaCheck(t, cfg); !errors.Is(err, pgconfig.ErrSchemaNotApplied) {
		t.Fatalf("search_path through PgBouncer: %v, want ErrSchemaNotApplied", err)
	}
	cfg, err = pgconfig.Pool(pgtest.PoolerURL(t, schema), pgconfig.Options{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	if err := schemaCheck(t, cfg); err != nil {
		t.Fatalf("through the schema's alias: %v", err)
	}
}

// Through a real PgBouncer in transaction mode, which refuses a statement_timeout startup
// parameter, a pool with a statement timeout connects, and the timeout still cancels a slow
// statement on the server.
func TestStatementTimeoutThroughPgBouncer(t *testing.T) {
	pgtest.NeedsPooler(t)
	t.Parallel()
	_, schema := pgtest.Schema(t)
	cfg, err := pgconfig.Pool(pgtest.PoolerURL(t, schema), pgconfig.Options{Schema: schema, StatementTimeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	assertStatementTimeout(t, pool)
}
