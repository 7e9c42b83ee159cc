// Command tenant-pool is a worker pool shared by many tenants, in which one tenant's flood of
// jobs cannot starve the others.
//
// The incident: one tenant pushes a million import jobs into the shared queue and occupies
// every worker for hours; the other tenants' jobs wait behind them. Three lines fix it:
//
//   - Each tenant runs at most its limit of jobs at once, across every process of the pool
//     (semaphore.SetLimit, in run): a job runs under a permit, one of the tenant's slots.
//   - A free worker does not take the oldest job: it asks semaphore.Next which tenant goes
//     next (runNext), the one that has work, is under its limit and is furthest behind its
//     share (its weight), and then takes that tenant's oldest job.
//   - Producers tell the semaphore how much work each tenant has, with semaphore.AddDemand
//     in the transaction that enqueues the jobs (enqueue), so the count never drifts.
//
// Run it with PGCOORD_DATABASE_URL=postgres://... go run ./examples/tenant-pool
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/semaphore"
)

const schema = `
CREATE TABLE IF NOT EXISTS jobs (
	id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	tenant      text NOT NULL,
	payload     text NOT NULL,
	started_at  timestamptz, -- NULL while queued
	finished_at timestamptz,
	worker      text
);
CREATE INDEX IF NOT EXISTS jobs_queued ON jobs (tenant, id) WHERE started_at IS NULL;`

type config struct {
	Workers int              // concurrent workers in this process
	Tenants map[string]share // the tenants' limits and weights
	TTL     time.Duration    // a permit's lease: a dead worker's slot comes back after it
	Idle    time.Duration    // the pause when no tenant has work
	Handle  func(ctx context.Context, j job) error
	Logger  *slog.Logger
}

// share is what a tenant may use of the pool: at most Limit jobs at once, cluster-wide, and
// Weight, its share in fair admission (weight 2 is served twice as often as weight 1).
type share struct{ Limit, Weight int }

type job struct {
	ID              int64
	Tenant, Payload string
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := start(ctx); err != nil {
		slog.Error("tenant-pool", "err", err)
		os.Exit(1)
	}
}

func start(ctx context.Context) error {
	pool, err := connect(ctx, "tenant-pool", schema)
	if err != nil {
		return err
	}
	defer pool.Close()
	// acme floods the queue first; globex and initech come after, and are served at once.
	for tenant, n := range map[string]int{"acme": 200, "globex": 10, "initech": 20} {
		payloads := make([]string, n)
		for i := range payloads {
			payloads[i] = fmt.Sprintf("%s import %d", tenant, i+1)
		}
		if err := enqueue(ctx, pool, tenant, payloads...); err != nil {
			return err
		}
	}
	logger := slog.Default()
	return run(ctx, pool, config{
		Workers: 8, TTL: 30 * time.Second, Idle: 100 * time.Millisecond, Logger: logger,
		Tenants: map[string]share{"acme": {Limit: 2, Weight: 1}, "globex": {Limit: 2, Weight: 1}, "initech": {Limit: 4, Weight: 2}},
		Handle: func(ctx context.Context, j job) error {
			select { // the job's work
			case <-time.After(100 * time.Millisecond):
				logger.Info("done", "tenant", j.Tenant, "job", j.ID, "payload", j.Payload)
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		},
	})
}

// enqueue adds jobs for tenant, and counts them as the tenant's demand in the same
// transaction: the jobs and the count commit together, or neither does.
func enqueue(ctx context.Context, pool *pgxpool.Pool, tenant string, payloads ...string) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO jobs (tenant, payload) SELECT $1, unnest($2::text[])`, tenant, payloads); err != nil {
			return err
		}
		// Last in the transaction: it locks the tenant's semaphore row until COMMIT.
		return semaphore.AddDemand(ctx, tx, tenant, int64(len(payloads)), nil)
	})
}

// run sets the tenants' limits and runs cfg.Workers workers until ctx ends (then it returns
// nil) or a worker fails.
func run(ctx context.Context, pool *pgxpool.Pool, cfg config) error {
	for tenant, w := range cfg.Tenants {
		if err := semaphore.SetLimit(ctx, pool, tenant, w.Limit, &semaphore.SetLimitOpts{Weight: w.Weight}); err != nil {
			return err
		}
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make(chan error)
	for i := range cfg.Workers {
		go func() { errs <- work(ctx, pool, cfg, fmt.Sprintf("worker-%d", i+1)) }()
	}
	var first error
	for range cfg.Workers {
		if err := <-errs; err != nil && first == nil {
			first = err
			cancel() // stop the others
		}
	}
	return first
}

// work runs jobs, a tenant at a time, until ctx ends.
func work(ctx context.Context, pool *pgxpool.Pool, cfg config, worker string) error {
	for ctx.Err() == nil {
		ran, err := runNext(ctx, pool, cfg, worker)
		if err != nil && ctx.Err() == nil {
			return fmt.Errorf("%s: %w", worker, err)
		}
		if !ran {
			select { // no tenant has work it may run now
			case <-ctx.Done():
			case <-time.After(cfg.Idle):
			}
		}
	}
	return nil
}

// runNext runs one job of the tenant whose turn it is, and reports whether it found one.
func runNext(ctx context.Context, pool *pgxpool.Pool, cfg config, worker string) (bool, error) {
	// The bookkeeping is not cut short by shutdown (db is never cancelled): a Next cancelled
	// mid-way could be granted without our knowing, and its unit of demand would be lost.
	db := context.WithoutCancel(ctx)
	p, err := semaphore.Next(db, pool, cfg.TTL, nil) // fair admission, one round trip
	if errors.Is(err, semaphore.ErrNoWork) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	// Always release, even if the job fails or we shut down, or the slot stays taken until
	// the TTL. (A job that can run longer than the TTL must semaphore.Renew meanwhile.)
	defer semaphore.Release(db, pool, p)

	var j job
	err = pool.QueryRow(db, `UPDATE jobs SET started_at = now(), worker = $2
		WHERE id = (SELECT id FROM jobs WHERE tenant = $1 AND started_at IS NULL
		            ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED)
		RETURNING id, tenant, payload`, p.Key, worker).Scan(&j.ID, &j.Tenant, &j.Payload)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil // the count was ahead of the queue (jobs deleted by hand): nothing to do
	}
	if err != nil {
		return false, err
	}
	if err := cfg.Handle(ctx, j); err != nil {
		// Put the job back, and its unit of demand, for another try. (A real queue counts
		// attempts, and requeues jobs whose worker died mid-job.)
		if ctx.Err() == nil {
			cfg.Logger.Warn("job failed, requeued", "tenant", j.Tenant, "job", j.ID, "err", err)
		}
		return true, pgx.BeginFunc(db, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(db, `UPDATE jobs SET started_at = NULL, worker = NULL WHERE id = $1`, j.ID); err != nil {
				return err
			}
			return semaphore.AddDemand(db, tx, j.Tenant, 1, nil)
		})
	}
	_, err = pool.Exec(db, `UPDATE jobs SET finished_at = now() WHERE id = $1`, j.ID)
	return true, err
}
