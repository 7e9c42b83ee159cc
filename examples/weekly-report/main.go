// Command weekly-report sends every customer the weekly report, once, however many replicas
// of it run.
//
// The incident: a team scales its app from one pod to three. The in-process cron now fires in
// every pod, and every customer gets the weekly report three times. Two layers fix it, and
// both are needed:
//
//   - The scheduler asks a lock before each run (gocron.WithDistributedLocker, in run): the
//     gocronpg Locker claims the tick in pgcoord's job ledger, once per tick by the
//     database's clock; the other replicas skip it. `pgcoord jobs list` shows every run.
//   - The smallest unit of work is idempotent (sendReport): each email is recorded in
//     email_sends, UNIQUE (customer_id, campaign), in the transaction that sends it. If the
//     tick runs twice anyway (a paused replica, clocks far apart), the second run sends
//     nothing. The lock makes duplicates rare; the constraint makes them harmless.
//
// Run each replica with PGCOORD_DATABASE_URL=postgres://... REPLICA=a REPORT_EVERY=10s
// go run ./examples/weekly-report (REPORT_EVERY defaults to 168h, REPLICA to the hostname).
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/go-co-op/gocron/v2"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/dedupe"
	"github.com/pgcoord/pgcoord/singleton"
	"github.com/pgcoord/pgcoord/singleton/gocronpg"
)

const schema = `
CREATE TABLE IF NOT EXISTS customers (
	id    bigint PRIMARY KEY,
	email text NOT NULL
);
CREATE TABLE IF NOT EXISTS email_sends (
	customer_id bigint NOT NULL REFERENCES customers,
	campaign    text NOT NULL,
	replica     text NOT NULL,
	sent_at     timestamptz NOT NULL DEFAULT now(),
	UNIQUE (customer_id, campaign) -- one email per customer and campaign, whatever runs twice
);
INSERT INTO customers (id, email) SELECT n, 'customer' || n || '@example.com' FROM generate_series(1, 10) n
	ON CONFLICT DO NOTHING;`

// job is the gocron job's name, and the name of its ledger entry.
const job = "weekly-report"

type config struct {
	Every   time.Duration // how often the report goes out
	Replica string        // this replica's name, recorded with each run and email
	Send    sendFunc      // the mail provider
	Logger  *slog.Logger
}

// sendFunc sends campaign's email to one address.
type sendFunc func(ctx context.Context, to, campaign string) error

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := start(ctx); err != nil {
		slog.Error("weekly-report", "err", err)
		os.Exit(1)
	}
}

func start(ctx context.Context) error {
	cfg := config{Every: 7 * 24 * time.Hour, Replica: os.Getenv("REPLICA")}
	if v := os.Getenv("REPORT_EVERY"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < time.Second {
			return fmt.Errorf("REPORT_EVERY %s: want a duration of at least 1s, such as 168h or 10s", v)
		}
		cfg.Every = d
	}
	if cfg.Replica == "" {
		cfg.Replica, _ = os.Hostname()
	}
	cfg.Logger = slog.Default().With("replica", cfg.Replica)
	cfg.Send = func(ctx context.Context, to, campaign string) error {
		cfg.Logger.Info("email sent", "to", to, "campaign", campaign) // your mail provider here
		return nil
	}
	pool, err := connect(ctx, "weekly-report", schema)
	if err != nil {
		return err
	}
	defer pool.Close()
	return run(ctx, pool, cfg)
}

// run schedules the report and runs whatever ticks this replica wins, until ctx ends.
func run(ctx context.Context, pool *pgxpool.Pool, cfg config) error {
	locker, err := gocronpg.NewLocker(pool, &gocronpg.LockerConfig{Window: cfg.Every, Holder: cfg.Replica, Logger: cfg.Logger})
	if err != nil {
		return err
	}
	s, err := gocron.NewScheduler(gocron.WithDistributedLocker(locker)) // the lock before each run
	if err != nil {
		return err
	}
	// Every replica fires at the multiples of Every since the Unix epoch (for a week:
	// Thursdays 00:00 UTC), the middle of the Locker's slots, where timers a little apart
	// still claim the same tick. For Mondays 09:00 UTC, use gocron.CronJob("0 9 * * 1", false)
	// and set LockerConfig.Origin to a Monday 09:00 minus Every/2.
	e := cfg.Every.Microseconds()
	first := time.UnixMicro((time.Now().Add(100*time.Millisecond).UnixMicro()/e + 1) * e)
	_, err = s.NewJob(gocron.DurationJob(cfg.Every), gocron.NewTask(func(ctx context.Context) {
		run, ok := locker.Current(job) // this replica won the tick
		if !ok {
			return
		}
		campaign := campaignOf(run, cfg.Every)
		if err := sendReport(ctx, pool, cfg, campaign); err != nil {
			// gocron does not tell the Locker, so the ledger records the run as succeeded:
			// alert on this log (or use singleton.Schedule, which records failures).
			cfg.Logger.Error("report failed", "campaign", campaign, "err", err)
		}
	}), gocron.WithName(job), gocron.WithStartAt(gocron.WithStartDateTime(first)))
	if err != nil {
		return err
	}
	cfg.Logger.Info("scheduled", "every", cfg.Every, "first", first)
	s.Start()
	<-ctx.Done()
	return s.Shutdown() // cancels a running report's context and waits for it
}

// campaignOf names the campaign of a run: its tick, as the database's clock has it (the
// middle of the run's slot), the same on every replica and for every run of the tick.
func campaignOf(run singleton.Run, every time.Duration) string {
	return run.ScheduledFor.Add(every / 2).UTC().Format(time.RFC3339Nano)
}

// sendReport sends campaign to every customer who has not had it yet.
func sendReport(ctx context.Context, pool *pgxpool.Pool, cfg config, campaign string) error {
	rows, _ := pool.Query(ctx, `SELECT id, email FROM customers ORDER BY id`)
	type customer struct {
		ID    int64
		Email string
	}
	customers, err := pgx.CollectRows(rows, pgx.RowToStructByPos[customer])
	if err != nil {
		return err
	}
	sent := 0
	for _, c := range customers {
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			// The idempotency line: a customer who already has this campaign inserts nothing.
			first, err := dedupe.InsertOnce(ctx, tx, `INSERT INTO email_sends (customer_id, campaign, replica)
				VALUES ($1, $2, $3) ON CONFLICT DO NOTHING`, c.ID, campaign, cfg.Replica)
			if err != nil || !first {
				return err
			}
			sent++
			// Sent before COMMIT: if sending fails, the record rolls back and the next run
			// retries. If the process dies between the send and the COMMIT, the next run sends
			// again; give the mail provider (customer, campaign) as its idempotency key to
			// close that gap too.
			return cfg.Send(ctx, c.Email, campaign)
		})
		if err != nil {
			return fmt.Errorf("customer %d: %w", c.ID, err)
		}
	}
	cfg.Logger.Info("report sent", "campaign", campaign, "emails", sent, "customers", len(customers))
	return nil
}
