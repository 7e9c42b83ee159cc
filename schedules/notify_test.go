package schedules_test

import (
	"context"
	"testing"
	"time"

	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/schedules"
)

// TestChangesWakeSchedulers: a Scheduler that looks at the database once a minute starts a
// triggered run, and applies a change, at once: the notification of the change wakes it.
// (Behind a transaction pooler no notification arrives; the poll interval is the bound.)
func TestChangesWakeSchedulers(t *testing.T) {
	t.Parallel()
	if pgtest.BehindPooler() {
		t.Skip("notifications do not pass a transaction pooler: Schedulers poll there")
	}
	pool := pgtest.Pool(t)
	if _, err := schedules.Create(t.Context(), pool, schedules.Schedule{Name: "nightly", Expr: "0 3 * * *", Handler: "h"}, nil); err != nil {
		t.Fatal(err)
	}
	ran := make(chan schedules.Run, 4)
	s, err := schedules.New(schedules.Config{Pool: pool, PollInterval: time.Minute,
		Handlers: map[string]schedules.Handler{"h": func(_ context.Context, run schedules.Run) error {
			ran <- run
			return nil
		}}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	defer func() {
		cancel()
		<-done
	}()
	// Let the Scheduler make its first look and go to sleep for its minute: its handler
	// registration is the sign.
	pgtest.Until(t, "the handler is registered", func() bool {
		var n int
		err := pool.QueryRow(t.Context(), `SELECT count(*) FROM pgcoord_schedule_handlers WHERE handler = 'h'`).Scan(&n)
		return err == nil && n == 1
	})
	start := time.Now()
	if _, err := schedules.Trigger(t.Context(), pool, "nightly", nil); err != nil {
		t.Fatal(err)
	}
	select {
	case run := <-ran:
		if run.Cause != "trigger" {
			t.Errorf("run %+v, want the trigger", run)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("the triggered run did not start within 30s of a Scheduler polling once a minute: no wake-up")
	}
	t.Logf("the triggered run started %v after the trigger", time.Since(start))
	// A change of the expression to every second is applied without waiting for the poll.
	if _, err := schedules.Update(t.Context(), pool, schedules.Schedule{Name: "nightly", Expr: "* * * * * *", Handler: "h"}, nil); err != nil {
		t.Fatal(err)
	}
	select {
	case run := <-ran:
		if run.Cause != "schedule" {
			t.Errorf("run %+v, want a tick of the new expression", run)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("no tick of the changed expression within 30s of a Scheduler polling once a minute")
	}
}
