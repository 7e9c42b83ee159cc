package inbox_test

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/outbox/inbox"
	"github.com/pgcoord/pgcoord/pgcoord"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

type noSQL struct{ pgx.Tx }

// Concurrent deliveries of one message, some rolling back: the effect is applied by
// exactly one committed transaction, and a rolled-back claim leaves nothing.
func TestClaimAppliesEachMessageOnce(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pgtest.PoolMax(t, 12)
	if _, err := pool.Exec(ctx, `CREATE TABLE effects (message_id bigint, consumer text)`); err != nil {
		t.Fatal(err)
	}
	var applied atomic.Int64
	var wg sync.WaitGroup
	for i := range 10 {
		wg.Go(func() {
			tx, err := pool.Begin(ctx)
			if err != nil {
				t.Error(err)
				return
			}
			defer tx.Rollback(ctx)
			first, err := inbox.Claim(ctx, tx, "billing", 42)
			if err != nil {
				t.Error(err)
				return
			}
			if !first {
				return
			}
			if i%3 == 0 { // the consumer fails after claiming: nothing is recorded
				return
			}
			if _, err := tx.Exec(ctx, `INSERT INTO effects VALUES (42, 'billing')`); err != nil {
				t.Error(err)
				return
			}
			if err := tx.Commit(ctx); err == nil {
				applied.Add(1)
			}
		})
	}
	wg.Wait()
	var effects int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM effects`).Scan(&effects); err != nil {
		t.Fatal(err)
	}
	if applied.Load() != 1 || effects != 1 {
		t.Fatalf("applied %d times, %d effect rows; want exactly once", applied.Load(), effects)
	}
	// Another consumer applies the same message independently.
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		first, err := inbox.Claim(ctx, tx, "analytics", 42)
		if err == nil && !first {
			t.Error("a second consumer's first claim returned false")
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestClaimRejectsBadInputBeforeSQL(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	if _, err := inbox.Claim(ctx, noSQL{}, "", 1); !errors.Is(err, pgcoord.ErrInvalidName) {
		t.Errorf("empty consumer: %v", err)
	}
	if _, err := inbox.Claim(ctx, noSQL{}, "c", 0); !errors.Is(err, pgcoord.ErrInvalidArgument) {
		t.Errorf("id 0: %v", err)
	}
	if _, err := inbox.Claim(ctx, nil, "c", 1); !errors.Is(err, pgcoord.ErrInvalidArgument) {
		t.Errorf("nil tx: %v", err)
	}
	if _, err := inbox.GC(ctx, noSQL{}, &inbox.GCOpts{Batch: -1}); !errors.Is(err, pgcoord.ErrInvalidArgument) {
		t.Errorf("GC batch -1: %v", err)
	}
}

// GC deletes records past the retention only, in batches.
func TestGC(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pgtest.Pool(t)
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		for id := int64(1); id <= 5; id++ {
			if _, err := inbox.Claim(ctx, tx, "c", id); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	clock := pgtest.NewClock(t, pool)
	clock.Advance(29 * 24 * time.Hour)
	if n, err := inbox.GC(ctx, pool, nil); err != nil || n != 0 {
		t.Fatalf("GC inside the default 30-day retention deleted %d, %v", n, err)
	}
	clock.Advance(2 * 24 * time.Hour)
	if n, err := inbox.GC(ctx, pool, &inbox.GCOpts{DryRun: true}); err != nil || n != 5 {
		t.Fatalf("dry run = %d, %v", n, err)
	}
	var batches int
	n, err := inbox.GC(ctx, pool, &inbox.GCOpts{Batch: 2, Progress: func(int64) { batches++ }})
	if err != nil || n != 5 || batches != 3 {
		t.Fatalf("GC = %d, %v in %d batches; want 5 in 3", n, err, batches)
	}
	// A deleted record no longer protects: the message would be applied again.
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		first, err := inbox.Claim(ctx, tx, "c", 1)
		if err == nil && !first {
			t.Error("claim after GC returned false")
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}
