package integration_test

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/singleton"
)

// Failover: a primary and a streaming standby (replicapair_test.go); the primary crashes
// (immediate stop) and the standby is promoted. See docs/failover.md. The scenarios: a
// standby refuses every write (failover_standby_test.go), synchronous grants survive a
// failover (failover_sync_test.go), and asynchronous ones may be lost while the timeline's
// token floor keeps tokens increasing (failover_async_test.go).

// timeline2Floor is pgcoord_token_floor() on timeline 2, the first after a promotion.
const timeline2Floor = int64(1) << 44

// hourlyJob is the singleton job the failover tests claim; its tick is the hour of the
// database clock.
var hourlyJob = singleton.Job{Name: "hourly-report", Every: time.Hour, TTL: time.Minute}

// tokenFloor returns pgcoord_token_floor() on db.
func tokenFloor(t *testing.T, db *pgxpool.Pool) int64 {
	t.Helper()
	var floor int64
	if err := db.QueryRow(t.Context(), `SELECT pgcoord_token_floor()`).Scan(&floor); err != nil {
		t.Fatal(err)
	}
	return floor
}
