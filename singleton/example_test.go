package singleton_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/singleton"
)

func ExampleRunOnce() {
	ctx := context.Background()
	pool := pgtest.ExamplePool() // your *pgxpool.Pool, with pgcoord migrated

	// Every replica calls this when its own timer fires; one of them runs the function,
	// inside the transaction that holds the lock.
	ran, err := singleton.RunOnce(ctx, pool, "nightly-cleanup", func(ctx context.Context, tx pgx.Tx) error {
		// A replica that tries now returns at once without running.
		ranElsewhere, _ := singleton.RunOnce(ctx, pool, "nightly-cleanup", func(context.Context, pgx.Tx) error { return nil })
		fmt.Println("another replica ran it too:", ranElsewhere)
		_, err := tx.Exec(ctx, `SELECT 1`) // your cleanup, committed with the lock's end
		return err
	})
	fmt.Println("ran:", ran, "err:", err)
	// Output:
	// another replica ran it too: false
	// ran: true err: <nil>
}

func ExampleRunSession() {
	ctx := context.Background()
	pool := pgtest.ExamplePool()

	// For a long job: no transaction stays open while it runs. fn works through the pool;
	// its context is cancelled if the lock's connection dies.
	ran, err := singleton.RunSession(ctx, pool, "rebuild-search-index", func(ctx context.Context) error {
		fmt.Println("rebuilding")
		return nil
	}, nil)
	fmt.Println("ran:", ran, "err:", err)
	// Output:
	// rebuilding
	// ran: true err: <nil>
}

func ExampleRunTick() {
	ctx := context.Background()
	pool := pgtest.ExamplePool()
	job := singleton.Job{Name: "hourly-digest", Every: time.Hour}

	digest := func(ctx context.Context, run singleton.Run) error {
		_ = run.Token // fence the run's writes with it (package fenced, resource "job:hourly-digest")
		fmt.Println("digest run, attempt", run.Attempt)
		return nil
	}
	// Two replicas in the same hour: the tick runs once.
	for range 2 {
		ran, err := singleton.RunTick(ctx, pool, job, digest, nil)
		fmt.Println("ran:", ran, "err:", err)
	}
	// Output:
	// digest run, attempt 1
	// ran: true err: <nil>
	// ran: false err: <nil>
}

func ExampleSchedule() {
	ctx := context.Background()
	pool := pgtest.ExamplePool()

	// On every replica, for the life of the process: every Monday at 09:00 Paris winter
	// time, one replica sends the report. (Slots are a fixed 168 hours: in summer time the
	// report goes at 10:00.)
	paris, _ := time.LoadLocation("Europe/Paris")
	job := singleton.Job{
		Name:   "weekly-report",
		Every:  7 * 24 * time.Hour,
		Origin: time.Date(2024, 1, 1, 9, 0, 0, 0, paris), // a Monday
		TTL:    time.Minute,
	}
	err := singleton.Schedule(ctx, pool, job, func(ctx context.Context, run singleton.Run) error {
		campaign := run.ScheduledFor.UTC().Format("2006-01-02")
		// Idempotent unit of work: a second run of the tick inserts (and sends) nothing.
		_, err := pool.Exec(ctx, `INSERT INTO email_sends (user_id, campaign_id)
			SELECT id, $1 FROM users ON CONFLICT DO NOTHING`, campaign)
		return err
	}, &singleton.ScheduleOpts{Logger: slog.Default()})
	fmt.Println(err) // ctx's error, when the process shuts down
}

func ExampleListJobs() {
	ctx := context.Background()
	pool := pgtest.ExamplePool()
	_, _ = singleton.RunTick(ctx, pool, singleton.Job{Name: "billing-export", Every: 24 * time.Hour},
		func(context.Context, singleton.Run) error { return fmt.Errorf("bucket not found") }, nil)

	// A probe: alert on jobs whose last run failed or that did not succeed on time.
	jobs, err := singleton.ListJobs(ctx, pool, nil)
	if err != nil {
		panic(err)
	}
	for _, j := range jobs {
		fmt.Printf("%s: last %s (%s), overdue %v\n", j.Name, j.LastState, j.LastError, j.Overdue(time.Hour))
	}
	// Output:
	// billing-export: last failed (bucket not found), overdue true
}

// The ledger's calls one by one, for a runner that drives its own loop (RunTick and
// Schedule do all of this): claim the current tick, heartbeat while working, record the
// outcome.
func ExampleClaimTick() {
	ctx := context.Background()
	pool := pgtest.ExamplePool()
	job := singleton.Job{Name: "nightly-invoices", Every: 24 * time.Hour, TTL: time.Minute}

	run, err := singleton.ClaimTick(ctx, pool, job, nil)
	if err != nil {
		panic(err) // singleton.ErrNoTick: this tick already ran, or runs elsewhere
	}
	fmt.Println("claimed, attempt", run.Attempt)

	// Another replica, in the same slot: nothing to do.
	_, err = singleton.ClaimTick(ctx, pool, job, nil)
	fmt.Println("second claim:", errors.Is(err, singleton.ErrNoTick))

	// ... work, fencing writes with run.Token; heartbeat before the TTL runs out ...
	if run, err = singleton.HeartbeatTick(ctx, pool, run, time.Minute); err != nil {
		panic(err) // singleton.ErrLost: taken over, stop
	}
	fmt.Println("finished:", singleton.FinishTick(ctx, pool, run, nil))

	jobs, _ := singleton.ListJobs(ctx, pool, nil)
	fmt.Println(jobs[0].Name, jobs[0].LastState)
	// Output:
	// claimed, attempt 1
	// second claim: true
	// finished: <nil>
	// nightly-invoices succeeded
}
