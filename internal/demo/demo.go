//go:build unix

// Package demo replays the three incidents of pgcoord's mission with real processes — the
// double charge, the weekly email sent three times, the tenant that starves the others —
// first the naive way and then with pgcoord, and prints what happened side by side; then
// a schedule stored as a row, paused and resumed from the CLI while three replicas run it.
//
// cmd/pgcoord-demo runs it (`make demo`); its test runs it too and checks every outcome.
package demo

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/internal/cli"
	"github.com/pgcoord/pgcoord/internal/pgconfig"
	"github.com/pgcoord/pgcoord/internal/workerproc"
	"github.com/pgcoord/pgcoord/pgcoord"
)

// Config is what Run needs.
type Config struct {
	// DatabaseURL is the database the demo runs in, in a schema of its own that it drops at
	// the end.
	DatabaseURL string
	// Out receives the report.
	Out io.Writer
	// Progress, if set, receives a line as each step starts.
	Progress io.Writer
}

// Result is what the demo observed, for its tests.
type Result struct {
	Payment   PaymentResult
	Emails    EmailResult
	Tenants   TenantResult
	Schedules ScheduleResult
}

// demo is one run of the demo.
type demo struct {
	Config
	url, schema string
	pool        *pgxpool.Pool
	procs       []*workerproc.Proc
}

// Run replays the three incidents in a new schema of cfg.DatabaseURL, prints the report to
// cfg.Out, shows the live state with pgcoord's CLI, and drops the schema.
func Run(ctx context.Context, cfg Config) (res Result, err error) {
	var b [4]byte
	_, _ = rand.Read(b[:])
	d := &demo{Config: cfg, url: cfg.DatabaseURL, schema: "pgcoord_demo_" + hex.EncodeToString(b[:])}
	if d.Progress == nil {
		d.Progress = io.Discard
	}
	if err := d.setUp(ctx); err != nil {
		return res, err
	}
	defer d.tearDown()

	fmt.Fprintf(d.Out, "pgcoord demo: the three incidents of the mission, with real processes (schema %s)\n", d.schema)
	if res.Payment, err = d.payment(ctx); err != nil {
		return res, fmt.Errorf("incident 1 (double charge): %w", err)
	}
	res.Payment.print(d.Out)
	if res.Emails, err = d.emails(ctx); err != nil {
		return res, fmt.Errorf("incident 2 (weekly emails): %w", err)
	}
	res.Emails.print(d.Out)
	if res.Tenants, err = d.tenants(ctx); err != nil {
		return res, fmt.Errorf("incident 3 (tenant starvation): %w", err)
	}
	res.Tenants.print(d.Out)
	if res.Schedules, err = d.schedules(ctx); err != nil {
		return res, fmt.Errorf("schedules as data: %w", err)
	}
	res.Schedules.print(d.Out)
	return res, d.showState(ctx)
}

// setUp creates the demo's schema, installs pgcoord in it and creates the demo's tables.
func (d *demo) setUp(ctx context.Context) error {
	d.step("installing pgcoord in schema %s", d.schema)
	admin, err := pgxpool.New(ctx, d.url)
	if err != nil {
		return err
	}
	defer admin.Close()
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+pgconfig.QuoteIdent(d.schema)); err != nil {
		return fmt.Errorf("create schema: %w", err)
	}
	cfg, err := pgconfig.Pool(d.url, pgconfig.Options{AppName: "pgcoord-demo", Schema: d.schema, MaxConns: 8})
	if err != nil {
		return err
	}
	if d.pool, err = pgxpool.NewWithConfig(ctx, cfg); err != nil {
		return err
	}
	if _, err := pgcoord.Migrate(ctx, d.pool, nil); err != nil {
		return err
	}
	_, err = d.pool.Exec(ctx, schemaSQL)
	return err
}

// tearDown stops every worker still running and drops the schema.
func (d *demo) tearDown() {
	for _, p := range d.procs {
		_ = p.Stop(2 * time.Second)
	}
	if d.pool != nil {
		d.pool.Close()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if admin, err := pgxpool.New(ctx, d.url); err == nil {
		_, _ = admin.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgconfig.QuoteIdent(d.schema)+" CASCADE")
		admin.Close()
	}
}

// step reports progress.
func (d *demo) step(format string, args ...any) {
	fmt.Fprintf(d.Progress, "demo: "+format+"\n", args...)
}

// showState prints the live state left by the demo, with pgcoord's own CLI.
func (d *demo) showState(ctx context.Context) error {
	fmt.Fprintf(d.Out, "\nThe state pgcoord keeps, as an operator sees it:\n")
	for _, args := range [][]string{{"leases", "list"}, {"jobs", "list"}, {"schedules", "list"}, {"semaphores", "list"}, {"outbox", "stats"}} {
		fmt.Fprintf(d.Out, "\n$ pgcoord %s %s\n", args[0], args[1])
		all := append([]string{"--database-url", d.url, "--schema", d.schema}, args...)
		if code := cli.Run(ctx, all, d.Out, d.Out); code != cli.ExitOK {
			return fmt.Errorf("pgcoord %v: exit code %d", args, code)
		}
	}
	return nil
}

// schemaSQL is the demo application's own tables.
const schemaSQL = `
-- Incident 1: charges as the bank sees them, and the payment provider's idempotency keys.
CREATE TABLE demo_charges (
	mode       text        NOT NULL,
	order_id   int         NOT NULL,
	worker     text        NOT NULL,
	token      bigint      NOT NULL,
	charged_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE TABLE demo_provider_charges (
	idempotency_key text PRIMARY KEY,
	order_id        int  NOT NULL,
	worker          text NOT NULL,
	requests        int  NOT NULL DEFAULT 1
);
-- Incident 2: emails as the customers receive them.
CREATE TABLE demo_emails (
	mode     text        NOT NULL,
	campaign text        NOT NULL,
	customer int         NOT NULL,
	replica  text        NOT NULL,
	sent_at  timestamptz NOT NULL DEFAULT clock_timestamp()
);
-- Incident 3: a shared job queue, and what ran when.
CREATE TABLE demo_jobs (
	id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	mode        text        NOT NULL,
	tenant      text        NOT NULL,
	enqueued_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
-- Schedules as data: the runs of the digest schedule, by replica.
CREATE TABLE demo_schedule_runs (
	tick    timestamptz NOT NULL,
	replica text        NOT NULL
);
CREATE TABLE demo_job_runs (
	mode        text        NOT NULL,
	tenant      text        NOT NULL,
	job_id      bigint      NOT NULL,
	worker      text        NOT NULL,
	enqueued_at timestamptz NOT NULL,
	started_at  timestamptz NOT NULL,
	finished_at timestamptz NOT NULL
);`
