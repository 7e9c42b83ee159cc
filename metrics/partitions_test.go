package metrics_test

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/metrics"
)

// heartbeat is a member's heartbeat through the SQL API: it joins or renews member of group
// for ttl, releasing release.
func heartbeat(t *testing.T, pool *pgxpool.Pool, group, member string, ttl time.Duration, release ...int) {
	t.Helper()
	if release == nil {
		release = []int{}
	}
	if _, err := pool.Exec(t.Context(), `SELECT pgcoord_partition_heartbeat($1, $2, 1, $3, $4, true)`,
		group, member, ttl, release); err != nil {
		t.Fatal(err)
	}
}

// Per partition group: its size, live members, partitions without a live grant and how
// long the oldest has gone without one (released, or its grant lapsed), by the database
// clock, and the grants made (moves).
func TestMetricsPartitions(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	clock := pgtest.NewClock(t, pool)
	t0 := time.Date(2027, 1, 4, 9, 0, 0, 0, time.UTC)
	clock.Freeze(t0)
	for _, g := range []struct {
		name string
		n    int
	}{{"orders", 4}, {"idle", 2}} {
		if _, err := pool.Exec(t.Context(), `SELECT pgcoord_partition_create($1, $2)`, g.name, g.n); err != nil {
			t.Fatal(err)
		}
	}
	expect := func(when string, want map[string]float64) {
		t.Helper()
		text := scrape(t, newCollector(t, pool, nil))
		for series, w := range want {
			got, err := strconv.ParseFloat(sample(t, text, series), 64)
			if err != nil || got != w {
				t.Errorf("%s: %s = %v (%v), want %v", when, series, got, err, w)
			}
		}
	}

	heartbeat(t, pool, "orders", "a", 10*time.Second)
	heartbeat(t, pool, "orders", "b", 10*time.Second) // the plan moves 2 and 3 to b; a holds them still
	clock.Freeze(t0.Add(5 * time.Second))
	expect("a holds all", map[string]float64{
		`pgcoord_up{source="partitions"}`:                   1,
		`pgcoord_rows_truncated{source="partitions"}`:       0,
		`pgcoord_partition_partitions{group="orders"}`:      4,
		`pgcoord_partition_live_members{group="orders"}`:    2,
		`pgcoord_partition_unowned{group="orders"}`:         0,
		`pgcoord_partition_unowned_seconds{group="orders"}`: 0,
		`pgcoord_partition_grants{group="orders"}`:          4,
		`pgcoord_partition_live_members{group="idle"}`:      0,
		`pgcoord_partition_unowned{group="idle"}`:           2,
		`pgcoord_partition_unowned_seconds{group="idle"}`:   5, // since its creation
		`pgcoord_partition_grants{group="idle"}`:            0,
	})
	heartbeat(t, pool, "orders", "a", 10*time.Second, 2, 3) // a's OnRevoke returned: the release grants them to b
	clock.Freeze(t0.Add(7 * time.Second))
	expect("2 and 3 released to b", map[string]float64{
		`pgcoord_partition_unowned{group="orders"}`:         0,
		`pgcoord_partition_unowned_seconds{group="orders"}`: 0,
		`pgcoord_partition_grants{group="orders"}`:          6,
	})
	heartbeat(t, pool, "orders", "b", 10*time.Second)
	expect("b holds 2 and 3", map[string]float64{
		`pgcoord_partition_unowned{group="orders"}`:         0,
		`pgcoord_partition_unowned_seconds{group="orders"}`: 0,
		`pgcoord_partition_grants{group="orders"}`:          6,
	})
	// Both stop: a's grants lapse at 15s, b's at 17s.
	clock.Freeze(t0.Add(30 * time.Second))
	expect("both stopped", map[string]float64{
		`pgcoord_partition_live_members{group="orders"}`:    0,
		`pgcoord_partition_unowned{group="orders"}`:         4,
		`pgcoord_partition_unowned_seconds{group="orders"}`: 15,
		`pgcoord_partition_grants{group="orders"}`:          6,
	})

	// Bounded like every source: one group of two, and it says so.
	text := scrape(t, newCollector(t, pool, &metrics.Opts{MaxRows: 1}))
	if v := sample(t, text, `pgcoord_rows_truncated{source="partitions"}`); v != "1" || strings.Contains(text, `group="orders"`) {
		t.Errorf("partitions truncated = %s with 2 groups and MaxRows 1, want 1 and idle only", v)
	}
}
