package schedules_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/schedules"
)

// TestWaitsForItsHandler: a due tick whose handler no live process registered is recorded
// pending with a note, and runs once when a scheduler with the handler starts.
func TestWaitsForItsHandler(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	clock := pgtest.NewClock(t, pool)
	t0 := time.Date(2026, 3, 2, 8, 30, 0, 0, time.UTC)
	clock.Freeze(t0)
	if _, err := schedules.Create(t.Context(), pool, schedules.Schedule{Name: "late", Expr: "0 * * * *", Handler: "late"}, nil); err != nil {
		t.Fatal(err)
	}
	other := newCalls()
	start(t, pool, map[string]schedules.Handler{"other": other.handler()})
	clock.Freeze(t0.Add(40 * time.Minute))
	tick := time.Date(2026, 3, 2, 9, 0, 0, 0, time.UTC)
	var note string
	pgtest.Until(t, "the tick is pending", func() bool {
		return pool.QueryRow(t.Context(), `SELECT coalesce(error, '') FROM pgcoord_job_runs WHERE job = 'late' AND scheduled_for = $1 AND state = 'pending'`,
			tick).Scan(&note) == nil
	})
	if !strings.Contains(note, "waiting for a process that runs the handler 'late'") {
		t.Errorf("the pending tick's note is %q, want it to say it waits for the handler", note)
	}
	checkInfo := func(when string, pending int64, live bool) {
		t.Helper()
		info, err := schedules.Get(t.Context(), pool, "late")
		if err != nil {
			t.Fatal(err)
		}
		if info.Pending != pending || info.HandlerLive != live {
			t.Errorf("%s: Pending %d, HandlerLive %v; want %d, %v", when, info.Pending, info.HandlerLive, pending, live)
		}
	}
	checkInfo("waiting for the handler", 1, false)
	c := newCalls()
	stop := start(t, pool, map[string]schedules.Handler{"late": c.handler()})
	pgtest.Until(t, "the pending tick succeeded", func() bool {
		states, _ := runStates(t, pool, "late")
		return states[tick] == "succeeded"
	})
	checkInfo("with a scheduler running the handler", 0, true)
	stop()
	checkInfo("after that scheduler stopped", 0, false)
	if len(c.all) != 1 || c.runs["late"][tick] != 1 || len(other.all) != 0 {
		t.Errorf("runs %v (other handler: %v), want the 09:00 tick once", c.all, other.all)
	}
}

// TestTriggerRunsOnce: a triggered run runs once, with cause "trigger".
func TestTriggerRunsOnce(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	if _, err := schedules.Create(t.Context(), pool, schedules.Schedule{Name: "yearly", Expr: "@yearly", Handler: "h"}, nil); err != nil {
		t.Fatal(err)
	}
	c := newCalls()
	stop := start(t, pool, map[string]schedules.Handler{"h": c.handler()})
	run, err := schedules.Trigger(t.Context(), pool, "yearly", nil)
	if err != nil {
		t.Fatal(err)
	}
	if run.Cause != "trigger" || run.State != "pending" {
		t.Errorf("Trigger returned %+v, want a pending run with cause trigger", run)
	}
	pgtest.Until(t, "the triggered run succeeded", func() bool {
		states, _ := runStates(t, pool, "yearly")
		return states[run.Tick.UTC()] == "succeeded"
	})
	stop()
	states, _ := runStates(t, pool, "yearly")
	if len(c.all) != 1 || c.all[0].Cause != "trigger" || !c.all[0].Tick.Equal(run.Tick) || len(states) != 1 {
		t.Errorf("runs %+v, ledger %v; want the triggered run once, cause trigger", c.all, states)
	}
}

// TestDeadlineCancels: a run that blocks past its schedule's 1s deadline has its context
// cancelled and is recorded failed, naming the deadline.
func TestDeadlineCancels(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	if _, err := schedules.Create(t.Context(), pool, schedules.Schedule{Name: "slow", Expr: "@yearly", Handler: "h", Deadline: time.Second}, nil); err != nil {
		t.Fatal(err)
	}
	cancelled := make(chan error, 1)
	start(t, pool, map[string]schedules.Handler{"h": func(ctx context.Context, _ schedules.Run) error {
		<-ctx.Done()
		cancelled <- ctx.Err()
		return ctx.Err()
	}})
	run, err := schedules.Trigger(t.Context(), pool, "slow", nil)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-cancelled:
		if err != context.DeadlineExceeded {
			t.Errorf("the handler's context ended with %v, want DeadlineExceeded", err)
		}
	case <-time.After(pgtest.WaitLimit):
		t.Fatal("the handler's context was not cancelled")
	}
	var state, note string
	pgtest.Until(t, "the run is recorded failed", func() bool {
		return pool.QueryRow(t.Context(), `SELECT state, coalesce(error, '') FROM pgcoord_job_runs WHERE job = 'slow' AND scheduled_for = $1`,
			run.Tick).Scan(&state, &note) == nil && state == "failed"
	})
	if !strings.Contains(note, "deadline") {
		t.Errorf("the failed run's note is %q, want it to name the deadline", note)
	}
}
