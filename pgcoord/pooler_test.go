package pgcoord_test

import (
	"context"
	"errors"
	"testing"

	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/pgcoord"
)

// Through PgBouncer in transaction mode goose's session lock would neither exclude a
// concurrent migration nor be released, so Migrate and Rollback refuse with ErrPooler
// before changing anything.
func TestMigrateBehindPoolerRefuses(t *testing.T) {
	pgtest.NeedsPooler(t)
	t.Parallel()
	ctx := context.Background()
	pool, _ := pgtest.Schema(t)
	if res, err := pgcoord.Migrate(ctx, pool, nil); !errors.Is(err, pgcoord.ErrPooler) || len(res) != 0 {
		t.Fatalf("Migrate behind a pooler = (%v, %v), want ErrPooler", res, err)
	}
	var tables int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_tables WHERE schemaname = current_schema()`).Scan(&tables); err != nil {
		t.Fatal(err)
	}
	if tables != 0 {
		t.Fatalf("Migrate refused but created %d tables", tables)
	}
	if _, err := pgcoord.Rollback(ctx, pgtest.Pool(t), nil); !errors.Is(err, pgcoord.ErrPooler) {
		t.Fatalf("Rollback behind a pooler = %v, want ErrPooler", err)
	}
}
