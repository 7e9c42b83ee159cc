package bench

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/fenced"
)

// FloorFencedWrite names the floor of fenced.check: the same transaction and write without
// the check. Like the lease floors, it is named under its feature, so that "floor." keeps
// meaning the two general floors.
const FloorFencedWrite = "fenced.floor_write"

// Fenced writes: the price of the fence check (fenced.Write), beside the same write without it. The goal is
// a fenced write costing at most 1.25 times the unfenced one: a ratio of 0.8 or more.
func init() {
	Register(Scenario{
		Name: "fenced.check",
		Description: "a transaction doing fenced.Write: the fence check of a resource per worker with a rising " +
			"token and an UPDATE of the worker's row, in one round trip",
		Floor:     FloorFencedWrite,
		Setup:     createWriteTable(fencedCheckTable),
		NewWorker: newFencedCheckWorker,
	})
	Register(Scenario{
		Name:        FloorFencedWrite,
		Description: "the write of fenced.check without the check: a transaction with only the UPDATE of the worker's row",
		Floor:       "floor.select1",
		Setup:       createWriteTable(floorFencedWriteTable),
		NewWorker:   newFloorFencedWriteWorker,
	})
}

// The tables of fenced.check and its floor: one row per worker, carrying the
// token of its last write and the number of writes.
const (
	fencedCheckTable      = "bench_fenced_check"
	floorFencedWriteTable = "bench_floor_fenced_write"
)

func createWriteTable(table string) func(context.Context, *pgxpool.Pool) error {
	return func(ctx context.Context, pool *pgxpool.Pool) error {
		_, err := pool.Exec(ctx, `CREATE TABLE `+table+` (
			worker      int PRIMARY KEY,
			fence_token bigint NOT NULL,
			writes      bigint NOT NULL
		)`)
		return err
	}
}

// writeSQL is the write both scenarios make: the worker's row takes the token.
func writeSQL(table string) string {
	return `UPDATE ` + table + ` SET fence_token = $2, writes = writes + 1 WHERE worker = $1`
}

// workerRow creates the worker's row if an earlier measurement did not, and returns the
// token of its last write.
func workerRow(ctx context.Context, w Worker, table string) (int64, error) {
	var token int64
	err := w.Conn.QueryRow(ctx, `INSERT INTO `+table+` AS t (worker, fence_token, writes) VALUES ($1, 0, 0)
		ON CONFLICT (worker) DO UPDATE SET worker = t.worker
		RETURNING fence_token`, w.ID).Scan(&token)
	return token, err
}

func newFencedCheckWorker(ctx context.Context, w Worker) (Op, error) {
	resource := fmt.Sprintf("fenced.check/%d", w.ID)
	// The row carries the last token this worker's resource accepted (both are written
	// in one transaction), so tokens keep rising across measurements.
	token, err := workerRow(ctx, w, fencedCheckTable)
	if err != nil {
		return nil, fmt.Errorf("bench: fenced.check: %w", err)
	}
	update := writeSQL(fencedCheckTable)
	return func(ctx context.Context) error {
		token++
		return pgx.BeginFunc(ctx, w.Conn, func(tx pgx.Tx) error {
			tag, err := fenced.Write(ctx, tx, resource, token, update, w.ID, token)
			if errors.Is(err, fenced.ErrStale) {
				return fmt.Errorf("bench: fenced.check: token %d of %q refused, but only this worker writes it: %w", token, resource, err)
			}
			if err != nil {
				return fmt.Errorf("bench: fenced.check: %w", err)
			}
			if tag.RowsAffected() != 1 {
				return fmt.Errorf("bench: fenced.check: the write of worker %d changed %d rows, want 1", w.ID, tag.RowsAffected())
			}
			return nil
		})
	}, nil
}

func newFloorFencedWriteWorker(ctx context.Context, w Worker) (Op, error) {
	token, err := workerRow(ctx, w, floorFencedWriteTable)
	if err != nil {
		return nil, fmt.Errorf("bench: "+FloorFencedWrite+": %w", err)
	}
	update := writeSQL(floorFencedWriteTable)
	return func(ctx context.Context) error {
		token++
		return pgx.BeginFunc(ctx, w.Conn, func(tx pgx.Tx) error {
			tag, err := tx.Exec(ctx, update, w.ID, token)
			if err != nil {
				return fmt.Errorf("bench: "+FloorFencedWrite+": %w", err)
			}
			if tag.RowsAffected() != 1 {
				return fmt.Errorf("bench: "+FloorFencedWrite+": the write of worker %d changed %d rows, want 1", w.ID, tag.RowsAffected())
			}
			return nil
		})
	}, nil
}
