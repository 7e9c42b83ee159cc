package bench

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

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
		Description: "singleton.RunOnce with an empty function on a job per worker (always granted): BEGIN, " +
			"pg_try_advisory_xact_lock(pgcoord_lock_key(name)), COMMIT, through a one-connection pool per worker",
		Floor:     FloorXactLock,
		NewWorker: newRunOnceWorker,
	})
	Register(Scenario{
		Name: FloorXactLock,
		Description: "raw SQL on the worker's connection: BEGIN, SELECT pg_try_advisory_xact_lock($1) with the " +
			"job's key computed beforehand, COMMIT",
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
// onePoolIdle, and reopens if the worker runs again.

const onePoolIdle = 2 * time.Second

// onePool is a worker's one-connection pool.
type onePool struct {
	cfg *pgxpool.Config
	key *pgx.Conn

	mu       sync.Mutex
	pool     *pgxpool.Pool // nil when closed
	busy     bool
	lastUsed time.Time
	timer    *time.Timer
}

var onePools struct {
	sync.Mutex
	m map[*pgx.Conn]*onePool
}

// onePoolFor returns the one-connection pool of w's connection, opened and connected.
func onePoolFor(ctx context.Context, w Worker) (*onePool, error) {
	key := w.Conn.Conn()
	onePools.Lock()
	op, ok := onePools.m[key]
	if !ok {
		cc := key.Config() // a copy
		cfg, err := pgxpool.ParseConfig(cc.ConnString())
		if err != nil {
			onePools.Unlock()
			return nil, fmt.Errorf("bench: singleton.run_once: %w", err)
		}
		cc.OnNotification = nil // the copy would deliver to the worker connection's buffer
		cfg.ConnConfig = cc
		cfg.MaxConns, cfg.MinConns = 1, 0
		op = &onePool{cfg: cfg, key: key}
		if onePools.m == nil {
			onePools.m = map[*pgx.Conn]*onePool{}
		}
		onePools.m[key] = op
	}
	onePools.Unlock()
	p, err := op.use()
	if err != nil {
		return nil, err
	}
	defer op.done()
	c, err := p.Acquire(ctx) // connect now: no measured op pays for connecting
	if err != nil {
		return nil, fmt.Errorf("bench: singleton.run_once: %w", err)
	}
	c.Release()
	return op, nil
}

// use returns the open pool, reopening it if it closed; call done after.
func (op *onePool) use() (*pgxpool.Pool, error) {
	op.mu.Lock()
	defer op.mu.Unlock()
	if op.pool == nil {
		p, err := pgxpool.NewWithConfig(context.Background(), op.cfg)
		if err != nil {
			return nil, fmt.Errorf("bench: singleton.run_once: %w", err)
		}
		op.pool = p
		op.timer = time.AfterFunc(onePoolIdle, op.closeIfIdle)
	}
	op.busy = true
	return op.pool, nil
}

func (op *onePool) done() {
	op.mu.Lock()
	op.busy, op.lastUsed = false, time.Now()
	op.mu.Unlock()
}

// closeIfIdle closes the pool if it was not used for onePoolIdle, and otherwise looks
// again when it could be.
func (op *onePool) closeIfIdle() {
	op.mu.Lock()
	defer op.mu.Unlock()
	if op.pool == nil {
		return
	}
	if idle := time.Since(op.lastUsed); op.busy || idle < onePoolIdle {
		op.timer.Reset(onePoolIdle - min(idle, onePoolIdle) + time.Millisecond)
		return
	}
	op.pool.Close() // it has no connection in use
	op.pool = nil
	onePools.Lock()
	delete(onePools.m, op.key) // a worker still holding op reopens it
	onePools.Unlock()
}

func newRunOnceWorker(ctx context.Context, w Worker) (Op, error) {
	op, err := onePoolFor(ctx, w)
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
	key, err := pgcoord.LockKey(ctx, w.Conn, singleton.LockName(job)) // setup, not measured
	if err != nil {
		return nil, fmt.Errorf("bench: %s: %w", FloorXactLock, err)
	}
	return func(ctx context.Context) error {
		if _, err := w.Conn.Exec(ctx, "BEGIN"); err != nil {
			return fmt.Errorf("bench: %s: begin: %w", FloorXactLock, err)
		}
		var locked bool
		if err := w.Conn.QueryRow(ctx, "SELECT pg_try_advisory_xact_lock($1)", key).Scan(&locked); err != nil {
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
