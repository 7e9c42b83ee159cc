package main

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/examples/internal/exampletest"
	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/leases"
)

func TestMain(m *testing.M) { exampletest.Main(m, main) }

// newPool returns a pool on a fresh schema with pgcoord and the example's tables.
func newPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool := pgtest.Pool(t)
	if err := createTables(context.Background(), pgtest.Direct(t, pool), "fenced-payment", schema); err != nil {
		t.Fatal(err)
	}
	return pool
}

func addOrders(t *testing.T, pool *pgxpool.Pool, n int) {
	t.Helper()
	if _, err := pool.Exec(context.Background(), `INSERT INTO orders (id, amount_cents) SELECT i, 100 * i FROM generate_series(1, $1::int) i`, n); err != nil {
		t.Fatal(err)
	}
}

// charges returns, for the order, how many charges the provider made, how many requests it
// got, and which worker recorded the payment with which token.
func charges(t *testing.T, pool *pgxpool.Pool, orderID int64) (made, requests int, worker string, token int64) {
	t.Helper()
	err := pool.QueryRow(context.Background(), `
		SELECT count(c.idempotency_key), coalesce(sum(c.requests), 0), coalesce(max(p.worker), ''), coalesce(max(p.fence_token), 0)
		  FROM orders o LEFT JOIN provider_charges c ON c.idempotency_key = $2
		       LEFT JOIN payments p ON p.order_id = o.id AND p.charge_id = c.charge_id
		 WHERE o.id = $1`, orderID, idempotencyKey(orderID)).Scan(&made, &requests, &worker, &token)
	if err != nil {
		t.Fatal(err)
	}
	return made, requests, worker, token
}

// The incident, step by step: A holds the lease of order 1 and stalls past its TTL (the
// test moves the database's clock on); B takes the lease over. Then both charge, in either
// order — A waking up before B charged, or after. The provider sees the same idempotency
// key twice and charges once; our payments table refuses A's record (leases.ErrLost: its
// grant is no longer current) and keeps B's.
func TestPausedHolderIsFenced(t *testing.T) {
	t.Parallel()
	for _, aFirst := range []bool{true, false} {
		name := "A wakes after B charged"
		if aFirst {
			name = "A wakes before B charged"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			pool := newPool(t)
			clock := pgtest.NewClock(t, pool)
			addOrders(t, pool, 1)

			a, err := leases.TryAcquire(ctx, pool, "order:1", 30*time.Second, nil)
			if err != nil {
				t.Fatal(err)
			}
			clock.Advance(31 * time.Second) // A is paused past its lease
			b, err := leases.TryAcquire(ctx, pool, "order:1", 30*time.Second, nil)
			if err != nil {
				t.Fatalf("B could not take the expired lease over: %v", err)
			}
			if b.Token <= a.Token {
				t.Fatalf("B's token %d is not above A's %d", b.Token, a.Token)
			}
			type holder struct {
				name  string
				lease leases.Lease
				want  error
			}
			order := []holder{{"B", b, nil}, {"A", a, leases.ErrLost}}
			if aFirst {
				order[0], order[1] = order[1], order[0]
			}
			for _, w := range order {
				id, err := providerCharge(ctx, pool, idempotencyKey(1), 100)
				if err != nil {
					t.Fatal(err)
				}
				if err := recordPayment(ctx, pool, w.lease, 1, id, w.name); !errors.Is(err, w.want) {
					t.Fatalf("%s's payment record (token %d): got %v, want %v", w.name, w.lease.Token, err, w.want)
				}
			}
			made, requests, worker, token := charges(t, pool, 1)
			if made != 1 || requests != 2 {
				t.Errorf("the provider made %d charges for %d requests, want 1 for 2 (one request replayed the other's charge)", made, requests)
			}
			if worker != "B" || token != b.Token {
				t.Errorf("the payment is recorded by %q with token %d, want B's with %d", worker, token, b.Token)
			}
		})
	}
}

// Eight workers on 60 orders charge each order exactly once. One order was taken first by
// a worker that then stalled (the test holds its lease, with a TTL that lapses): the queue
// redelivers the order, a worker takes the lease over and charges, and the stalled worker's
// late charge, when it wakes up, is replayed by the provider, and its record is refused
// because its lease is no longer current.
func TestConcurrentWorkersChargeEachOrderOnce(t *testing.T) {
	t.Parallel()
	const orders = 60
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pool := newPool(t)
	addOrders(t, pool, orders)

	// The stalled worker: it took order 1 off the queue and its lease, for 200ms, and the
	// queue hides the order until the lease expires.
	zombie, err := leases.TryAcquire(ctx, pool, "order:1", 200*time.Millisecond, nil)
	if err != nil {
		t.Fatal(err)
	}
	var stalled order
	if err := pool.QueryRow(ctx, `UPDATE orders SET due_at = $1 WHERE id = 1 RETURNING id, amount_cents`,
		zombie.ExpiresAt).Scan(&stalled.ID, &stalled.AmountCents); err != nil {
		t.Fatal(err)
	}

	done := make(chan error)
	go func() {
		done <- run(ctx, pool, config{Workers: 8, TTL: 30 * time.Second, Idle: 5 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	}()
	exampletest.WaitFor(t, "every order paid", func(ctx context.Context) (bool, error) {
		return exampletest.Count(t, pool, `SELECT count(*) FROM orders WHERE status = 'paid'`) == orders, nil
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("run: %v", err)
	}

	// The stalled worker wakes up and carries on where it stopped.
	id, err := providerCharge(context.Background(), pool, idempotencyKey(stalled.ID), stalled.AmountCents)
	if err != nil {
		t.Fatal(err)
	}
	if err := recordPayment(context.Background(), pool, zombie, stalled.ID, id, "stalled"); !errors.Is(err, leases.ErrLost) {
		t.Fatalf("the stalled worker's late record: got %v, want leases.ErrLost", err)
	}

	workers := map[string]bool{}
	for o := int64(1); o <= orders; o++ {
		made, requests, worker, token := charges(t, pool, o)
		wantRequests := 1
		if o == stalled.ID {
			wantRequests = 2 // the stalled worker's, replayed
		}
		if made != 1 || requests != wantRequests || worker == "" {
			t.Errorf("order %d: %d charges for %d requests, recorded by %q; want 1 charge for %d requests, recorded",
				o, made, requests, worker, wantRequests)
		}
		if o == stalled.ID && token <= zombie.Token {
			t.Errorf("order %d recorded with token %d, want above the stalled worker's %d", o, token, zombie.Token)
		}
		workers[worker] = true
	}
	if len(workers) < 2 {
		t.Errorf("only %v charged: the workers did not run concurrently", workers)
	}
}

// The program itself: started with PGCOORD_DATABASE_URL, it charges its ten demo orders
// and exits cleanly on SIGTERM; without the variable it fails with a message naming it.
func TestMainProgram(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	p := exampletest.StartMain(t, exampletest.EnvDatabaseURL+"="+exampletest.DatabaseURL(t, pool))
	exampletest.WaitFor(t, "ten orders charged", func(ctx context.Context) (bool, error) {
		var n int
		err := pool.QueryRow(ctx, `SELECT count(*) FROM payments`).Scan(&n)
		if err != nil && strings.Contains(err.Error(), "does not exist") {
			return false, nil // main has not created its tables yet
		}
		return n == 10, err
	})
	p.Stop(t)
	if made := exampletest.Count(t, pool, `SELECT count(*) FROM provider_charges WHERE requests = 1`); made != 10 {
		t.Errorf("%d orders charged once, want 10", made)
	}

	code, out := exampletest.RunMain(t)
	if code != 1 || !strings.Contains(out, "PGCOORD_DATABASE_URL is not set") {
		t.Errorf("without PGCOORD_DATABASE_URL: exit code %d, output %q; want 1 and the variable named", code, out)
	}
}
