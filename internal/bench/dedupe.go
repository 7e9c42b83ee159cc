package bench

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/dedupe"
)

// The dedupe scenarios and their floors. Like the lease floors, the floors are named under
// their feature (dedupe.floor_*) rather than floor.*, which holds only the two global
// references.
const (
	// FloorInsertOnConflict is dedupe.claim's floor: the same transaction — BEGIN; INSERT
	// ... ON CONFLICT DO NOTHING of a fresh key into a table shaped like pgcoord_dedupe;
	// COMMIT — in plain SQL.
	FloorInsertOnConflict = "dedupe.floor_insert_on_conflict"
	// FloorInsertOnConflictRetention is dedupe.claim_retention's floor: the same with the
	// expiry computed in the INSERT (now() + interval).
	FloorInsertOnConflictRetention = "dedupe.floor_insert_on_conflict_retention"
)

// benchRetention is the Retention of dedupe.claim_retention's claims.
const benchRetention = 30 * 24 * time.Hour

// The goal of dedupe.claim is a ratio of 0.9 or more: the library adds no round trip to
// the transaction a hand-written client would send.
func init() {
	Register(Scenario{
		Name:        "dedupe.claim",
		Description: "a transaction doing dedupe.Claim of a fresh key (kept forever), then COMMIT",
		Floor:       FloorInsertOnConflict,
		NewWorker:   newClaimWorker(0),
	})
	Register(Scenario{
		Name: "dedupe.claim_retention",
		Description: "a transaction doing dedupe.Claim of a fresh key with a 30-day Retention, then COMMIT " +
			"(the expiry is computed in the INSERT, by the database clock)",
		Floor:     FloorInsertOnConflictRetention,
		NewWorker: newClaimWorker(benchRetention),
	})
	Register(Scenario{
		Name:        FloorInsertOnConflict,
		Description: "raw SQL: BEGIN, INSERT of a fresh key ON CONFLICT DO NOTHING into a copy of pgcoord_dedupe, COMMIT",
		Floor:       "floor.select1",
		Setup:       setupFloorDedupe,
		NewWorker:   newFloorInsertOnConflictWorker(false),
	})
	Register(Scenario{
		Name:        FloorInsertOnConflictRetention,
		Description: "raw SQL: BEGIN, INSERT of a fresh key with expires_at = now() + 30 days ON CONFLICT DO NOTHING, COMMIT",
		Floor:       "floor.select1",
		Setup:       setupFloorDedupe,
		NewWorker:   newFloorInsertOnConflictWorker(true),
	})
}

// floorDedupeTable is the floors' copy of pgcoord_dedupe: same columns, constraints and
// indexes, so the floor does the same work in the database.
const floorDedupeTable = "bench_floor_dedupe"

func setupFloorDedupe(ctx context.Context, pool *pgxpool.Pool) error {
	_, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+floorDedupeTable+` (LIKE pgcoord_dedupe INCLUDING ALL)`)
	return err
}

// dedupeWorkers numbers the workers of every dedupe measurement, so that each worker's
// keys are fresh across measurements and scenarios.
var dedupeWorkers atomic.Int64

// freshKeys returns a function giving a new key on each call: "w<n>-<i>", with n unique to
// this worker of this measurement.
func freshKeys() func() string {
	prefix := "w" + strconv.FormatInt(dedupeWorkers.Add(1), 10) + "-"
	var i int64
	return func() string {
		i++
		return prefix + strconv.FormatInt(i, 10)
	}
}

func newClaimWorker(retention time.Duration) func(context.Context, Worker) (Op, error) {
	return func(_ context.Context, w Worker) (Op, error) {
		next := freshKeys()
		opts := &dedupe.ClaimOpts{Retention: retention}
		return func(ctx context.Context) error {
			key := next()
			return pgx.BeginFunc(ctx, w.Conn, func(tx pgx.Tx) error {
				first, err := dedupe.Claim(ctx, tx, "bench", key, opts)
				if err != nil {
					return fmt.Errorf("bench: dedupe.claim: %w", err)
				}
				if !first {
					return fmt.Errorf("bench: dedupe.claim: the fresh key %q was already claimed", key)
				}
				return nil
			})
		}, nil
	}
}

func newFloorInsertOnConflictWorker(retention bool) func(context.Context, Worker) (Op, error) {
	name, insert := FloorInsertOnConflict, `INSERT INTO `+floorDedupeTable+` (scope, key) VALUES ($1, $2)
		ON CONFLICT (scope, key) DO NOTHING`
	if retention {
		name, insert = FloorInsertOnConflictRetention, `INSERT INTO `+floorDedupeTable+` (scope, key, expires_at)
		VALUES ($1, $2, now() + interval '30 days')
		ON CONFLICT (scope, key) DO NOTHING`
	}
	return func(_ context.Context, w Worker) (Op, error) {
		next := freshKeys()
		return func(ctx context.Context) error {
			key := next()
			return pgx.BeginFunc(ctx, w.Conn, func(tx pgx.Tx) error {
				tag, err := tx.Exec(ctx, insert, "bench", key)
				if err != nil {
					return fmt.Errorf("bench: %s: %w", name, err)
				}
				if tag.RowsAffected() != 1 {
					return fmt.Errorf("bench: %s: the fresh key %q was already there", name, key)
				}
				return nil
			})
		}, nil
	}
}
