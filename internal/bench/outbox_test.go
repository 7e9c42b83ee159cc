package bench_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/internal/bench"
)

// TestRunOutbox runs the outbox scenarios and their floors briefly at concurrency 1 and 4,
// checks each was measured against the floor it names, and that outbox.throughput did the
// work it claims: every message its ops enqueued was delivered (or is still pending, never
// failed or dead), through the pgcoord relay.
func TestRunOutbox(t *testing.T) {
	t.Parallel()
	wantFloor := map[string]string{
		"outbox.enqueue":             bench.FloorOutboxInsert,
		"outbox.enqueue_batch":       bench.FloorOutboxInsertBatch,
		"outbox.throughput":          bench.FloorOutboxThroughput,
		bench.FloorOutboxInsert:      "floor.select1",
		bench.FloorOutboxInsertBatch: "floor.select1",
		bench.FloorOutboxThroughput:  "floor.select1",
	}
	scenarios := bench.Select("outbox.")
	if len(scenarios) != len(wantFloor) {
		t.Fatalf("Select(outbox.) = %d scenarios, want %d", len(scenarios), len(wantFloor))
	}
	var delivered, pending, failed int64
	results, err := bench.Run(t.Context(), poolConfig(t), scenarios, &bench.Options{
		Concurrency: []int{1, 4},
		Duration:    300 * time.Millisecond,
		AfterRun: func(ctx context.Context, pool *pgxpool.Pool) error {
			return pool.QueryRow(ctx, `SELECT
				count(*) FILTER (WHERE state = 'delivered'), count(*) FILTER (WHERE state = 'pending'),
				count(*) FILTER (WHERE state = 'dead' OR attempts > 0)
				FROM pgcoord_outbox WHERE topic = 'bench.throughput'`).Scan(&delivered, &pending, &failed)
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	var throughputOps int64
	for _, r := range results {
		if want, ok := wantFloor[r.Scenario]; !ok || r.Floor != want {
			t.Errorf("%s c=%d: measured against %q, want %q", r.Scenario, r.Concurrency, r.Floor, want)
		}
		if r.Ops <= 0 || r.OpsPerSec <= 0 || r.FloorOpsPerSec <= 0 || r.Ratio <= 0 {
			t.Errorf("%s c=%d: empty measurement %+v", r.Scenario, r.Concurrency, r)
		}
		if r.Scenario == "outbox.throughput" {
			throughputOps += r.Ops
		}
		t.Logf("%-26s c=%d %8.1f ops/s floor %-26s %8.1f ops/s ratio %.3f", r.Scenario, r.Concurrency, r.OpsPerSec, r.Floor, r.FloorOpsPerSec, r.Ratio)
	}
	// Ops that ran into the end of a round are not counted, so more may have been enqueued.
	if delivered+pending < throughputOps*bench.OutboxBatchMessages || delivered < throughputOps*bench.OutboxBatchMessages/2 || failed != 0 {
		t.Errorf("outbox.throughput: %d ops, but %d messages delivered, %d pending, %d failed", throughputOps, delivered, pending, failed)
	}
}

func TestOutboxBenchesListed(t *testing.T) {
	t.Parallel()
	for _, s := range bench.Select("outbox.") {
		if _, ok := bench.Lookup(s.Floor); !ok {
			t.Errorf("%s: floor %q is not registered", s.Name, s.Floor)
		}
		if s.Description == "" || strings.Contains(s.Description, "\n") {
			t.Errorf("%s: description %q, want one line", s.Name, s.Description)
		}
	}
}
