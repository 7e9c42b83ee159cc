package pgcoord_test

import (
	"context"
	"errors"
	"fmt"
	"log"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/pgcoord"
)

// emptySchemaPool returns a pool on a fresh schema without pgcoord's objects, as a new
// application's database is before its first Migrate.
func emptySchemaPool() *pgxpool.Pool {
	pool := pgtest.ExamplePool() // migrated: undo it
	if _, err := pgcoord.Rollback(context.Background(), pool, &pgcoord.RollbackOpts{All: true}); err != nil {
		panic(err)
	}
	return pool
}

// At startup, on every replica: install or upgrade pgcoord's tables and functions in the
// schema the pool's search_path names. Migrate needs a session: run it on a direct
// connection, not through PgBouncer in transaction mode (it refuses with ErrPooler).
func ExampleMigrate() {
	ctx := context.Background()
	pool := emptySchemaPool() // your *pgxpool.Pool, on a direct connection

	applied, err := pgcoord.Migrate(ctx, pool, nil)
	if err != nil {
		panic(err)
	}
	fmt.Println("first:", applied[0].Direction, applied[0].Version, applied[0].Name)
	fmt.Println("applied every migration:", len(applied) == len(pgcoord.Migrations()))

	// Another replica starting at the same time, or later, finds nothing left to do.
	applied, err = pgcoord.Migrate(ctx, pool, nil)
	fmt.Println("second call applied:", len(applied), err)
	// Output:
	// first: up 1 foundation
	// applied every migration: true
	// second call applied: 0 <nil>
}

// A service that leaves migrations to a deploy step (`pgcoord migrate up`, or the SQL in
// your own migration tool) refuses to start against a schema older than it needs.
func ExampleCheckSchema() {
	ctx := context.Background()
	pool := pgtest.ExamplePool() // your *pgxpool.Pool

	status, err := pgcoord.CheckSchema(ctx, pool)
	if errors.Is(err, pgcoord.ErrSchemaOutdated) {
		log.Fatalf("pgcoord schema %s is at version %d, this build needs %d: run `pgcoord migrate up`",
			status.Schema, status.Current, status.Latest)
	}
	if err != nil {
		panic(err)
	}
	fmt.Println("up to date:", status.Current == pgcoord.LatestVersion(), "pending:", len(status.Pending()))
	// Output:
	// up to date: true pending: 0
}

// LockKey gives your own SQL the advisory-lock key pgcoord uses for a name, so a lock you
// take by hand excludes pgcoord's (singleton.RunOnce locks the key of
// singleton.LockName(job)), and plain SQL callers (pgcoord_lock_key) agree with Go.
func ExampleLockKey() {
	ctx := context.Background()
	pool := pgtest.ExamplePool()

	key, err := pgcoord.LockKey(ctx, pool, "invoice-export")
	if err != nil {
		panic(err)
	}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var locked bool
		if err := tx.QueryRow(ctx, `SELECT pg_try_advisory_xact_lock($1)`, key).Scan(&locked); err != nil {
			return err
		}
		fmt.Println("locked until COMMIT:", locked)
		var same bool
		err := tx.QueryRow(ctx, `SELECT pgcoord_lock_key('invoice-export') = $1`, key).Scan(&same)
		fmt.Println("the SQL function agrees:", same)
		return err
	})
	fmt.Println(err)
	// Output:
	// locked until COMMIT: true
	// the SQL function agrees: true
	// <nil>
}
