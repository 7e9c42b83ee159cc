package bench_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/internal/bench"
)

func TestDedupeClaimScenarios(t *testing.T) {
	t.Parallel()
	pairs := map[string]string{
		"dedupe.claim":           bench.FloorInsertOnConflict,
		"dedupe.claim_retention": bench.FloorInsertOnConflictRetention,
	}
	var scenarios []bench.Scenario
	for name, floor := range pairs {
		s, ok := bench.Lookup(name)
		if !ok || s.Floor != floor {
			t.Fatalf("%s: registered %v, floor %q; want it measured against %s", name, ok, s.Floor, floor)
		}
		if f, ok := bench.Lookup(floor); !ok || f.Setup == nil || f.Floor != "floor.select1" {
			t.Fatalf("%s: registered %v, %+v; want a Setup, measured against floor.select1", floor, ok, f)
		}
		scenarios = append(scenarios, s)
	}
	if got := bench.Select("dedupe."); len(got) != 4 {
		t.Fatalf("Select(dedupe.) = %d scenarios, want the 2 claims and their 2 floors", len(got))
	}

	var claims, forever, expiring, wrongExpiry, floorRows, floorExpiring int64
	results, err := bench.Run(t.Context(), poolConfig(t), scenarios, &bench.Options{
		Concurrency: []int{1, 3},
		Duration:    300 * time.Millisecond,
		AfterRun: func(ctx context.Context, pool *pgxpool.Pool) error {
			return pool.QueryRow(ctx, `SELECT
				(SELECT count(*) FROM pgcoord_dedupe WHERE scope = 'bench'),
				(SELECT count(*) FROM pgcoord_dedupe WHERE expires_at IS NULL),
				(SELECT count(*) FROM pgcoord_dedupe WHERE expires_at IS NOT NULL),
				(SELECT count(*) FROM pgcoord_dedupe WHERE expires_at <> claimed_at + interval '30 days'),
				(SELECT count(*) FROM bench_floor_dedupe),
				(SELECT count(*) FROM bench_floor_dedupe WHERE expires_at IS NOT NULL)`).
				Scan(&claims, &forever, &expiring, &wrongExpiry, &floorRows, &floorExpiring)
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(results) != 4 {
		t.Fatalf("got %d results, want 2 scenarios at 2 concurrencies: %+v", len(results), results)
	}
	ops := map[string]int64{}
	for _, r := range results {
		if r.Floor != pairs[r.Scenario] {
			t.Errorf("%s measured against %s", r.Scenario, r.Floor)
		}
		if r.Ops <= 0 || r.OpsPerSec <= 0 || r.FloorOpsPerSec <= 0 || r.Ratio <= 0 || r.P50 <= 0 || r.P50 > r.P99 {
			t.Errorf("%s c=%d: implausible measurement %+v", r.Scenario, r.Concurrency, r)
		}
		ops[r.Scenario] += r.Ops
	}
	// Every counted op committed one new claim; the retention ones expire 30 days after
	// their claim, by the transaction's clock.
	if claims != ops["dedupe.claim"]+ops["dedupe.claim_retention"] || forever != ops["dedupe.claim"] || expiring != ops["dedupe.claim_retention"] {
		t.Errorf("ops %v, but %d claims (%d forever, %d expiring)", ops, claims, forever, expiring)
	}
	if wrongExpiry != 0 {
		t.Errorf("%d claims do not expire 30 days after they were made", wrongExpiry)
	}
	if floorRows == 0 || floorExpiring == 0 || floorExpiring == floorRows {
		t.Errorf("the floors wrote %d rows, %d with an expiry: want both floors to have run", floorRows, floorExpiring)
	}
}

// TestDedupeClaimFailsWhenAlreadyClaimed claims the bench worker's next keys under its
// feet: the bench must fail rather than count a claim that returned false.
func TestDedupeClaimFailsWhenAlreadyClaimed(t *testing.T) {
	t.Parallel()
	s, _ := bench.Lookup("dedupe.claim")
	newWorker := s.NewWorker
	s.Name = "test.dedupe_claim_taken"
	s.NewWorker = func(ctx context.Context, w bench.Worker) (bench.Op, error) {
		op, err := newWorker(ctx, w)
		if err != nil {
			return nil, err
		}
		calls := 0
		return func(ctx context.Context) error {
			if calls++; calls == 3 {
				// Keys are "w<worker number>-<op number>": take ops 3 to 5 of every worker.
				if _, err := w.Conn.Exec(ctx, `INSERT INTO pgcoord_dedupe (scope, key)
					SELECT 'bench', 'w' || n || '-' || i FROM generate_series(1, 20000) n, generate_series(3, 5) i
					ON CONFLICT DO NOTHING`); err != nil {
					return err
				}
			}
			return op(ctx)
		}, nil
	}
	_, err := bench.Run(t.Context(), poolConfig(t), []bench.Scenario{s}, &bench.Options{
		Concurrency: []int{1},
		Duration:    time.Second,
	})
	if err == nil || !strings.Contains(err.Error(), "already claimed") {
		t.Fatalf("Run error = %v, want the refused claim", err)
	}
}
