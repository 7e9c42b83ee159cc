package idempotency_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/idempotency"
	"github.com/pgcoord/pgcoord/internal/pgtest"
)

// Concurrent non-Atomic attempts through one pool share statements (their claims, stored
// responses and releases are coalesced), and each gets its own answer: 32 goroutines, each
// beginning 20 keys of its own and a key all of them race for, complete their own keys
// with their own responses, which replay byte for byte; of the shared keys each ran
// exactly once.
func TestCoalescedAttemptsShareStatementsAndKeepTheirOwnAnswers(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	rt := &pgtest.RoundTrips{}
	pool, _ := pgtest.TracedPool(t, 4, rt)
	const workers, each = 32, 20
	var ran atomic.Int64
	var wg sync.WaitGroup
	before := rt.N()
	var calls atomic.Int64
	for w := range workers {
		wg.Go(func() {
			for i := range each {
				for _, key := range []string{fmt.Sprintf("own-%d-%d", w, i), fmt.Sprintf("shared-%d", i)} {
					calls.Add(2)
					a, err := idempotency.Begin(ctx, pool, "co", key, fp, nil)
					if errors.Is(err, idempotency.ErrInFlight) {
						continue
					}
					if err != nil {
						t.Error(err)
						return
					}
					if a.Replay() != nil {
						continue // a shared key another worker completed
					}
					ran.Add(1)
					if err := a.Complete(ctx, idempotency.Response{Status: 201, Body: []byte(key + " by " + fmt.Sprint(w))}); err != nil {
						t.Error(err)
						return
					}
				}
			}
		})
	}
	wg.Wait()
	statements := rt.N() - before
	t.Logf("%d calls in %d statements; %d attempts ran", calls.Load(), statements, ran.Load())
	if statements >= calls.Load() {
		t.Errorf("%d calls sent %d statements: none were coalesced", calls.Load(), statements)
	}
	// Every own key replays its own response; every shared key ran once (its response is
	// one worker's) or not at all (every worker found it in flight).
	shared := 0
	for w := range workers {
		for i := range each {
			key := fmt.Sprintf("own-%d-%d", w, i)
			a, err := idempotency.Begin(ctx, pool, "co", key, fp, nil)
			if err != nil || a.Replay() == nil {
				t.Fatalf("%s: %v, not a replay", key, err)
			}
			if got, want := string(a.Replay().Body), key+" by "+fmt.Sprint(w); got != want {
				t.Errorf("%s replays %q, want %q", key, got, want)
			}
		}
	}
	for i := range each {
		a, err := idempotency.Begin(ctx, pool, "co", fmt.Sprintf("shared-%d", i), fp, nil)
		if err != nil {
			t.Fatal(err)
		}
		if a.Replay() != nil {
			shared++
		} else {
			a.Close(ctx)
		}
	}
	if want := int64(workers*each + shared); ran.Load() != want {
		t.Errorf("%d attempts ran: want one per own key (%d) and one per completed shared key (%d)", ran.Load(), workers*each, shared)
	}
}

// A caller that gives up while its claim's batch is in flight gets its context's error; if
// the batch then claims the key for it, the key is released at once (its holder is the
// attempt's own: nobody would run it until its lease lapsed), and the next attempt runs.
func TestAClaimNobodyWaitsForIsReleased(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	plain := pgtest.Pool(t)
	cfg := plain.Config()
	const app = "idempotency orphans"
	cfg.ConnConfig.RuntimeParams["application_name"] = app
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	// A key inserted and not yet committed by another transaction: a claim of it waits.
	insertKey := func(key string) func() {
		tx, err := plain.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO pgcoord_idempotency_keys
			(scope, key, fingerprint, state, holder, created_at, updated_at, expires_at, lease_expires_at)
			VALUES ('co', $1, '\x01', 'in_flight', 'blocker', now(), now(), now() + interval '1 day', now() + interval '1 minute')`, key); err != nil {
			t.Fatal(err)
		}
		undo := sync.OnceFunc(func() { _ = tx.Rollback(ctx) })
		t.Cleanup(undo)
		return undo
	}
	blocked := func() bool { return pgtest.LockWaiters(t, plain, app) == 1 }
	unblockFirst, unblockX := insertKey("first"), insertKey("x")
	errs := make(chan error, 3)
	begin := func(ctx context.Context, key string) {
		go func() {
			a, err := idempotency.Begin(ctx, pool, "co", key, fp, nil)
			if err == nil && a.Replay() != nil {
				err = fmt.Errorf("%s replayed", key)
			}
			errs <- err
		}()
	}
	begin(ctx, "first")
	pgtest.Until(t, "the lone claim to wait for its row", blocked)
	gone, giveUp := context.WithCancel(ctx)
	defer giveUp()
	begin(gone, "x")
	pgtest.Until(t, "x to wait behind it", func() bool { return idempotency.ClaimsWaiting(pool) == 1 })
	begin(ctx, "y")
	pgtest.Until(t, "y to wait behind it", func() bool { return idempotency.ClaimsWaiting(pool) == 2 })
	unblockFirst()
	if err := <-errs; err != nil {
		t.Fatalf("first: %v", err)
	}
	pgtest.Until(t, "the batch of x and y to wait for x's row", blocked)
	giveUp()
	if err := <-errs; !errors.Is(err, context.Canceled) {
		t.Fatalf("x's caller, gone while its claim was in flight: %v, want its context's error", err)
	}
	unblockX()
	if err := <-errs; err != nil {
		t.Fatalf("y: %v", err)
	}
	pgtest.Until(t, "x's claim to be released", func() bool {
		var n int
		if err := plain.QueryRow(ctx, `SELECT count(*) FROM pgcoord_idempotency_keys WHERE scope = 'co' AND key = 'x'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 0
	})
}
