package metrics_test

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/metrics"
	"github.com/pgcoord/pgcoord/schedules"
)

// Per schedule: paused, pending runs and the time to the next tick, negative once it is
// past and unclaimed; per handler, whether a live process registered it. A tick missed
// while no process ran shows as a job's (pgcoord_job_missed_ticks), as every schedule is a
// job of kind "cron".
func TestMetricsSchedules(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	ctx := t.Context()
	clock := pgtest.NewClock(t, pool)
	t0 := time.Date(2026, 12, 7, 10, 30, 0, 0, time.UTC)
	clock.Freeze(t0)
	for _, s := range []schedules.Schedule{
		{Name: "hourly", Expr: "0 * * * *", Handler: "report"}, // a catch-up window of an hour
		{Name: "orphan", Expr: "0 0 1 1 *", Handler: "nobody"},
		{Name: "paused", Expr: "0 * * * *", Handler: "report"},
	} {
		if _, err := schedules.Create(ctx, pool, s, nil); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := schedules.Pause(ctx, pool, "paused", "", nil); err != nil {
		t.Fatal(err)
	}
	if _, err := schedules.Trigger(ctx, pool, "orphan", nil); err != nil {
		t.Fatal(err)
	}
	expect := func(when string, want map[string]float64, absent ...string) {
		t.Helper()
		text := scrape(t, newCollector(t, pool, nil))
		for series, w := range want {
			got, err := strconv.ParseFloat(sample(t, text, series), 64)
			if err != nil || got != w {
				t.Errorf("%s: %s = %v (%v), want %v", when, series, got, err, w)
			}
		}
		for _, series := range absent {
			if strings.Contains(text, series+" ") {
				t.Errorf("%s: %s is exported", when, series)
			}
		}
	}

	expect("before any scheduler", map[string]float64{
		`pgcoord_up{source="schedules"}`:                        1,
		`pgcoord_rows_truncated{source="schedules"}`:            0,
		`pgcoord_schedule_paused{schedule="hourly"}`:            0,
		`pgcoord_schedule_paused{schedule="paused"}`:            1,
		`pgcoord_schedule_pending_runs{schedule="hourly"}`:      0,
		`pgcoord_schedule_pending_runs{schedule="orphan"}`:      1,
		`pgcoord_schedule_next_tick_seconds{schedule="hourly"}`: 30 * 60,
		`pgcoord_schedule_handler_live{handler="report"}`:       0,
		`pgcoord_schedule_handler_live{handler="nobody"}`:       0,
		`pgcoord_job_missed_ticks{job="hourly"}`:                0,
		`pgcoord_schedule_next_tick_seconds{schedule="orphan"}`: time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC).Sub(t0).Seconds(),
		`pgcoord_schedule_pending_runs{schedule="paused"}`:      0,
	}, `pgcoord_schedule_next_tick_seconds{schedule="paused"}`)

	// Four hours later, with no process running: the 11:00 tick is 3.5 hours overdue.
	clock.Freeze(t0.Add(4 * time.Hour))
	expect("with the ticks unclaimed", map[string]float64{
		`pgcoord_schedule_next_tick_seconds{schedule="hourly"}`: -3.5 * 3600,
	})

	// A scheduler comes: 11:00 to 13:00 are older than the hour of catch-up (missed), 14:00
	// runs, and the next tick is 15:00.
	s, err := schedules.New(schedules.Config{Pool: pool, Handlers: map[string]schedules.Handler{
		"report": func(context.Context, schedules.Run) error { return nil },
	}, RunTTL: 3 * time.Second, PollInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(runCtx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != context.Canceled {
				t.Errorf("Run returned %v, want context.Canceled", err)
			}
		})
	}
	t.Cleanup(stop)
	pgtest.Until(t, "the 14:00 tick of hourly succeeded", func() bool {
		var state string
		err := pool.QueryRow(ctx, `SELECT state FROM pgcoord_job_runs WHERE job = 'hourly' AND scheduled_for = $1`,
			t0.Add(210*time.Minute)).Scan(&state)
		return err == nil && state == "succeeded"
	})
	expect("with a scheduler running report", map[string]float64{
		`pgcoord_job_missed_ticks{job="hourly"}`:                3,
		`pgcoord_schedule_next_tick_seconds{schedule="hourly"}`: 30 * 60,
		`pgcoord_schedule_handler_live{handler="report"}`:       1,
		`pgcoord_schedule_handler_live{handler="nobody"}`:       0,
		`pgcoord_schedule_pending_runs{schedule="orphan"}`:      1,
	})
	stop()
	expect("after the scheduler stopped", map[string]float64{`pgcoord_schedule_handler_live{handler="report"}`: 0})

	// Bounded like every source: two schedules of three, and it says so.
	text := scrape(t, newCollector(t, pool, &metrics.Opts{MaxRows: 2}))
	if v := sample(t, text, `pgcoord_rows_truncated{source="schedules"}`); v != "1" || strings.Contains(text, `schedule="paused"`) {
		t.Errorf("schedules truncated = %s with 3 schedules and MaxRows 2, want 1 and hourly and orphan only", v)
	}
}
