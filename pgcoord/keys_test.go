package pgcoord_test

import (
	"context"
	"errors"
	"testing"

	"github.com/pgcoord/pgcoord/internal/pgconfig"
	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/pgcoord"
)

func TestLockKeyIsNamespacedBySchema(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	poolA, schemaA := pgtest.Schema(t)
	poolB, schemaB := pgtest.Schema(t)
	pgtest.Migrate(t, poolA, nil)
	pgtest.Migrate(t, poolB, nil)
	keyA, err := pgcoord.LockKey(ctx, poolA, "report")
	if err != nil {
		t.Fatal(err)
	}
	keyB, err := pgcoord.LockKey(ctx, poolB, "report")
	if err != nil {
		t.Fatal(err)
	}
	if keyA == keyB {
		t.Fatalf("schemas %s and %s derive the same key %d for one name: their locks would collide", schemaA, schemaB, keyA)
	}
	other, err := pgcoord.LockKey(ctx, poolA, "invoice")
	if err != nil || other == keyA {
		t.Fatalf("two names in one schema share key %d (err %v)", keyA, err)
	}
	again, err := pgcoord.LockKey(ctx, poolA, "report")
	if err != nil || again != keyA {
		t.Fatalf("LockKey is not stable: %d then %d (err %v)", keyA, again, err)
	}

	// A caller whose search_path reaches schema A's pgcoord through another schema first
	// (one where pgcoord is not installed) still gets A's key: the schema is baked in at
	// install time, not read from the caller's search_path.
	_, schemaC := pgtest.Schema(t)
	mixed := pgtest.NewPool(t, pgtest.URL(t), "")
	conn, err := mixed.Begin(ctx) // SET LOCAL in a transaction: it works through a pooler too
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Rollback(ctx)
	if _, err := conn.Exec(ctx, "SET LOCAL search_path = "+pgconfig.QuoteIdent(schemaC)+", "+pgconfig.QuoteIdent(schemaA)); err != nil {
		t.Fatal(err)
	}
	viaPath, err := pgcoord.LockKey(ctx, conn, "report")
	if err != nil || viaPath != keyA {
		t.Fatalf("key through search_path (%s, %s) = %d, %v; want schema A's %d", schemaC, schemaA, viaPath, err, keyA)
	}
}

func TestLockKeyRejectsBadNamesBeforeSQL(t *testing.T) {
	t.Parallel()
	// A nil handle proves no SQL runs: validation must fail first.
	_, err := pgcoord.LockKey(context.Background(), nil, "")
	if !errors.Is(err, pgcoord.ErrInvalidName) {
		t.Fatalf("LockKey(\"\") err = %v, want ErrInvalidName", err)
	}
}
