//go:build unix

package integration_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/internal/workerproc"
	"github.com/pgcoord/pgcoord/schedules"
)

// The schedules replica: a process running a schedules.Scheduler (with its defaults) that
// has the handler schedHandler, which records each call as a row of sched_calls — one row
// per call, so a tick run twice shows as two rows.

const (
	schedReplicaRole = "schedules.replica"
	schedHandler     = "h"
)

func init() { workerRoles[schedReplicaRole] = schedReplica }

// schedCallsSchema is the table the replicas' handler writes: the schedule and tick of the
// call, when the handler started by the database clock, the run's token and attempt, and
// the process.
const schedCallsSchema = `CREATE TABLE sched_calls (
	schedule   text        NOT NULL,
	tick       timestamptz NOT NULL,
	started_at timestamptz NOT NULL DEFAULT clock_timestamp(),
	token      bigint      NOT NULL,
	attempt    int         NOT NULL,
	pid        int         NOT NULL
)`

// schedReplica runs its Scheduler until stopped or killed; it says "running" first.
func schedReplica(ctx context.Context, w *workerproc.Worker) error {
	pid := os.Getpid()
	record := func(ctx context.Context, run schedules.Run) error {
		_, err := w.Pool.Exec(ctx, `INSERT INTO sched_calls (schedule, tick, token, attempt, pid) VALUES ($1, $2, $3, $4, $5)`,
			run.Schedule, run.Tick, run.Token, run.Attempt, pid)
		return err
	}
	s, err := schedules.New(schedules.Config{Pool: w.Pool, Handlers: map[string]schedules.Handler{schedHandler: record}})
	if err != nil {
		return err
	}
	w.Say("running")
	if err := s.Run(ctx); !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}

// startSchedReplicas starts n replica processes on schema and waits until each has
// registered its handler, so that no tick waits for one; t's cleanup kills them.
func startSchedReplicas(t *testing.T, pool *pgxpool.Pool, schema string, n int) {
	t.Helper()
	for i := range n {
		p, err := startWorker(t, fmt.Sprintf("replica-%d", i), schedReplicaRole, pgtest.URL(t), schema, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := p.Expect(pgtest.WaitLimit, "running"); err != nil {
			t.Fatal(err)
		}
	}
	pgtest.Until(t, "every replica registered its handler", func() bool {
		return queryInt(t, pool, `SELECT count(*) FROM pgcoord_schedule_handlers WHERE handler = $1 AND until > now()`, schedHandler) == n
	})
}

// queryInt runs a query of one integer.
func queryInt(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(t.Context(), sql, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// schedCall is a row of sched_calls.
type schedCall struct {
	tick, started time.Time
	token         int64
	attempt, pid  int
}

// schedCallsOf returns the recorded calls of schedule's handler, by tick.
func schedCallsOf(t *testing.T, pool *pgxpool.Pool, schedule string) []schedCall {
	t.Helper()
	rows, err := pool.Query(t.Context(), `SELECT tick, started_at, token, attempt, pid FROM sched_calls WHERE schedule = $1 ORDER BY tick, started_at`, schedule)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var calls []schedCall
	for rows.Next() {
		var c schedCall
		if err := rows.Scan(&c.tick, &c.started, &c.token, &c.attempt, &c.pid); err != nil {
			t.Fatal(err)
		}
		c.tick, c.started = c.tick.UTC(), c.started.UTC()
		calls = append(calls, c)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return calls
}

// schedRun is a row of the ledger (pgcoord_job_runs): claimed is when the claim that wrote
// it began, by the database clock.
type schedRun struct {
	state   string
	token   int64
	attempt int
	ticks   int64
	claimed time.Time
}

// schedRunsOf returns the ledger's rows of schedule, by tick (its primary key).
func schedRunsOf(t *testing.T, pool *pgxpool.Pool, schedule string) map[time.Time]schedRun {
	t.Helper()
	rows, err := pool.Query(t.Context(), `SELECT scheduled_for, state, fence_token, attempt, ticks, started_at FROM pgcoord_job_runs WHERE job = $1`, schedule)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	runs := map[time.Time]schedRun{}
	for rows.Next() {
		var tick time.Time
		var r schedRun
		if err := rows.Scan(&tick, &r.state, &r.token, &r.attempt, &r.ticks, &r.claimed); err != nil {
			t.Fatal(err)
		}
		runs[tick.UTC()] = r
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return runs
}
