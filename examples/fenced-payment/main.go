// Command fenced-payment is a payment worker that cannot charge an order twice, even when it
// is paused past its lease and wakes up after another worker took the order over.
//
// The incident: worker A takes a 30-second lock on order 42, then stalls in a 40-second GC
// pause. The lock expires, the queue hands the order to worker B, B charges the card. A wakes
// up, still believing it holds the lock, and charges again. No lock can prevent this: A
// cannot tell that time passed. What prevents it is the places the charge is written to:
//
//   - The payment provider gets an idempotency key derived from the order alone
//     (idempotencyKey): A's late request gets B's charge back instead of a new one.
//   - Our own record of the payment is written in a transaction that first checks the
//     lease with fenced.CheckLease (recordPayment), which holds the grant until the
//     transaction ends: A's grant is no longer current, so A's late record is refused with
//     leases.ErrLost and writes nothing — in every interleaving, since no takeover can
//     complete while a recording transaction is open.
//
// Run it with PGCOORD_DATABASE_URL=postgres://... go run ./examples/fenced-payment
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

	"github.com/pgcoord/pgcoord/fenced"
	"github.com/pgcoord/pgcoord/leases"
	"github.com/pgcoord/pgcoord/pgcoord"
)

// schema is the application's tables. provider_charges stands in for the payment
// provider's own database (Stripe's, say), which keeps one charge per idempotency key.
const schema = `
CREATE TABLE IF NOT EXISTS orders (
	id           bigint PRIMARY KEY,
	amount_cents bigint NOT NULL,
	status       text NOT NULL DEFAULT 'pending',  -- pending, then paid
	due_at       timestamptz NOT NULL DEFAULT now() -- a taken order is redelivered at due_at
);
CREATE TABLE IF NOT EXISTS payments (
	order_id    bigint PRIMARY KEY REFERENCES orders,
	charge_id   text NOT NULL,
	fence_token bigint NOT NULL,
	worker      text NOT NULL
);
CREATE TABLE IF NOT EXISTS provider_charges (
	idempotency_key text PRIMARY KEY,
	charge_id       text NOT NULL DEFAULT gen_random_uuid()::text,
	amount_cents    bigint NOT NULL,
	requests        int NOT NULL DEFAULT 1
);`

type config struct {
	Workers int           // concurrent workers in this process
	TTL     time.Duration // the lease of an order, and how long the queue hides a taken order
	Idle    time.Duration // the pause when no order is due
	Logger  *slog.Logger
}

type order struct{ ID, AmountCents int64 }

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := start(ctx); err != nil {
		slog.Error("fenced-payment", "err", err)
		os.Exit(1)
	}
}

func start(ctx context.Context) error {
	pool, err := connect(ctx, "fenced-payment", schema)
	if err != nil {
		return err
	}
	defer pool.Close()
	// Ten orders to pay. Add more with psql: INSERT INTO orders (id, amount_cents) VALUES (11, 4200);
	_, err = pool.Exec(ctx, `INSERT INTO orders (id, amount_cents) SELECT n, 1000 + n FROM generate_series(1, 10) n ON CONFLICT DO NOTHING`)
	if err != nil {
		return err
	}
	return run(ctx, pool, config{Workers: 4, TTL: 30 * time.Second, Idle: time.Second, Logger: slog.Default()})
}

// run starts cfg.Workers workers and returns when ctx ends (nil) or a worker fails.
func run(ctx context.Context, pool *pgxpool.Pool, cfg config) error {
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

// work takes orders off the queue and charges them until ctx ends.
func work(ctx context.Context, pool *pgxpool.Pool, cfg config, worker string) error {
	for ctx.Err() == nil {
		var o order
		// SKIP LOCKED: concurrent workers take different orders instead of queueing on one.
		// The order stays hidden for the TTL, then comes back if still unpaid: an
		// at-least-once queue, which is how a paused worker's order reaches another worker.
		err := pool.QueryRow(ctx, `UPDATE orders SET due_at = now() + make_interval(secs => $1)
			WHERE id = (SELECT id FROM orders WHERE status = 'pending' AND due_at <= now()
			            ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED)
			RETURNING id, amount_cents`, cfg.TTL.Seconds()).Scan(&o.ID, &o.AmountCents)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			select { // nothing due: wait a little
			case <-ctx.Done():
			case <-time.After(cfg.Idle):
			}
		case err != nil:
			if ctx.Err() != nil {
				return nil // shutting down
			}
			return err
		default:
			if err := process(ctx, pool, cfg, worker, o); err != nil && ctx.Err() == nil {
				return fmt.Errorf("%s, order %d: %w", worker, o.ID, err)
			}
		}
	}
	return nil
}

// process charges o under a lease of its own.
func process(ctx context.Context, pool *pgxpool.Pool, cfg config, worker string, o order) error {
	lease, err := leases.TryAcquire(ctx, pool, fmt.Sprintf("order:%d", o.ID), cfg.TTL, nil)
	if errors.Is(err, leases.ErrHeld) {
		return nil // a slow worker still holds it; the queue brings the order back later
	}
	if err != nil {
		return err
	}
	defer leases.Release(context.WithoutCancel(ctx), pool, lease, nil) // ErrLost if taken over: fine

	// Everything from here on may run after the lease expired: this goroutine can be paused
	// at any line. Each write below is safe anyway.
	chargeID, err := providerCharge(ctx, pool, idempotencyKey(o.ID), o.AmountCents)
	if err != nil {
		return err
	}
	err = recordPayment(ctx, pool, lease, o.ID, chargeID, worker)
	if errors.Is(err, leases.ErrLost) {
		cfg.Logger.Warn("our lease ran out (another worker may have the order): our late write was refused", "order", o.ID, "worker", worker, "token", lease.Token)
		return nil
	}
	if err == nil {
		cfg.Logger.Info("charged", "order", o.ID, "charge", chargeID, "worker", worker, "token", lease.Token)
	}
	return err
}

// idempotencyKey is what the provider deduplicates charges by. It names the charge, not the
// attempt: it must NOT contain the fence token. A paused worker holds token 33, the worker
// that took over holds 34; with the token in the key, the provider would see two different
// requests and charge twice. The provider cannot compare tokens; it can only recognise a
// request it has already served, so every holder of the order must send the same key.
func idempotencyKey(orderID int64) string { return fmt.Sprintf("order-%d-charge", orderID) }

// recordPayment records the charge and marks the order paid, in one transaction that
// starts with fenced.CheckLease: if lease is no longer current (it expired, or another
// worker took the order over) it returns leases.ErrLost and writes nothing; if it is, the
// lease cannot change hands until the transaction ends, so the next holder of the order
// sees this record. The order moves from pending to paid once, and one payment row is kept
// per order, whatever else happens.
func recordPayment(ctx context.Context, pool *pgxpool.Pool, lease leases.Lease, orderID int64, chargeID, worker string) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if err := fenced.CheckLease(ctx, tx, lease); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO payments (order_id, charge_id, fence_token, worker)
			VALUES ($1, $2, $3, $4) ON CONFLICT (order_id) DO NOTHING`, orderID, chargeID, lease.Token, worker)
		if err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `UPDATE orders SET status = 'paid' WHERE id = $1 AND status = 'pending'`, orderID)
		return err
	})
}

// providerCharge stands in for the provider's API (POST /charges with an Idempotency-Key
// header): the first request with a key charges, a repeat returns the first charge.
func providerCharge(ctx context.Context, db pgcoord.DBTX, key string, amountCents int64) (chargeID string, err error) {
	err = db.QueryRow(ctx, `INSERT INTO provider_charges (idempotency_key, amount_cents) VALUES ($1, $2)
		ON CONFLICT (idempotency_key) DO UPDATE SET requests = provider_charges.requests + 1
		RETURNING charge_id`, key, amountCents).Scan(&chargeID)
	return chargeID, err
}
