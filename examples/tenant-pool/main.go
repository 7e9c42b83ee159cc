// Command tenant-pool is a worker pool shared by many tenants, in which one tenant's flood of
// jobs cannot starve the others, and a worker that dies strands no job.
//
// The incident: one tenant pushes a million import jobs into the shared queue and occupies
// every worker for hours; the other tenants' jobs wait behind them. Three lines fix it:
//
//   - Each tenant runs at most its limit of jobs at once, across every process of the pool
//     (semaphore.SetLimit, in run): a job runs under a permit, one of the tenant's slots.
//   - A free worker does not take the oldest job: it asks semaphore.Next which tenant goes
//     next (runNext), the one that has work, is under its limit and is furthest behind its
//     share (its weight), and then takes that tenant's oldest job (take).
//   - Producers tell the semaphore how much work each tenant has, with semaphore.AddDemand
//     in the transaction that enqueues the jobs (enqueue), and a worker marks a job done
//     with semaphore.Done in the transaction that finishes it (finish), so the count never
//     drifts from the queue.
//
// A worker that dies — after Next, with a job taken, mid-job, or before its finish commits
// — holds its permit until the TTL; then the permit's unit of demand comes back, the job's
// mark (permit_token) names a permit that is no longer held, and another worker runs it.
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
	id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	tenant       text NOT NULL,
	payload      text NOT NULL,
	-- The permit (semaphore.Permit.Token) the job was last taken under: NULL if never. The
	-- job is in hand while that permit is held (pgcoord_semaphore_held), free otherwise.
	permit_token bigint,
	finished_at  timestamptz, -- NULL until done
	worker       text
);
CREATE INDEX IF NOT EXISTS jobs_unfinished ON jobs (tenant, id) WHERE finished_at IS NULL;`

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
	// The bookkeeping is not cut short by shutdown (db is never cancelled): the job's
	// finish and the permit's release must happen even as ctx ends.
	db := context.WithoutCancel(ctx)
	p, err := semaphore.Next(db, pool, cfg.TTL, nil) // fair admission, one round trip
	if errors.Is(err, semaphore.ErrNoWork) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	// Always release. After finish it is a no-op (ErrLost); if the job failed, was never
	// taken or we shut down, it frees the slot at once and gives the unit of demand back,
	// so the job runs again. (A job that can run longer than the TTL must semaphore.Renew
	// meanwhile.)
	defer semaphore.Release(db, pool, p)

	j, ok, err := take(db, pool, p, worker)
	if err != nil || !ok {
		return false, err // !ok: the count was ahead of the queue (jobs deleted by hand)
	}
	if err := cfg.Handle(ctx, j); err != nil {
		if ctx.Err() == nil {
			cfg.Logger.Warn("job failed; it runs again", "tenant", j.Tenant, "job", j.ID, "err", err)
		}
		return true, nil // the deferred Release puts it back. (A real queue counts attempts.)
	}
	err = finish(db, pool, p, j)
	if errors.Is(err, semaphore.ErrLost) {
		// The permit expired while the job ran (a job longer than the TTL must renew):
		// another worker may be running it again, and will finish it.
		cfg.Logger.Warn("permit lost before the job finished; it runs again", "tenant", j.Tenant, "job", j.ID)
		return true, nil
	}
	return true, err
}

// take takes the oldest job of p's tenant that is not in hand — never taken, or taken
// under a permit that is no longer held, because its worker died or gave it up — and marks
// it with p's token. It reports false if there is none.
func take(ctx context.Context, pool *pgxpool.Pool, p semaphore.Permit, worker string) (job, bool, error) {
	var j job
	err := pool.QueryRow(ctx, `UPDATE jobs SET permit_token = $2, worker = $3
		WHERE id = (SELECT id FROM jobs
		             WHERE tenant = $1 AND finished_at IS NULL
		               AND (permit_token IS NULL OR NOT pgcoord_semaphore_held(tenant, permit_token))
		             ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED)
		RETURNING id, tenant, payload`, p.Key, p.Token, worker).Scan(&j.ID, &j.Tenant, &j.Payload)
	if errors.Is(err, pgx.ErrNoRows) {
		return j, false, nil
	}
	return j, err == nil, err
}

// finish marks j done and consumes its unit of demand, in one transaction. If p is no
// longer held (it expired: the job may be running again elsewhere), nothing changes and it
// returns an error wrapping semaphore.ErrLost.
func finish(ctx context.Context, pool *pgxpool.Pool, p semaphore.Permit, j job) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `UPDATE jobs SET finished_at = now()
			WHERE id = $1 AND permit_token = $2 AND finished_at IS NULL`, j.ID, p.Token)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 { // taken again under a later permit: ours expired
			return fmt.Errorf("job %d: %w", j.ID, semaphore.ErrLost)
		}
		return semaphore.Done(ctx, tx, p)
	})
}
