package singleton_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/pgcoord"
	"github.com/pgcoord/pgcoord/singleton"
)

type outcome struct {
	ran bool
	err error
}

// Of many replicas calling RunOnce at once, exactly one runs fn; the others return
// (false, nil) while the winner is still inside fn, without waiting for it.
func TestRunOnceExactlyOneOfManyRuns(t *testing.T) {
	t.Parallel()
	const n = 12
	pool, _ := migrated(t, n+2)
	ctx := t.Context()
	for round := range 3 {
		var runs atomic.Int32
		entered, release := make(chan struct{}), make(chan struct{})
		results := make(chan outcome, n)
		start := make(chan struct{})
		for range n {
			go func() {
				<-start
				ran, err := singleton.RunOnce(ctx, pool, "report", func(ctx context.Context, tx pgx.Tx) error {
					if runs.Add(1) == 1 {
						close(entered)
					}
					select {
					case <-release:
						return nil
					case <-time.After(30 * time.Second):
						return errors.New("never released")
					}
				})
				results <- outcome{ran, err}
			}()
		}
		close(start)
		within(t, 10*time.Second, entered, "a winner entering fn")
		for i := range n - 1 {
			r := within(t, 10*time.Second, results, fmt.Sprintf("round %d: loser %d returning while the winner holds the lock", round, i))
			if r.ran || r.err != nil {
				t.Fatalf("round %d: a second replica got (%v, %v) while the winner was inside fn", round, r.ran, r.err)
			}
		}
		close(release)
		if r := within(t, 10*time.Second, results, "the winner returning"); !r.ran || r.err != nil {
			t.Fatalf("round %d: winner got (%v, %v), want (true, nil)", round, r.ran, r.err)
		}
		if got := runs.Load(); got != 1 {
			t.Fatalf("round %d: fn ran %d times, want once", round, got)
		}
	}
}

// The lock ends with the transaction: after a commit, after fn's error (whose writes are
// rolled back) and after a panic in fn, the next RunOnce runs.
func TestRunOnceReleasesAtCommitAndRollback(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	ctx := t.Context()
	if _, err := pool.Exec(ctx, `CREATE TABLE marks (n int)`); err != nil {
		t.Fatal(err)
	}
	insert := func(n int, fnErr error) func(context.Context, pgx.Tx) error {
		return func(ctx context.Context, tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `INSERT INTO marks VALUES ($1)`, n); err != nil {
				return err
			}
			return fnErr
		}
	}
	if ran, err := singleton.RunOnce(ctx, pool, "job", insert(1, nil)); !ran || err != nil {
		t.Fatalf("first RunOnce = (%v, %v)", ran, err)
	}
	if pid := lockHolder(ctx, t, pool, "job"); pid != 0 {
		t.Fatalf("backend %d still holds the lock after the commit", pid)
	}
	boom := errors.New("boom")
	if ran, err := singleton.RunOnce(ctx, pool, "job", insert(2, boom)); !ran || !errors.Is(err, boom) {
		t.Fatalf("RunOnce with a failing fn = (%v, %v), want (true, boom)", ran, err)
	}
	func() {
		defer func() {
			if r := recover(); r != "kaboom" {
				t.Errorf("recovered %v, want fn's panic", r)
			}
		}()
		_, _ = singleton.RunOnce(ctx, pool, "job", func(ctx context.Context, tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `INSERT INTO marks VALUES (3)`); err != nil {
				return err
			}
			panic("kaboom")
		})
	}()
	if pid := lockHolder(ctx, t, pool, "job"); pid != 0 {
		t.Fatalf("backend %d still holds the lock after fn failed", pid)
	}
	if ran, err := singleton.RunOnce(ctx, pool, "job", insert(4, nil)); !ran || err != nil {
		t.Fatalf("RunOnce after a failure = (%v, %v), want it to run", ran, err)
	}
	rows, _ := pool.Query(ctx, `SELECT n FROM marks ORDER BY n`)
	got, err := pgx.CollectRows(rows, pgx.RowTo[int])
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(got) != "[1 4]" {
		t.Fatalf("marks = %v, want [1 4]: committed writes kept, failed ones rolled back", got)
	}
}

// A RunOnce writes no new version of its job's row: the job keeps its generation (and
// lock key) from run to run, so that beside a transaction that keeps vacuum from removing
// old versions, runs do not pile them up. It notes the job in use (used_at, for pgcoord gc)
// at most once a minute; a squatted key still moves the job on (squat_test.go).
func TestRunOnceWritesNoRowVersion(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	ctx := t.Context()
	run := func() {
		t.Helper()
		if ran, err := singleton.RunOnce(ctx, pool, "quiet", func(context.Context, pgx.Tx) error { return nil }); !ran || err != nil {
			t.Fatalf("RunOnce = (%v, %v)", ran, err)
		}
	}
	type version struct {
		Xmin, Gen string
		Stale     bool
	}
	read := func() version {
		t.Helper()
		var v version
		if err := pool.QueryRow(ctx, `SELECT xmin::text, gen::text, used_at < pgcoord_now() - interval '1 minute'
			FROM pgcoord_singletons WHERE job = 'quiet'`).Scan(&v.Xmin, &v.Gen, &v.Stale); err != nil {
			t.Fatal(err)
		}
		return v
	}
	run() // the job's first run inserts its row
	first := read()
	for range 10 {
		run()
	}
	if got := read(); got != first {
		t.Fatalf("after 10 runs the job's row is %+v, was %+v: a run wrote a new version", got, first)
	}
	if _, err := pool.Exec(ctx, `UPDATE pgcoord_singletons SET used_at = used_at - interval '2 minutes' WHERE job = 'quiet'`); err != nil {
		t.Fatal(err)
	}
	stale := read()
	run()
	if got := read(); got.Stale || got.Xmin == stale.Xmin || got.Gen != first.Gen {
		t.Fatalf("a run of a job last noted 2 minutes ago left its row %+v (before %+v): want used_at noted, the generation %s kept", got, stale, first.Gen)
	}
}

// A RunOnce that finds in its job's row the record of a RunSession whose backend died
// clears it and moves the job to a new generation, as every run did before migration
// 00024: a stale pid stays in no row, where gc (which skips rows with a pid) would keep it
// and every run would look the dead pid up in pg_locks.
func TestRunOnceClearsADeadSessionsRecord(t *testing.T) {
	t.Parallel()
	pgtest.NeedsSession(t, "a session-level advisory lock, and its backend killed")
	pool := pgtest.Pool(t)
	ctx := t.Context()
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var locked bool
	var gen int64
	if err := conn.QueryRow(ctx, `SELECT locked, gen FROM pgcoord_singleton_try('left', true)`).Scan(&locked, &gen); err != nil || !locked {
		t.Fatalf("pgcoord_singleton_try('left', true) = %v, %v", locked, err)
	}
	session := conn.Hijack()
	defer session.Close(context.WithoutCancel(ctx))
	pid := int32(session.PgConn().PID())
	terminate(ctx, t, pool, pid)
	pgtest.Until(t, "the session's backend gone", func() bool {
		var gone bool
		return pool.QueryRow(ctx, `SELECT NOT EXISTS (SELECT FROM pg_stat_activity WHERE pid = $1)`, pid).Scan(&gone) == nil && gone
	})
	if ran, err := singleton.RunOnce(ctx, pool, "left", func(context.Context, pgx.Tx) error { return nil }); !ran || err != nil {
		t.Fatalf("RunOnce after the session holder died = (%v, %v), want it to run", ran, err)
	}
	var recorded bool
	var now int64
	if err := pool.QueryRow(ctx, `SELECT pid IS NOT NULL, gen FROM pgcoord_singletons WHERE job = 'left'`).Scan(&recorded, &now); err != nil {
		t.Fatal(err)
	}
	if recorded || now == gen {
		t.Fatalf("after the RunOnce the row still records a session (%v), generation %d (was %d): want the record cleared and the job moved on", recorded, now, gen)
	}
}

// On a connection that has run RunOnce before, BEGIN rides with the lock: a run costs two
// round trips (BEGIN and the lock, then COMMIT) beside fn's statements, as does a replica
// that finds the lock taken (then ROLLBACK). fn cannot end RunOnce's transaction.
func TestRunOnceRoundTripsAndItsTx(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	other := pgtest.Pool(t) // another session, in the same schema
	cfg := other.Config()
	rt := &pgtest.RoundTrips{}
	cfg.ConnConfig.Tracer = rt
	cfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	run := func(fn func(context.Context, pgx.Tx) error) (bool, int64) {
		t.Helper()
		before := rt.N()
		ran, err := singleton.RunOnce(ctx, pool, "job", fn)
		if err != nil {
			t.Fatal(err)
		}
		return ran, rt.N() - before
	}
	nothing := func(context.Context, pgx.Tx) error { return nil }
	run(nothing) // the connection's first: pgx sends BEGIN in a round trip of its own
	for i := range 3 {
		if ran, n := run(nothing); !ran || n != 2 {
			t.Errorf("run %d: ran %v in %d round trips, want it to run in 2", i, ran, n)
		}
	}
	// Another session holds the job's lock: RunOnce finds it taken.
	tx, err := other.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SELECT pgcoord_singleton_try($1, false)`, "job"); err != nil {
		t.Fatal(err)
	}
	if ran, n := run(nothing); ran || n != 2 {
		t.Errorf("beside the lock's holder RunOnce ran %v in %d round trips, want (false, 2)", ran, n)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	ran, _ := run(func(ctx context.Context, tx pgx.Tx) error {
		if tx.Commit(ctx) == nil || tx.Rollback(ctx) == nil {
			return errors.New("fn ended RunOnce's transaction")
		}
		_, err := tx.Exec(ctx, `SELECT 1`)
		return err
	})
	if !ran {
		t.Fatal("RunOnce did not run after the lock was freed")
	}
}

// A plain SQL caller of pgcoord_singleton_try (session-level) excludes RunOnce; the key
// RunOnce locked before 00010 (pgcoord_lock_key of LockName), which any login can compute,
// and the key a run held, read from pg_locks, exclude nothing.
func TestRunOnceSharesItsLockWithPlainSQLNotItsOldKey(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	ctx := t.Context()
	pgtest.NeedsSession(t, "a session-level advisory lock")
	conn, err := pgtest.Direct(t, pool).Acquire(ctx) // a session lock needs a session of its own
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	var locked bool
	var gen, key int64
	if err := conn.QueryRow(ctx, `SELECT locked, gen, lock_key FROM pgcoord_singleton_try('nightly', true)`).Scan(&locked, &gen, &key); err != nil || !locked {
		t.Fatalf("pgcoord_singleton_try = %v, %v", locked, err)
	}
	called := false
	ran, err := singleton.RunOnce(ctx, pool, "nightly", func(context.Context, pgx.Tx) error { called = true; return nil })
	if ran || err != nil || called {
		t.Fatalf("RunOnce beside a plain SQL holder = (%v, %v), fn called %v; want (false, nil)", ran, err, called)
	}
	if _, err := conn.Exec(ctx, `SELECT pgcoord_singleton_release('nightly', $1, $2)`, gen, key); err != nil {
		t.Fatal(err)
	}
	// Squat on the old key and on the key the plain SQL holder held: RunOnce runs.
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock(pgcoord_lock_key('singleton:nightly')), pg_advisory_lock($1)`, key); err != nil {
		t.Fatal(err)
	}
	defer func() { _, _ = conn.Exec(context.WithoutCancel(ctx), `SELECT pg_advisory_unlock_all()`) }()
	if ran, err := singleton.RunOnce(ctx, pool, "nightly", func(context.Context, pgx.Tx) error { return nil }); !ran || err != nil {
		t.Fatalf("RunOnce beside squatters = (%v, %v), want (true, nil)", ran, err)
	}
}

// The same job name in two schemas (two applications in one database) takes two different
// locks.
func TestRunOnceSchemasDoNotCollide(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	poolA, poolB := pgtest.Pool(t), pgtest.Pool(t)
	ran, err := singleton.RunOnce(ctx, poolA, "report", func(ctx context.Context, _ pgx.Tx) error {
		// While A's replica holds the lock: B's replica of the same job runs, A's other
		// replica does not.
		ranB, err := singleton.RunOnce(ctx, poolB, "report", func(context.Context, pgx.Tx) error { return nil })
		if !ranB || err != nil {
			return fmt.Errorf("schema B's RunOnce = (%v, %v), want it to run", ranB, err)
		}
		ranA, err := singleton.RunOnce(ctx, poolA, "report", func(context.Context, pgx.Tx) error { return nil })
		if ranA || err != nil {
			return fmt.Errorf("schema A's second RunOnce = (%v, %v), want (false, nil)", ranA, err)
		}
		return nil
	})
	if !ran || err != nil {
		t.Fatalf("RunOnce = (%v, %v)", ran, err)
	}
}

// When the winner's connection dies (here pg_terminate_backend; a crashed replica is the
// same for the server), the server releases the lock and another replica can run; the
// dead winner's RunOnce reports the failed commit.
func TestRunOnceLockFreedWhenConnectionDies(t *testing.T) {
	t.Parallel()
	pool, _ := migrated(t, 6)
	ctx := t.Context()
	pids, release := make(chan int32, 1), make(chan struct{})
	winner := make(chan outcome, 1)
	go func() {
		ran, err := singleton.RunOnce(ctx, pool, "job", func(ctx context.Context, tx pgx.Tx) error {
			var pid int32
			if err := tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
				return err
			}
			pids <- pid
			<-release
			return nil
		})
		winner <- outcome{ran, err}
	}()
	pid := within(t, 10*time.Second, pids, "the winner's backend pid")
	if ran, err := singleton.RunOnce(ctx, pool, "job", func(context.Context, pgx.Tx) error { return nil }); ran || err != nil {
		t.Fatalf("RunOnce while the winner holds the lock = (%v, %v)", ran, err)
	}
	terminate(ctx, t, pool, pid)
	eventually(t, 10*time.Second, func() error {
		ran, err := singleton.RunOnce(ctx, pool, "job", func(context.Context, pgx.Tx) error { return nil })
		if !ran || err != nil {
			return fmt.Errorf("RunOnce after the winner's backend was terminated = (%v, %v), want it to run", ran, err)
		}
		return nil
	})
	close(release)
	if r := within(t, 10*time.Second, winner, "the dead winner returning"); !r.ran || r.err == nil {
		t.Fatalf("the dead winner's RunOnce = (%v, %v), want (true, the commit's error)", r.ran, r.err)
	}
}

// Bad arguments are refused before any SQL runs (a nil pool would panic otherwise).
func TestRunOnceValidatesFirst(t *testing.T) {
	t.Parallel()
	fn := func(context.Context, pgx.Tx) error { return nil }
	if _, err := singleton.RunOnce(t.Context(), nil, "", fn); !errors.Is(err, pgcoord.ErrInvalidName) {
		t.Errorf("empty job: %v, want ErrInvalidName", err)
	}
	if _, err := singleton.RunOnce(t.Context(), nil, "job", fn); !errors.Is(err, pgcoord.ErrInvalidArgument) {
		t.Errorf("nil pool: %v, want ErrInvalidArgument", err)
	}
	pool := pgtest.Pool(t)
	if _, err := singleton.RunOnce(t.Context(), pool, "job", nil); !errors.Is(err, pgcoord.ErrInvalidArgument) {
		t.Errorf("nil fn: %v, want ErrInvalidArgument", err)
	}
}
