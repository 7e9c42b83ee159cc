package bench_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/internal/bench"
)

// TestRunSingleton runs singleton.run_once and its floor briefly at concurrency 1 and 2,
// checks that each was measured against the floor it names, and that the scenario did its
// work: every op ran RunOnce's function (an op fails otherwise) and left no job lock held.
func TestRunSingleton(t *testing.T) {
	t.Parallel()
	scenarios := bench.Select("singleton.")
	wantFloor := map[string]string{
		"singleton.run_once": bench.FloorXactLock,
		bench.FloorXactLock:  "floor.select1",
	}
	if len(scenarios) != len(wantFloor) {
		t.Fatalf("Select(singleton.) = %d scenarios, want %d", len(scenarios), len(wantFloor))
	}
	for _, s := range scenarios {
		if s.Description == "" || strings.Contains(s.Description, "\n") {
			t.Errorf("%s: description %q, want one line", s.Name, s.Description)
		}
	}
	var held int
	results, err := bench.Run(t.Context(), poolConfig(t), scenarios, &bench.Options{
		Concurrency: []int{1, 2},
		Duration:    300 * time.Millisecond,
		AfterRun: func(ctx context.Context, pool *pgxpool.Pool) error {
			// No job's lock is left behind (the workers' jobs are singleton.run_once/0 and /1).
			return pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks l, generate_series(0, 1) w
				WHERE l.locktype = 'advisory' AND l.objsubid = 1
				  AND ((l.classid::bigint << 32) | l.objid::bigint) = pgcoord_lock_key('singleton:singleton.run_once/' || w)`).Scan(&held)
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	for _, r := range results {
		seen[r.Scenario]++
		if want, ok := wantFloor[r.Scenario]; !ok || r.Floor != want {
			t.Errorf("%s c=%d: measured against %q, want %q", r.Scenario, r.Concurrency, r.Floor, want)
		}
		if r.Ops <= 0 || r.OpsPerSec <= 0 || r.FloorOpsPerSec <= 0 || r.Ratio <= 0 || r.P50 <= 0 || r.P50 > r.P99 {
			t.Errorf("%s c=%d: implausible measurement %+v", r.Scenario, r.Concurrency, r)
		}
		t.Logf("%-28s c=%d %9.1f ops/s p50 %-10v p99 %-10v floor %-28s %9.1f ops/s ratio %.3f",
			r.Scenario, r.Concurrency, r.OpsPerSec, r.P50, r.P99, r.Floor, r.FloorOpsPerSec, r.Ratio)
	}
	for name := range wantFloor {
		if seen[name] != 2 {
			t.Errorf("%s: %d results, want one per concurrency (2)", name, seen[name])
		}
	}
	if held != 0 {
		t.Errorf("%d job locks still held after the bench", held)
	}
}
