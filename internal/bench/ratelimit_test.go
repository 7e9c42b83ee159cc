package bench_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/internal/bench"
)

func TestRatelimitScenarios(t *testing.T) {
	t.Parallel()
	pairs := map[string]string{
		"ratelimit.allow":   bench.FloorGCRA,
		"ratelimit.nested":  bench.FloorGCRANested,
		"ratelimit.hot_key": bench.FloorGCRAHot,
		// Its ops fail the run if a call is admitted.
		"ratelimit.refuse": bench.FloorGCRARefuse,
		// Against the durable floor: what the unlogged table saves.
		"ratelimit.unlogged": bench.FloorGCRA,
	}
	var scenarios []bench.Scenario
	for name, floor := range pairs {
		s, ok := bench.Lookup(name)
		if !ok || s.Floor != floor {
			t.Fatalf("%s: registered %v, floor %q; want it measured against %s", name, ok, s.Floor, floor)
		}
		scenarios = append(scenarios, s)
	}
	var keys, tenants, hot, floorKeys, refused, floorRefused, charged, unlogged, unloggedLogged int64
	results, err := bench.Run(t.Context(), poolConfig(t), scenarios, &bench.Options{
		Concurrency: []int{1, 5},
		Duration:    200 * time.Millisecond,
		AfterRun: func(ctx context.Context, pool *pgxpool.Pool) error {
			return pool.QueryRow(ctx, `SELECT
				(SELECT count(*) FROM pgcoord_ratelimit_state WHERE policy = 'bench_key' AND key LIKE 'w%'),
				(SELECT count(*) FROM pgcoord_ratelimit_state WHERE policy = 'bench_tenant'),
				(SELECT count(*) FROM pgcoord_ratelimit_state WHERE key = 'hot'),
				(SELECT count(*) FROM bench_floor_ratelimit),
				(SELECT count(*) FROM pgcoord_ratelimit_state WHERE policy = 'bench_refuse'),
				(SELECT count(*) FROM bench_floor_ratelimit WHERE policy = 'bench_refuse'),
				-- A key charged more than its one unit a day would be more than a day ahead.
				(SELECT count(*) FROM pgcoord_ratelimit_state WHERE policy = 'bench_refuse'
				    AND tat > clock_timestamp() + interval '1 day'),
				(SELECT count(*) FROM pgcoord_ratelimit_state_unlogged WHERE policy = 'bench_unlogged'),
				(SELECT count(*) FROM pgcoord_ratelimit_state WHERE policy = 'bench_unlogged')`).Scan(
				&keys, &tenants, &hot, &floorKeys, &refused, &floorRefused, &charged, &unlogged, &unloggedLogged)
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(results) != 10 {
		t.Fatalf("got %d results, want 5 scenarios at 2 concurrencies", len(results))
	}
	for _, r := range results {
		if r.Ops <= 0 || r.OpsPerSec <= 0 || r.FloorOpsPerSec <= 0 || r.Ratio <= 0 || r.P50 <= 0 {
			t.Errorf("%s c=%d: implausible measurement %+v", r.Scenario, r.Concurrency, r)
		}
	}
	// Five workers charged their own keys (w0..w4), two tenants (workers 0-3 and 4), one
	// hot key; the floors wrote their own table. ratelimit.refuse's five keys (and its
	// floor's) were charged once each, when their workers started, and never again.
	if keys != 5 || tenants != 2 || hot != 1 || floorKeys == 0 {
		t.Errorf("state rows: %d keys, %d tenants, %d hot, %d floor rows; want 5, 2, 1 and some", keys, tenants, hot, floorKeys)
	}
	if refused != 5 || floorRefused != 5 || charged != 0 {
		t.Errorf("ratelimit.refuse: %d keys, %d floor keys, %d charged more than once; want 5, 5, 0", refused, floorRefused, charged)
	}
	if unlogged != 5 || unloggedLogged != 0 {
		t.Errorf("ratelimit.unlogged: %d keys in the unlogged table, %d in the durable one; want 5 and 0", unlogged, unloggedLogged)
	}
}
