package bench

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The raw-SQL floors. Each does its work the way a careful hand-written client would, with
// no pgcoord code involved, so a feature scenario's ratio to its floor is the price of the
// library.
func init() {
	Register(Scenario{
		Name:        "floor.select1",
		Description: "SELECT 1 on a warm connection: the round-trip floor of every operation",
		NewWorker: func(_ context.Context, w Worker) (Op, error) {
			return func(ctx context.Context) error {
				var one int
				if err := w.Conn.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil {
					return fmt.Errorf("bench: floor.select1: %w", err)
				}
				return nil
			}, nil
		},
	})
	Register(Scenario{
		Name: "floor.lease",
		Description: "raw-SQL lease on a key per worker: an upsert acquire returning the token, " +
			"then a compare-and-release, each its own autocommit statement",
		Floor:     "floor.select1",
		Setup:     setupFloorLease,
		NewWorker: newFloorLeaseWorker,
	})
}

// floorLeaseTable is floor.lease's table, created in the bench schema.
const floorLeaseTable = "bench_floor_lease"

func setupFloorLease(ctx context.Context, pool *pgxpool.Pool) error {
	return createFloorLeaseTable(ctx, pool, floorLeaseTable)
}

// createFloorLeaseTable creates a table shaped like floor.lease's, named table.
func createFloorLeaseTable(ctx context.Context, pool *pgxpool.Pool, table string) error {
	_, err := pool.Exec(ctx, `CREATE TABLE `+table+` (
		name       text PRIMARY KEY,
		holder     text,
		token      bigint NOT NULL,
		expires_at timestamptz -- NULL: free
	)`)
	return err
}

// floorLeaseAcquire grants the lease if it is free or expired, bumping the fence token (a
// row is kept per name so tokens only go up), and returns no row if someone holds it.
const floorLeaseAcquire = `INSERT INTO ` + floorLeaseTable + ` AS l (name, holder, token, expires_at)
VALUES ($1, $2, 1, now() + interval '30 seconds')
ON CONFLICT (name) DO UPDATE
	SET holder = excluded.holder, token = l.token + 1, expires_at = excluded.expires_at
	WHERE l.expires_at IS NULL OR l.expires_at <= now()
RETURNING token`

// floorLeaseRelease frees the lease only if it is still this grant (name, holder, token).
const floorLeaseRelease = `UPDATE ` + floorLeaseTable + ` SET holder = NULL, expires_at = NULL
WHERE name = $1 AND holder = $2 AND token = $3`

func newFloorLeaseWorker(_ context.Context, w Worker) (Op, error) {
	name := fmt.Sprintf("floor.lease/%d", w.ID)
	holder := fmt.Sprintf("worker-%d", w.ID)
	return func(ctx context.Context) error {
		var token int64
		err := w.Conn.QueryRow(ctx, floorLeaseAcquire, name, holder).Scan(&token)
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("bench: floor.lease: acquire of %q refused, but only this worker uses it", name)
		}
		if err != nil {
			return fmt.Errorf("bench: floor.lease: acquire: %w", err)
		}
		tag, err := w.Conn.Exec(ctx, floorLeaseRelease, name, holder, token)
		if err != nil {
			return fmt.Errorf("bench: floor.lease: release: %w", err)
		}
		if tag.RowsAffected() != 1 {
			return fmt.Errorf("bench: floor.lease: release of %q token %d changed nothing", name, token)
		}
		return nil
	}, nil
}
