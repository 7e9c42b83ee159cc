package singleton_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/singleton"
)

// Exclusion across generations: workers run one job with RunOnce (a third of whose runs
// fail and roll back, leaving the generation they used) and RunSession, while a squatter
// takes every key it sees a run hold, as soon as the run ends. No two runs of the job
// overlap, and the job keeps running: a squatted key moves the job to a new generation
// instead of stalling it (the generation is re-read under the row's lock, so a replica
// that locked an old generation's key never runs).
func TestRunsNeverOverlapAcrossGenerations(t *testing.T) {
	t.Parallel()
	pgtest.NeedsSession(t, "RunSession's session-level lock and the squatter's")
	pool, _ := migrated(t, 8)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	squatter, err := pgtest.Direct(t, pool).Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		_, _ = squatter.Exec(context.WithoutCancel(ctx), `SELECT pg_advisory_unlock_all()`)
		squatter.Release()
	}()

	const job, want = "shared", 60
	var active, overlaps, ran, failedRuns atomic.Int64
	var mu sync.Mutex
	var seen []int64 // keys held by runs, squatted after each run
	heldBy := func(pid int32) error {
		rows, err := pool.Query(ctx, `SELECT (classid::bigint << 32) | objid::bigint FROM pg_locks
			WHERE locktype = 'advisory' AND granted AND objsubid = 1 AND pid = $1`, pid)
		if err != nil {
			return err
		}
		keys, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		mu.Lock()
		seen = append(seen, keys...)
		mu.Unlock()
		return err
	}
	var squatMu sync.Mutex // the squatter's one connection
	squat := func() error {
		squatMu.Lock()
		defer squatMu.Unlock()
		mu.Lock()
		keys := seen
		seen = nil
		mu.Unlock()
		for _, k := range keys {
			if _, err := squatter.Exec(ctx, `SELECT pg_try_advisory_lock($1)`, k); err != nil {
				return err
			}
		}
		return nil
	}
	body := func(ctx context.Context, pid int32) error {
		if active.Add(1) > 1 {
			overlaps.Add(1)
		}
		defer active.Add(-1)
		return heldBy(pid)
	}
	errBoom := errors.New("boom")
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ran.Load() < want; i++ {
				if ctx.Err() != nil {
					errs <- ctx.Err()
					return
				}
				var got bool
				var err error
				if (w+i)%2 == 0 {
					got, err = singleton.RunOnce(ctx, pool, job, func(ctx context.Context, tx pgx.Tx) error {
						var pid int32
						if err := tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
							return err
						}
						if err := body(ctx, pid); err != nil {
							return err
						}
						if i%3 == 0 {
							return errBoom // rolled back: the generation stays, its key was seen
						}
						return nil
					})
				} else {
					got, err = singleton.RunSession(ctx, pool, job, func(ctx context.Context) error {
						var pid int32
						if err := pool.QueryRow(ctx, `SELECT pid FROM pgcoord_singletons WHERE job = $1`, job).Scan(&pid); err != nil {
							return err
						}
						return body(ctx, pid)
					}, nil)
				}
				if errors.Is(err, errBoom) {
					failedRuns.Add(1)
					err = nil
				}
				if err != nil {
					errs <- err
					return
				}
				if got {
					ran.Add(1)
					if err := squat(); err != nil {
						errs <- err
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("a worker stopped after %d runs: %v", ran.Load(), err)
	}
	if n := overlaps.Load(); n != 0 {
		t.Fatalf("%d runs overlapped another run of the job", n)
	}
	t.Logf("%d runs (%d rolled back), none overlapping, beside a squatter", ran.Load(), failedRuns.Load())
}
