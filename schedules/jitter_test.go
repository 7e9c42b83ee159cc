package schedules_test

import (
	"testing"
	"time"

	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/schedules"
)

// TestJitterIsFixedByNameAndTick: a schedule's due time is its next tick plus a fraction of
// its jitter that depends only on the name and the tick (every replica computes the same),
// below the jitter, and spread over it.
func TestJitterIsFixedByNameAndTick(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	info, err := schedules.Create(t.Context(), pool, schedules.Schedule{Name: "spread", Expr: "@every 1m", Handler: "h",
		Jitter: 10 * time.Second}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var again time.Duration
	if err := pool.QueryRow(t.Context(), `SELECT pgcoord_schedule_jitter('spread', $1, '10 seconds')`, info.NextTick).Scan(&again); err != nil {
		t.Fatal(err)
	}
	if got := info.DueAt.Sub(info.NextTick); got != again || got < 0 || got >= 10*time.Second {
		t.Fatalf("due %v after the tick, jitter of (name, tick) %v; want equal, in [0, 10s)", got, again)
	}
	var distinct, out int
	if err := pool.QueryRow(t.Context(), `
		SELECT count(DISTINCT j), count(*) FILTER (WHERE j < interval '0' OR j >= interval '10 seconds')
		  FROM (SELECT pgcoord_schedule_jitter('spread', timestamptz '2026-01-01' + make_interval(mins => n), '10 seconds') j
		          FROM generate_series(1, 1000) n) x`).Scan(&distinct, &out); err != nil {
		t.Fatal(err)
	}
	if distinct < 500 || out != 0 {
		t.Fatalf("1000 ticks got %d distinct jitters, %d outside [0, 10s); want spread and none outside", distinct, out)
	}
}
