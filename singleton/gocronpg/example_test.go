package gocronpg_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/go-co-op/gocron/v2"

	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/leases"
	"github.com/pgcoord/pgcoord/singleton"
	"github.com/pgcoord/pgcoord/singleton/gocronpg"
)

// Two replicas' timers fire for the same tick: the first Lock runs the job, the second is
// refused and gocron skips the job there.
func ExampleLocker() {
	ctx := context.Background()
	pool := pgtest.ExamplePool() // your *pgxpool.Pool, with pgcoord migrated

	quiet := slog.New(slog.DiscardHandler)
	replicaA, _ := gocronpg.NewLocker(pool, &gocronpg.LockerConfig{Window: time.Hour, Logger: quiet})
	replicaB, _ := gocronpg.NewLocker(pool, &gocronpg.LockerConfig{Window: time.Hour, Logger: quiet})

	lock, err := replicaA.Lock(ctx, "hourly-report")
	fmt.Println("replica A runs the tick:", err == nil)
	_, err = replicaB.Lock(ctx, "hourly-report")
	fmt.Println("replica B skips it:", errors.Is(err, singleton.ErrNoTick))
	fmt.Println("unlock:", lock.Unlock(ctx))
	// Output:
	// replica A runs the tick: true
	// replica B skips it: true
	// unlock: <nil>
}

// Wiring a scheduler on every replica: the Locker lets one replica run each minute's
// tick. The cron schedule fires on whole minutes, which the default slots (one Window
// wide, centred on the multiples of Window) keep in their middle.
func ExampleNewLocker() {
	pool := pgtest.ExamplePool() // your *pgxpool.Pool, with pgcoord migrated

	locker, err := gocronpg.NewLocker(pool, &gocronpg.LockerConfig{Window: time.Minute})
	if err != nil {
		panic(err)
	}
	s, err := gocron.NewScheduler(gocron.WithDistributedLocker(locker))
	if err != nil {
		panic(err)
	}
	_, err = s.NewJob(gocron.CronJob("0 * * * * *", true), gocron.NewTask(func() {
		run, ok := locker.Current("send-reports")
		if !ok {
			return // the run was lost: another replica may be on it
		}
		_ = run.Token // fence the job's writes with it (package fenced, resource "job:send-reports")
	}), gocron.WithName("send-reports"))
	if err != nil {
		panic(err)
	}
	s.Start()
	defer s.Shutdown()
}

// Only the leader's scheduler runs jobs. The application runs the leases.Elector, and
// shuts the scheduler down before resigning.
func ExampleNewElector() {
	pool := pgtest.ExamplePool() // your *pgxpool.Pool, with pgcoord migrated
	ctx, resign := context.WithCancel(context.Background())

	le, err := leases.NewElector(pool, &leases.ElectorConfig{Name: "scheduler-leader", TTL: 15 * time.Second})
	if err != nil {
		panic(err)
	}
	done := make(chan error)
	go func() { done <- le.Run(ctx) }()

	elector, err := gocronpg.NewElector(le)
	if err != nil {
		panic(err)
	}
	s, err := gocron.NewScheduler(gocron.WithDistributedElector(elector))
	if err != nil {
		panic(err)
	}
	_, err = s.NewJob(gocron.DurationJob(time.Minute), gocron.NewTask(func() {
		if lease, ok := elector.Lease(); ok {
			_ = lease.Token // fence the job's writes with it
		}
	}))
	if err != nil {
		panic(err)
	}
	s.Start()

	// At shutdown:
	_ = s.Shutdown()
	resign()
	<-done
}
