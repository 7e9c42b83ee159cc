package bench_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/internal/bench"
)

// TestRunSchedulesLateness runs schedules.lateness briefly (600 schedules here: 10 ticks a
// second) and checks that it measured real runs: ops counted as the ticks of whole seconds,
// each of which started its handler once (an op fails otherwise), latencies recorded, and
// the ledger agrees — every tick run succeeded, none was missed, skipped or run again —
// and its Schedulers stopped with the measurement (their handlers unregistered).
func TestRunSchedulesLateness(t *testing.T) {
	t.Parallel()
	scenarios := bench.Select("schedules.")
	if len(scenarios) != 1 || scenarios[0].Name != "schedules.lateness" || scenarios[0].Floor != "" {
		t.Fatalf("Select(schedules.) = %+v, want schedules.lateness alone, its own reference", scenarios)
	}
	var (
		states         = map[string]int64{}
		maxAttempt     int64
		handlers, runs int64
	)
	results, err := bench.Run(t.Context(), poolConfig(t), scenarios, &bench.Options{
		Concurrency: []int{1, 2},
		Duration:    300 * time.Millisecond,
		AfterRun: func(ctx context.Context, pool *pgxpool.Pool) error {
			rows, err := pool.Query(ctx, `SELECT state, sum(ticks)::bigint, max(attempt)::bigint FROM pgcoord_job_runs GROUP BY state`)
			if err != nil {
				return err
			}
			defer rows.Close()
			for rows.Next() {
				var state string
				var ticks, attempt int64
				if err := rows.Scan(&state, &ticks, &attempt); err != nil {
					return err
				}
				states[state], maxAttempt, runs = ticks, max(maxAttempt, attempt), runs+ticks
			}
			if err := rows.Err(); err != nil {
				return err
			}
			return pool.QueryRow(ctx, `SELECT count(*) FROM pgcoord_schedule_handlers`).Scan(&handlers)
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(results) != 1 {
		t.Fatalf("%d results, want one (measured at concurrency 1 only): %+v", len(results), results)
	}
	r := results[0]
	t.Logf("%s: %d ticks in %d rounds, %.1f ticks/s, lateness p50 %v p99 %v", r.Scenario, r.Ops, r.Rounds, r.OpsPerSec, r.P50, r.P99)
	if r.Concurrency != 1 || r.Floor != r.Scenario || r.Ratio != 1 {
		t.Errorf("measured at c=%d against %q, ratio %v: want c=1, its own reference", r.Concurrency, r.Floor, r.Ratio)
	}
	// Each op is one second of 10 ticks; 3 rounds of at least one op each.
	if r.Rounds != 3 || r.Ops < 30 || r.Ops%10 != 0 || r.OpsPerSec <= 0 {
		t.Errorf("%d ticks in %d rounds at %v/s: want whole seconds of 10 ticks, at least one per round of 3", r.Ops, r.Rounds, r.OpsPerSec)
	}
	if r.P50 <= 0 || r.P50 > r.P99 || r.P99 > time.Minute {
		t.Errorf("lateness p50 %v, p99 %v: want 0 < p50 <= p99, under a minute", r.P50, r.P99)
	}
	// Besides the measured seconds: the warm-up's, and those that ran until the stop.
	if states["succeeded"] < r.Ops || states["succeeded"] != runs-states["running"] || maxAttempt != 1 {
		t.Errorf("the ledger holds %v (ticks by state), attempts up to %d, for %d ticks measured: want them all "+
			"succeeded (or running at the stop), each in one attempt", states, maxAttempt, r.Ops)
	}
	if handlers != 0 {
		t.Errorf("%d handler registrations left after the measurement: its Schedulers did not stop", handlers)
	}
}
