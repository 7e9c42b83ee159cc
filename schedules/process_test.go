package schedules_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/internal/workerproc"
	"github.com/pgcoord/pgcoord/schedules"
)

// replicaRole is the role of the worker processes of these tests (TestMain runs it): a
// replica running a Scheduler with handler "h" (see recorder) until it is stopped or killed.
const replicaRole = "schedules-replica"

// recordTables are the tables recorder writes: each call of the handler, and each tick it
// completed (once, however often it ran).
const recordTables = `
CREATE TABLE calls (tick timestamptz NOT NULL, attempt int NOT NULL, token bigint NOT NULL, pid int NOT NULL);
CREATE TABLE done (tick timestamptz PRIMARY KEY);`

// recorder is a handler that records its call, then blocks until its context ends when the
// tick is block, else records the tick done (idempotently) and returns.
func recorder(pool *pgxpool.Pool, block time.Time, pid int) schedules.Handler {
	return func(ctx context.Context, run schedules.Run) error {
		if _, err := pool.Exec(ctx, `INSERT INTO calls VALUES ($1, $2, $3, $4)`, run.Tick, run.Attempt, run.Token, pid); err != nil {
			return err
		}
		if run.Tick.Equal(block) {
			<-ctx.Done()
			return ctx.Err()
		}
		_, err := pool.Exec(ctx, `INSERT INTO done VALUES ($1) ON CONFLICT DO NOTHING`, run.Tick)
		return err
	}
}

func replica(ctx context.Context, w *workerproc.Worker) error {
	block, err := time.Parse(time.RFC3339Nano, w.Param("BLOCK"))
	if err != nil {
		return err
	}
	s, err := schedules.New(schedules.Config{Pool: w.Pool, RunTTL: 3 * time.Second, PollInterval: 200 * time.Millisecond,
		Handlers: map[string]schedules.Handler{"h": recorder(w.Pool, block, 1)}})
	if err != nil {
		return err
	}
	w.Say("running")
	if err := s.Run(ctx); err != context.Canceled {
		return err
	}
	return nil
}

// startReplica starts a worker process running a Scheduler on pool's schema, whose handler
// blocks at the tick block; the test kills it.
func startReplica(t *testing.T, pool *pgxpool.Pool, block time.Time) *workerproc.Proc {
	t.Helper()
	var schema string
	if err := pool.QueryRow(t.Context(), `SELECT current_schema()`).Scan(&schema); err != nil {
		t.Fatal(err)
	}
	p, err := workerproc.Start(workerproc.Spec{Name: "replica", Role: replicaRole, URL: pgtest.URL(t), Schema: schema,
		Params: map[string]string{"BLOCK": block.Format(time.RFC3339Nano)}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Stop(0); err != nil {
			t.Error(err)
		}
	})
	if _, err := p.Expect(pgtest.WaitLimit, "running"); err != nil {
		t.Fatal(err)
	}
	return p
}

// kill kills p with SIGKILL and waits for it to be gone.
func kill(t *testing.T, p *workerproc.Proc) {
	t.Helper()
	if err := p.Signal(9); err != nil {
		t.Fatal(err)
	}
	if err := p.Wait(pgtest.WaitLimit); err == nil {
		t.Fatal("the killed worker exited cleanly")
	}
}

// callsOf returns the recorded calls of the handler for tick: their attempts and tokens.
func callsOf(t *testing.T, pool *pgxpool.Pool, tick time.Time) (attempts []int, tokens []int64) {
	t.Helper()
	rows, err := pool.Query(t.Context(), `SELECT attempt, token FROM calls WHERE tick = $1 ORDER BY token`, tick)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var a int
		var tok int64
		if err := rows.Scan(&a, &tok); err != nil {
			t.Fatal(err)
		}
		attempts, tokens = append(attempts, a), append(tokens, tok)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return attempts, tokens
}

// TestKilledRunIsTakenOver: a replica SIGKILLed while it runs a tick has the tick taken
// over by another replica, within its catch-up window, as attempt 2 with a higher token; the
// tick succeeds once.
func TestKilledRunIsTakenOver(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	if _, err := pool.Exec(t.Context(), recordTables); err != nil {
		t.Fatal(err)
	}
	clock := pgtest.NewClock(t, pool)
	t0 := time.Date(2026, 3, 2, 8, 59, 59, 0, time.UTC)
	tick := time.Date(2026, 3, 2, 9, 0, 0, 0, time.UTC)
	clock.Freeze(t0)
	if _, err := schedules.Create(t.Context(), pool, schedules.Schedule{Name: "hourly", Expr: "0 * * * *", Handler: "h",
		CatchUp: time.Minute}, nil); err != nil {
		t.Fatal(err)
	}
	p := startReplica(t, pool, tick)
	clock.Freeze(tick.Add(time.Second))
	pgtest.Until(t, "the worker runs the tick", func() bool {
		attempts, _ := callsOf(t, pool, tick)
		return len(attempts) == 1
	})
	kill(t, p)
	clock.Advance(4 * time.Second) // past the dead runner's lease (3s), within the window (1m)
	start(t, pool, map[string]schedules.Handler{"h": recorder(pool, time.Time{}, 0)})
	pgtest.Until(t, "the tick succeeded", func() bool {
		states, _ := runStates(t, pool, "hourly")
		return states[tick] == "succeeded"
	})
	attempts, tokens := callsOf(t, pool, tick)
	if len(attempts) != 2 || attempts[0] != 1 || attempts[1] != 2 || tokens[1] <= tokens[0] {
		t.Errorf("calls of the tick: attempts %v, tokens %v; want attempts 1 then 2, with a higher token", attempts, tokens)
	}
	var attempt, done int
	if err := pool.QueryRow(t.Context(), `SELECT attempt, (SELECT count(*) FROM done) FROM pgcoord_job_runs WHERE job = 'hourly' AND scheduled_for = $1`,
		tick).Scan(&attempt, &done); err != nil {
		t.Fatal(err)
	}
	if states, _ := runStates(t, pool, "hourly"); attempt != 2 || done != 1 || len(states) != 1 {
		t.Errorf("ledger: attempt %d, %d ticks done, runs %v; want the one tick succeeded at attempt 2", attempt, done, states)
	}
}

// TestBackfillResumesAfterAKill: a backfill of 100 ticks, whose worker is SIGKILLed halfway
// (the 51st tick running), is finished by another scheduler: each tick succeeds once, the
// handler completes each once, and repeating the backfill records nothing.
func TestBackfillResumesAfterAKill(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	if _, err := pool.Exec(t.Context(), recordTables); err != nil {
		t.Fatal(err)
	}
	from := time.Now().Add(-10 * time.Minute).Truncate(time.Second).UTC()
	to := from.Add(99 * time.Second)
	// Ended before now: the schedule has no tick of its own to run, only the backfill's.
	if _, err := schedules.Create(t.Context(), pool, schedules.Schedule{Name: "bf", Expr: "@every 1s", Handler: "h",
		StartsAt: from, EndsAt: to}, nil); err != nil {
		t.Fatal(err)
	}
	n, err := schedules.Backfill(t.Context(), pool, "bf", from, to, nil)
	if err != nil || n != 100 {
		t.Fatalf("Backfill recorded %d, %v; want 100", n, err)
	}
	halfway := from.Add(50 * time.Second)
	p := startReplica(t, pool, halfway)
	pgtest.Until(t, "the worker runs the 51st tick", func() bool {
		attempts, _ := callsOf(t, pool, halfway)
		return len(attempts) == 1
	})
	kill(t, p)
	if done := count(t, pool, "done"); done != 50 {
		t.Fatalf("%d ticks done before the kill, want 50 (they run in tick order)", done)
	}
	start(t, pool, map[string]schedules.Handler{"h": recorder(pool, time.Time{}, 0)})
	pgtest.Until(t, "every tick is done", func() bool { return count(t, pool, "done") == 100 })
	pgtest.Until(t, "every run is recorded", func() bool {
		_, ticks := runStates(t, pool, "bf")
		return ticks["succeeded"] == 100
	})
	states, _ := runStates(t, pool, "bf")
	for i := range 100 {
		if tick := from.Add(time.Duration(i) * time.Second); states[tick] != "succeeded" {
			t.Errorf("tick %d is %q, want succeeded", i, states[tick])
		}
	}
	if len(states) != 100 {
		t.Errorf("%d runs in the ledger, want 100", len(states))
	}
	var twice int
	if err := pool.QueryRow(t.Context(), `SELECT count(*) FROM (SELECT tick FROM calls GROUP BY tick HAVING count(*) > 1) x`).Scan(&twice); err != nil {
		t.Fatal(err)
	}
	if attempts, _ := callsOf(t, pool, halfway); twice != 1 || len(attempts) != 2 {
		t.Errorf("%d ticks called more than once (the killed one %d times); want only the killed one, twice", twice, len(attempts))
	}
	if n, err := schedules.Backfill(t.Context(), pool, "bf", from, to, nil); err != nil || n != 0 {
		t.Errorf("repeated Backfill recorded %d, %v; want 0", n, err)
	}
}
