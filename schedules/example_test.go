package schedules_test

import (
	"context"
	"fmt"
	"time"

	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/schedules"
)

func ExampleCreate() {
	ctx := context.Background()
	pool := pgtest.ExamplePool() // your *pgxpool.Pool, with pgcoord migrated

	// Weekdays at 09:00 Berlin time, run by the processes that registered "report".
	info, err := schedules.Create(ctx, pool, schedules.Schedule{
		Name: "daily-report", Expr: "0 9 * * MON-FRI", Zone: "Europe/Berlin", Handler: "report",
	}, &schedules.ChangeOpts{Actor: "ops"})
	if err != nil {
		panic(err)
	}
	fmt.Println(info.Name, "version", info.Version, "armed:", !info.NextTick.IsZero())
	// Output:
	// daily-report version 1 armed: true
}

// Daylight saving: 02:30 does not exist in Berlin on 29 March 2026, so that day's tick is
// at 03:00 local time, the first instant after the gap.
func ExampleNextTicks() {
	s := schedules.Schedule{Name: "nightly", Expr: "30 2 * * *", Zone: "Europe/Berlin", Handler: "h"}
	berlin, _ := time.LoadLocation("Europe/Berlin")
	ticks, err := schedules.NextTicks(s, time.Date(2026, 3, 27, 12, 0, 0, 0, time.UTC), 3)
	if err != nil {
		panic(err)
	}
	for _, t := range ticks {
		fmt.Println(t.In(berlin).Format("Mon 2006-01-02 15:04 MST"), "=", t.UTC().Format("15:04 UTC"))
	}
	// Output:
	// Sat 2026-03-28 02:30 CET = 01:30 UTC
	// Sun 2026-03-29 03:00 CEST = 01:00 UTC
	// Mon 2026-03-30 02:30 CEST = 00:30 UTC
}

func ExamplePause() {
	ctx := context.Background()
	pool := pgtest.ExamplePool()
	_, _ = schedules.Create(ctx, pool, schedules.Schedule{Name: "invoices", Expr: "@hourly", Handler: "invoice"}, nil)

	info, err := schedules.Pause(ctx, pool, "invoices", "bank maintenance until 14:00", &schedules.ChangeOpts{Actor: "support"})
	if err != nil {
		panic(err)
	}
	fmt.Println("paused by", info.PausedBy+":", info.PausedNote)
	info, _ = schedules.Resume(ctx, pool, "invoices", &schedules.ChangeOpts{Actor: "support"})
	fmt.Println("paused:", info.Paused, "version", info.Version)
	// Output:
	// paused by support: bank maintenance until 14:00
	// paused: false version 3
}

// A Scheduler on every replica runs the ticks (here: a run triggered by hand).
func ExampleScheduler_Run() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pool := pgtest.ExamplePool()
	_, _ = schedules.Create(ctx, pool, schedules.Schedule{Name: "cleanup", Expr: "0 3 * * *", Handler: "cleanup",
		Args: []byte(`{"older_than_days":30}`)}, nil)

	ran := make(chan schedules.Run, 1)
	s, err := schedules.New(schedules.Config{Pool: pool, Handlers: map[string]schedules.Handler{
		"cleanup": func(ctx context.Context, run schedules.Run) error {
			ran <- run
			return nil
		},
	}})
	if err != nil {
		panic(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()

	if _, err := schedules.Trigger(ctx, pool, "cleanup", &schedules.ChangeOpts{Actor: "ops"}); err != nil {
		panic(err)
	}
	run := <-ran
	fmt.Println(run.Schedule, run.Cause, string(run.Args))
	cancel()
	<-done
	// Output:
	// cleanup trigger {"older_than_days": 30}
}

// Backfill runs past ticks through the same ledger, each once, however often it is asked.
func ExampleBackfill() {
	ctx := context.Background()
	pool := pgtest.ExamplePool()
	_, _ = schedules.Create(ctx, pool, schedules.Schedule{Name: "rollup", Expr: "0 * * * *", Handler: "rollup"}, nil)

	from := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	n, err := schedules.Backfill(ctx, pool, "rollup", from, from.Add(23*time.Hour), nil)
	if err != nil {
		panic(err)
	}
	again, _ := schedules.Backfill(ctx, pool, "rollup", from, from.Add(23*time.Hour), nil)
	fmt.Println(n, "hourly runs recorded; asked again:", again)
	// Output:
	// 24 hourly runs recorded; asked again: 0
}
