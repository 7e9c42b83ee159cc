package dedupe_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/dedupe"
	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/pgcoord"
)

// claimN claims n keys "prefix-i" in one transaction with opts, and fails t unless each is
// new.
func claimN(t *testing.T, pool *pgxpool.Pool, prefix string, n int, opts *dedupe.ClaimOpts) {
	t.Helper()
	err := pgx.BeginFunc(t.Context(), pool, func(tx pgx.Tx) error {
		for i := range n {
			ok, err := dedupe.Claim(t.Context(), tx, "gc", fmt.Sprintf("%s-%d", prefix, i), opts)
			if err != nil {
				return err
			}
			if !ok {
				return fmt.Errorf("claim %s-%d was not new", prefix, i)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// claimExpired claims n keys "prefix-i" with the database clock an hour back, kept a
// minute: claims that expired 59 minutes ago.
func claimExpired(t *testing.T, pool *pgxpool.Pool, prefix string, n int) {
	t.Helper()
	clock := pgtest.NewClock(t, pool)
	clock.Run(-time.Hour)
	claimN(t, pool, prefix, n, &dedupe.ClaimOpts{Retention: time.Minute})
	clock.Run(0)
}

// keysLeft returns the keys of the remaining claims, sorted.
func keysLeft(t *testing.T, pool *pgxpool.Pool) []string {
	t.Helper()
	rows, err := pool.Query(t.Context(), `SELECT key FROM pgcoord_dedupe ORDER BY key`)
	if err != nil {
		t.Fatal(err)
	}
	keys, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return keys
}

// GC deletes only expired claims, in batches, reporting progress; a dry run counts them
// and deletes nothing.
func TestGCDeletesOnlyExpiredInBatches(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pgtest.Pool(t)
	clock := pgtest.NewClock(t, pool)
	clock.Run(-2 * time.Hour)
	claimN(t, pool, "expired", 7, &dedupe.ClaimOpts{Retention: time.Hour}) // expired an hour ago
	clock.Run(0)
	claimN(t, pool, "live", 3, &dedupe.ClaimOpts{Retention: time.Hour}) // expires in an hour
	claimN(t, pool, "forever", 2, nil)

	var dry []int64
	n, err := dedupe.GC(ctx, pool, &dedupe.GCOpts{DryRun: true, Progress: func(d int64) { dry = append(dry, d) }})
	if err != nil || n != 7 || !slices.Equal(dry, []int64{7}) {
		t.Fatalf("dry-run GC = %d, %v, progress %v; want 7 counted and reported once", n, err, dry)
	}
	if left := len(keysLeft(t, pool)); left != 12 {
		t.Fatalf("a dry run deleted claims: %d left of 12", left)
	}

	var progress []int64
	n, err = dedupe.GC(ctx, pool, &dedupe.GCOpts{Batch: 2, Progress: func(d int64) { progress = append(progress, d) }})
	if err != nil || n != 7 {
		t.Fatalf("GC = %d, %v; want the 7 expired claims deleted", n, err)
	}
	// Batches of 2: 2, 4, 6, then 7 (a short batch ends the loop).
	if !slices.Equal(progress, []int64{2, 4, 6, 7}) {
		t.Errorf("GC progress %v, want 2 4 6 7", progress)
	}
	want := []string{"forever-0", "forever-1", "live-0", "live-1", "live-2"}
	if got := keysLeft(t, pool); !slices.Equal(got, want) {
		t.Fatalf("left after GC: %v, want %v", got, want)
	}

	// Nothing more to do.
	if n, err := dedupe.GC(ctx, pool, nil); err != nil || n != 0 {
		t.Fatalf("second GC = %d, %v; want 0", n, err)
	}
	// Two hours on, the live claims have expired; claims kept forever never do.
	clock.Run(2 * time.Hour)
	if n, err := dedupe.GC(ctx, pool, &dedupe.GCOpts{DryRun: true}); err != nil || n != 3 {
		t.Fatalf("dry run two hours on = %d, %v; want 3", n, err)
	}
	if n, err := dedupe.GC(ctx, pool, &dedupe.GCOpts{Batch: 3}); err != nil || n != 3 {
		t.Fatalf("GC two hours on = %d, %v; want 3", n, err)
	}
	if got := keysLeft(t, pool); !slices.Equal(got, want[:2]) {
		t.Fatalf("left: %v, want only the claims kept forever", got)
	}

	// A collected key can be claimed again.
	claimN(t, pool, "expired", 1, nil)
}

// A batch exactly as large as what is left needs one more, empty, batch to know it is done.
func TestGCExactBatches(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	claimExpired(t, pool, "x", 6)
	var progress []int64
	n, err := dedupe.GC(t.Context(), pool, &dedupe.GCOpts{Batch: 3, Progress: func(d int64) { progress = append(progress, d) }})
	if err != nil || n != 6 || !slices.Equal(progress, []int64{3, 6}) {
		t.Fatalf("GC = %d, %v, progress %v; want 6 in two batches of 3", n, err, progress)
	}
}

func TestGCRejectsBadInputBeforeSQL(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	for _, batch := range []int{-1, dedupe.MaxGCBatch + 1} {
		if _, err := dedupe.GC(ctx, noSQL{}, &dedupe.GCOpts{Batch: batch}); !errors.Is(err, pgcoord.ErrInvalidArgument) {
			t.Errorf("GC with batch %d: %v, want ErrInvalidArgument", batch, err)
		}
	}
	if _, err := dedupe.GC(ctx, nil, nil); !errors.Is(err, pgcoord.ErrInvalidArgument) {
		t.Errorf("GC with a nil db: %v, want ErrInvalidArgument", err)
	}
	if _, err := dedupe.GC(ctx, (*pgxpool.Pool)(nil), nil); !errors.Is(err, pgcoord.ErrInvalidArgument) {
		t.Errorf("GC with a typed nil pool: %v, want ErrInvalidArgument", err)
	}
}

// GC stops when its context is done, reporting what it deleted.
func TestGCStopsOnCancel(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	claimExpired(t, pool, "c", 5)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	n, err := dedupe.GC(ctx, pool, &dedupe.GCOpts{Batch: 1, Progress: func(d int64) {
		if d == 2 {
			cancel()
		}
	}})
	if n != 2 || !errors.Is(err, context.Canceled) {
		t.Fatalf("GC cancelled after 2 = %d, %v; want 2 and the context's error", n, err)
	}
	if left := len(keysLeft(t, pool)); left != 3 {
		t.Fatalf("%d claims left, want 3", left)
	}
}

// Concurrent GCs delete each expired claim once, without errors.
func TestGCConcurrent(t *testing.T) {
	t.Parallel()
	const gcs = 4
	pool := pgtest.PoolMax(t, gcs+1)
	claimExpired(t, pool, "e", 200)
	claimN(t, pool, "keep", 3, nil)
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		total int64
		errs  []error
	)
	start := make(chan struct{})
	for range gcs {
		wg.Go(func() {
			<-start
			n, err := dedupe.GC(t.Context(), pool, &dedupe.GCOpts{Batch: 7})
			mu.Lock()
			defer mu.Unlock()
			total += n
			if err != nil {
				errs = append(errs, err)
			}
		})
	}
	close(start)
	wg.Wait()
	// A GC whose batch lost rows to another one may stop early (a short batch): finish.
	rest, err := dedupe.GC(t.Context(), pool, nil)
	if err != nil || len(errs) > 0 {
		t.Fatalf("errors: %v, %v", errs, err)
	}
	if total+rest != 200 {
		t.Fatalf("concurrent GCs deleted %d, then %d more: want 200 in all", total, rest)
	}
	if left := len(keysLeft(t, pool)); left != 3 {
		t.Fatalf("%d claims left, want 3", left)
	}
}
