package integration_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/leases"
	"github.com/pgcoord/pgcoord/outbox"
	"github.com/pgcoord/pgcoord/semaphore"
	"github.com/pgcoord/pgcoord/singleton"
)

// The attack (issue 28, Medium 1): a login with no grant at all holds every
// advisory key it can compute from the migrations (pgcoord_lock_key is a hash of the
// schema and a name written in them), and every key it saw in pg_locks while pgcoord's
// sessions held it; each primitive keeps working. Before 00010, Enqueue blocked on
// 'outbox:wakeup', semaphore.Next on 'semaphore:next', and RunOnce answered "not mine" for
// a job nobody ran. Every step is bounded by a deadline: a stalled primitive fails the test
// with what it stalled on, and none waits for time to pass.
func TestSquattingLoginStallsNoPrimitive(t *testing.T) {
	t.Parallel()
	pgtest.NeedsSession(t, "session-level advisory locks (the stranger's, RunSession's)")
	ctx := t.Context()
	pool := pgtest.Pool(t)
	var schema string
	if err := pool.QueryRow(ctx, `SELECT current_schema()`).Scan(&schema); err != nil {
		t.Fatal(err)
	}
	stranger, err := pgx.Connect(ctx, pgtest.Stranger(t, pool))
	if err != nil {
		t.Fatal(err)
	}
	defer stranger.Close(context.WithoutCancel(ctx))

	// The stranger has no grant: pgcoord's tables, the secret among them, are closed to it.
	var pgErr *pgconn.PgError
	if _, err := stranger.Exec(ctx, fmt.Sprintf(`SELECT secret FROM %q.pgcoord_secret`, schema)); !errors.As(err, &pgErr) || pgErr.Code != "42501" {
		t.Fatalf("the stranger reads the secret: %v, want 42501", err)
	}

	held := map[int64]bool{}
	squat := func(why string, keys []int64) {
		t.Helper()
		for _, k := range keys {
			if held[k] {
				continue
			}
			var ok bool
			if err := stranger.QueryRow(ctx, `SELECT pg_try_advisory_lock($1)`, k).Scan(&ok); err != nil || !ok {
				t.Fatalf("the stranger could not take %s key %d: %v %v", why, k, ok, err)
			}
			held[k] = true
		}
	}
	// Keys computable from the migrations: pgcoord_lock_key(name) = hashtextextended(schema
	// || '.' || name, 0), for every name they lock, with this test's jobs, topic and key.
	const topic, key, job, sessionJob = "orders", "42", "nightly", "compaction"
	names := []string{"outbox:wakeup", "semaphore:next", "outbox:woken", "singleton:" + job, "singleton:" + sessionJob,
		fmt.Sprintf("outbox:%d:%s:%s", len(topic), topic, key)}
	var computed []int64
	for _, n := range names {
		var k int64
		if err := stranger.QueryRow(ctx, `SELECT hashtextextended($1 || '.' || $2, 0)`, schema, n).Scan(&k); err != nil {
			t.Fatal(err)
		}
		computed = append(computed, k)
	}
	squat("computed", computed)

	// sample reads, as the stranger, the advisory keys backend pid holds right now.
	var sampled []int64
	sample := func(pid int32) error {
		rows, err := stranger.Query(ctx, `SELECT (classid::bigint << 32) | objid::bigint FROM pg_locks
			WHERE locktype = 'advisory' AND granted AND objsubid = 1 AND pid = $1`, pid)
		if err != nil {
			return err
		}
		keys, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		sampled = append(sampled, keys...)
		return err
	}
	pidOf := func(tx pgx.Tx) (int32, error) {
		var pid int32
		err := tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid)
		return pid, err
	}
	bounded := func(what string, fn func(ctx context.Context) error) {
		t.Helper()
		bctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		if err := fn(bctx); err != nil {
			t.Fatalf("%s beside the squatting stranger: %v", what, err)
		}
	}

	// Each primitive, twice: first with the stranger sampling pg_locks while pgcoord holds
	// its locks, then after it squatted on every key it saw.
	relayed := make(chan int64, 16)
	relay, err := outbox.NewRelay(pool, &outbox.Config{Handler: outbox.HandlerFunc(func(_ context.Context, m outbox.Message) error {
		relayed <- m.ID
		return nil
	})})
	if err != nil {
		t.Fatal(err)
	}
	rctx, stopRelay := context.WithCancel(ctx)
	relayDone := make(chan error, 1)
	go func() { relayDone <- relay.Run(rctx) }()
	defer func() { stopRelay(); <-relayDone }()

	for round := range 2 {
		bounded(fmt.Sprintf("round %d: leases.TryAcquire/Release", round), func(ctx context.Context) error {
			return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				l, err := leases.TryAcquire(ctx, tx, "orders:42", time.Minute, nil)
				if err != nil {
					return err
				}
				pid, err := pidOf(tx)
				if err == nil {
					err = sample(pid)
				}
				return errors.Join(err, leases.Release(ctx, tx, l, nil))
			})
		})
		bounded(fmt.Sprintf("round %d: outbox.Enqueue and the relay's delivery", round), func(ctx context.Context) error {
			var id int64
			err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				m, err := outbox.Enqueue(ctx, tx, outbox.Message{Topic: topic, Key: key, Payload: []byte(`{}`), JSON: true})
				if err != nil {
					return err
				}
				id = m.ID
				pid, err := pidOf(tx)
				if err == nil {
					err = sample(pid)
				}
				return err
			})
			if err != nil {
				return err
			}
			for {
				select {
				case got := <-relayed:
					if got == id {
						return nil
					}
				case <-ctx.Done():
					return fmt.Errorf("message %d not delivered: %w", id, ctx.Err())
				}
			}
		})
		bounded(fmt.Sprintf("round %d: semaphore.Acquire and Next", round), func(ctx context.Context) error {
			p, err := semaphore.Acquire(ctx, pool, "tenant-1", 1, time.Minute, nil)
			if err != nil {
				return err
			}
			if err := semaphore.Release(ctx, pool, p); err != nil {
				return err
			}
			if err := semaphore.AddDemand(ctx, pool, "tenant-1", 1, nil); err != nil {
				return err
			}
			return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				p, err := semaphore.Next(ctx, tx, time.Minute, nil)
				if err != nil {
					return err
				}
				pid, err := pidOf(tx)
				if err == nil {
					err = sample(pid)
				}
				return errors.Join(err, semaphore.Done(ctx, tx, p))
			})
		})
		bounded(fmt.Sprintf("round %d: singleton.RunOnce", round), func(ctx context.Context) error {
			ran, err := singleton.RunOnce(ctx, pool, job, func(ctx context.Context, tx pgx.Tx) error {
				pid, err := pidOf(tx)
				if err == nil {
					err = sample(pid)
				}
				return err
			})
			if err == nil && !ran {
				err = errors.New("RunOnce answered (false, nil): not mine, for a job nobody runs")
			}
			return err
		})
		bounded(fmt.Sprintf("round %d: singleton.RunSession", round), func(ctx context.Context) error {
			ran, err := singleton.RunSession(ctx, pool, sessionJob, func(ctx context.Context) error {
				var pid int32
				if err := pool.QueryRow(ctx, `SELECT pid FROM pgcoord_singletons WHERE job = $1`, sessionJob).Scan(&pid); err != nil {
					return err
				}
				return sample(pid)
			}, nil)
			if err == nil && !ran {
				err = errors.New("RunSession answered (false, nil): not mine, for a job nobody runs")
			}
			return err
		})
		if round == 0 {
			if len(sampled) == 0 {
				t.Fatal("the stranger saw no advisory key held by pgcoord: the sampling saw nothing")
			}
			squat("sampled", sampled)
		}
	}
	t.Logf("the stranger held %d keys (%d computed, %d read from pg_locks)", len(held), len(computed), len(sampled))
}
