package idempotency_test

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

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
