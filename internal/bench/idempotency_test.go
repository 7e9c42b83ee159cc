package bench_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/internal/bench"
)

// The idempotency scenarios run against the floors they name and do the work they claim:
// every counted op of idempotency.first stored one completed key and one order, and every
// replay found its key completed (an op fails the bench otherwise).
func TestRunIdempotency(t *testing.T) {
	t.Parallel()
	pairs := map[string]string{
		"idempotency.first":           bench.FloorIdempotencyHandler,
		"idempotency.replay":          bench.FloorIdempotencyLookup,
		bench.FloorIdempotencyHandler: "floor.select1",
		bench.FloorIdempotencyLookup:  "floor.select1",
	}
	scenarios := bench.Select("idempotency.")
	if len(scenarios) != len(pairs) {
		t.Fatalf("Select(idempotency.) = %d scenarios, want %d", len(scenarios), len(pairs))
	}
	var measured []bench.Scenario
	for _, s := range scenarios {
		if pairs[s.Name] != s.Floor || s.Setup == nil {
			t.Fatalf("%s: floor %q, want %q, with a Setup", s.Name, s.Floor, pairs[s.Name])
		}
		if s.Floor != "floor.select1" {
			measured = append(measured, s)
		}
	}
	var completed, inFlight, orders, withKey int64
	results, err := bench.Run(t.Context(), poolConfig(t), measured, &bench.Options{
		Concurrency: []int{1, 3},
		Duration:    300 * time.Millisecond,
		AfterRun: func(ctx context.Context, pool *pgxpool.Pool) error {
			return pool.QueryRow(ctx, `SELECT
				(SELECT count(*) FROM pgcoord_idempotency_keys WHERE state = 'completed' AND status = 201),
				(SELECT count(*) FROM pgcoord_idempotency_keys WHERE state <> 'completed'),
				(SELECT count(*) FROM bench_idempotency_orders),
				(SELECT count(*) FROM bench_idempotency_orders o JOIN pgcoord_idempotency_keys k
				  ON k.key = o.key AND k.body = convert_to('{"order":' || o.id || '}', 'UTF8'))`).
				Scan(&completed, &inFlight, &orders, &withKey)
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	ops := map[string]int64{}
	for _, r := range results {
		if r.Floor != pairs[r.Scenario] || r.Ops <= 0 || r.Ratio <= 0 || r.P50 <= 0 {
			t.Errorf("%s c=%d: implausible %+v", r.Scenario, r.Concurrency, r)
		}
		ops[r.Scenario] += r.Ops
	}
	// The floor's orders have keys of their own: count only those the scenario stored.
	if withKey != ops["idempotency.first"] || inFlight != 0 || completed < withKey {
		t.Errorf("%d first ops, but %d orders with their stored response (%d orders, %d completed keys, %d not completed)",
			ops["idempotency.first"], withKey, orders, completed, inFlight)
	}
}
