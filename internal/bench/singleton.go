package bench

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/pgcoord/pgcoord/pgcoord"
	"github.com/pgcoord/pgcoord/singleton"
)

// FloorXactLock names the floor of singleton.run_once: the same transaction and lock in
// raw SQL. Like the other feature floors it is named under its feature, so that "floor."
// keeps meaning the two general floors.
const FloorXactLock = "singleton.floor_xact_lock"

// Cron singletons: the price of singleton.RunOnce beside the raw transaction-level lock.
// The goal is a ratio of 0.9 or more.
func init() {
	Register(Scenario{
		Name: "singleton.run_once",
		Description: "singleton.RunOnce with an empty function on a job per worker (always granted): BEGIN with " +
			"pg_try_advisory_xact_lock(pgcoord_lock_key(name)) in one round trip, COMMIT, through a one-connection pool per worker",
		Floor:     FloorXactLock,
		NewWorker: newRunOnceWorker,
	})
	Register(Scenario{
		Name: FloorXactLock,
		Description: "raw SQL on the worker's connection: BEGIN and SELECT pg_try_advisory_xact_lock($1) (the " +
			"job's key computed beforehand) pipelined in one round trip, COMMIT",
		Floor:     "floor.select1",
		NewWorker: newFloorXactLockWorker,
	})
}

// runOnceJob is the job a worker of singleton.run_once and its floor lock: one per worker,
// so every attempt is granted.
func runOnceJob(w Worker) string { return fmt.Sprintf("singleton.run_once/%d", w.ID) }

// singleton.run_once
//
// singleton.RunOnce takes a *pgxpool.Pool and a connection from it for the transaction. A
// worker therefore gets a pool of its own with one connection, opened from its connection's
// config (search_path and all), so RunOnce runs the same statements on a connection of its
// own as the floor does on the worker's; acquiring from a pool is part of RunOnce's price.
// Workers have no end-of-measurement hook: the pool closes itself once idle for
// workerPoolIdle, and reopens if the worker runs again.

// onePools are the workers' one-connection pools for singleton.RunOnce.
var onePools = &workerPools{what: "singleton.run_once"}

func newRunOnceWorker(ctx context.Context, w Worker) (Op, error) {
	op, err := onePools.poolFor(ctx, w)
	if err != nil {
		return nil, err
	}
	job := runOnceJob(w)
	ran := false
	fn := func(context.Context, pgx.Tx) error { ran = true; return nil }
	return func(ctx context.Context) error {
		pool, err := op.use()
		if err != nil {
			return err
		}
		defer op.done()
		ran = false
		got, err := singleton.RunOnce(ctx, pool, job, fn)
		if err != nil {
			return fmt.Errorf("bench: singleton.run_once: %w", err)
		}
		if !got || !ran {
			return fmt.Errorf("bench: singleton.run_once: %q refused (ran %v, fn called %v), but only this worker uses it", job, got, ran)
		}
		return nil
	}, nil
}

// singleton.floor_xact_lock

func newFloorXactLockWorker(ctx context.Context, w Worker) (Op, error) {
	job := runOnceJob(w)
	key, err := pgcoord.LockKey(ctx, w.Conn, "singleton:"+job) // setup, not measured: a fixed key, the floor
	if err != nil {
		return nil, fmt.Errorf("bench: %s: %w", FloorXactLock, err)
	}
	return func(ctx context.Context) error {
		b := &pgx.Batch{}
		b.Queue("BEGIN")
		b.Queue("SELECT pg_try_advisory_xact_lock($1)", key)
		br := w.Conn.SendBatch(ctx, b)
		_, err := br.Exec()
		var locked bool
		if err == nil {
			err = br.QueryRow().Scan(&locked)
		}
		if err = errors.Join(err, br.Close()); err != nil {
			_, _ = w.Conn.Exec(context.WithoutCancel(ctx), "ROLLBACK")
			return fmt.Errorf("bench: %s: %w", FloorXactLock, err)
		}
		if _, err := w.Conn.Exec(ctx, "COMMIT"); err != nil {
			return fmt.Errorf("bench: %s: commit: %w", FloorXactLock, err)
		}
		if !locked {
			return fmt.Errorf("bench: %s: lock of %q refused, but only this worker uses it", FloorXactLock, job)
		}
		return nil
	}, nil
}
