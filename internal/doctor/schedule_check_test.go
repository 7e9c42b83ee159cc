package doctor_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/pgcoord/pgcoord/internal/doctor"
	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/schedules"
)

// A schedule whose handler no live process registered calls for attention, naming the
// schedule and the handler: an active one, and a paused one with a pending run. A paused
// one without, an ended one and one whose handler a live process registered do not; once
// processes register the handlers, the check is OK.
func TestScheduleWaitsForHandler(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t)
	check := func() doctor.Finding {
		t.Helper()
		return findings(t, ctx, func() ([]doctor.Finding, error) { return doctor.Run(ctx, pool, doctor.Options{}) })["schedules"]
	}
	for _, s := range []schedules.Schedule{
		{Name: "served", Expr: "@hourly", Handler: "report"},
		{Name: "orphan", Expr: "@hourly", Handler: "nobody"},
		{Name: "quiet", Expr: "@hourly", Handler: "gone"},
		{Name: "parked", Expr: "@hourly", Handler: "parked-handler"},
		{Name: "ended", Expr: "@hourly", Handler: "gone", EndsAt: time.Now().Add(-time.Hour)},
	} {
		if _, err := schedules.Create(ctx, pool, s, nil); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{"quiet", "parked"} {
		if _, err := schedules.Pause(ctx, pool, name, "", nil); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := schedules.Trigger(ctx, pool, "parked", nil); err != nil {
		t.Fatal(err)
	}
	register := func(holder string, handlers ...string) {
		t.Helper()
		if _, err := pool.Exec(ctx, `SELECT pgcoord_schedule_register($1, $2, '1 hour')`, holder, handlers); err != nil {
			t.Fatal(err)
		}
	}
	register("reporter", "report")

	f := check()
	if f.Status != doctor.Attention || !strings.Contains(f.Summary, "2 of 5 schedule(s)") ||
		!strings.Contains(f.Summary, `orphan (handler "nobody", no live process)`) ||
		!strings.Contains(f.Summary, `parked (handler "parked-handler", no live process; 1 pending run(s) wait for it)`) ||
		strings.Contains(f.Summary, "served") || strings.Contains(f.Summary, "quiet") || strings.Contains(f.Summary, "ended") ||
		f.Explain == "" {
		t.Errorf("schedules waiting for handlers: %+v", f)
	}

	register("other", "nobody", "parked-handler")
	if f := check(); f.Status != doctor.OK || !strings.Contains(f.Summary, "5 schedule(s)") {
		t.Errorf("with every handler registered: %+v", f)
	}
}
