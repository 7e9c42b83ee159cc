package cli_test

import (
	"strings"
	"testing"
	"time"

	"github.com/pgcoord/pgcoord/internal/cli"
	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/schedules"
)

// A schedule is a job of the ledger: `jobs list` shows its expression and zone, and `jobs
// check` finds it overdue when its next tick passed unclaimed (no Scheduler ran it).
func TestJobsShowSchedules(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	clock := pgtest.NewClock(t, d.pool)
	t0 := time.Date(2026, 5, 4, 8, 30, 0, 0, time.UTC)
	clock.Freeze(t0)
	if _, err := schedules.Create(t.Context(), d.pool, schedules.Schedule{Name: "report", Expr: "0 9 * * MON-FRI",
		Zone: "Europe/Berlin", Handler: "h"}, nil); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := d.run(t, "jobs", "list")
	if code != cli.ExitOK || !strings.Contains(out, "report") || !strings.Contains(out, "0 9 * * MON-FRI (Europe/Berlin)") ||
		!strings.Contains(out, "2026-05-05T07:00:00Z") {
		t.Fatalf("jobs list = %d, %q, %q; want the schedule with its expression, zone and next tick", code, out, errOut)
	}
	if code, out, errOut := d.run(t, "jobs", "check"); code != cli.ExitOK {
		t.Fatalf("jobs check before the first tick = %d, %q, %q; want exit 0", code, out, errOut)
	}
	clock.Freeze(t0.Add(24 * time.Hour)) // 2026-05-05 08:30 UTC: the 07:00 tick passed, nobody claimed it
	code, out, errOut = d.run(t, "jobs", "check", "--max-staleness", "1h")
	if code != cli.ExitCheck || !strings.Contains(out, "OVERDUE report") || !strings.Contains(out, "runs on 0 9 * * MON-FRI (Europe/Berlin)") {
		t.Fatalf("jobs check after an unclaimed tick = %d, %q, %q; want exit 3, overdue, saying its schedule", code, out, errOut)
	}
}
