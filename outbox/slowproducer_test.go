package outbox_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/outbox"
)

// One long producer transaction stalls no one. A producer transaction that enqueued stays
// open for 10s while two relays go idle and wake again and again for the messages of other
// producers, each written in a short transaction of its own: every one of those enqueues
// completes without waiting for the long transaction, and every message (the long
// transaction's too) is delivered within about one poll interval of its commit. On the
// old protocol an idle relay's registration waited for the long transaction, and every
// producer that came after queued behind the registration: an enqueue took as long as the
// long transaction stayed open.
func TestLongProducerTransactionStallsNoOne(t *testing.T) {
	pgtest.NeedsSession(t, "LISTEN: an idle relay's registration; behind a pooler relays poll and never register")
	t.Parallel()
	ctx := t.Context()
	pool := pgtest.PoolMax(t, 20)
	const (
		poll          = 200 * time.Millisecond
		hold          = 10 * time.Second
		producers     = 3
		enqueueBound  = 2 * time.Second      // far below hold; enqueues usually take a few ms
		deliveryBound = poll + 3*time.Second // one poll interval, and room for a busy machine
	)

	// The long transaction writes first, before any relay runs: no relay is registered
	// when it checks, so its commit notifies nobody, and every registration while it is
	// open is loose.
	slow, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Rollback(context.WithoutCancel(ctx))
	slowMsg, err := outbox.Enqueue(ctx, slow, msg("k1", "slow"))
	if err != nil {
		t.Fatal(err)
	}
	opened := time.Now()
	slowDone := pgtest.Go(func() (time.Time, error) {
		select {
		case <-time.After(hold): // the scenario: a transaction that stays open this long
		case <-ctx.Done():
			return time.Time{}, ctx.Err()
		}
		at := time.Now()
		return at, slow.Commit(ctx)
	})

	var mu sync.Mutex
	delivered := map[int64]time.Time{} // first delivery of each message
	handler := outbox.HandlerFunc(func(_ context.Context, m outbox.Message) error {
		mu.Lock()
		defer mu.Unlock()
		if _, ok := delivered[m.ID]; !ok {
			delivered[m.ID] = time.Now()
		}
		return nil
	})
	rctx, stop := context.WithCancel(ctx)
	var relays []*outbox.Relay
	var rw sync.WaitGroup
	for range 2 {
		r := newRelay(t, pool, handler, outbox.Config{PollInterval: poll})
		relays = append(relays, r)
		rw.Go(func() { _ = r.Run(rctx) })
	}
	defer func() { stop(); rw.Wait() }()

	// While the long transaction is open, count the moments some relay is registered idle.
	idleSeen := pgtest.Go(func() (int, error) {
		n := 0
		for time.Since(opened) < hold {
			var idle bool
			if err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pgcoord_outbox_idle WHERE until > now())`).Scan(&idle); err != nil {
				return n, err
			}
			if idle {
				n++
			}
			time.Sleep(20 * time.Millisecond) // the sampling pace
		}
		return n, nil
	})

	// The other producers: short transactions to keys of their own, paced so that the
	// relays go idle in between.
	type sent struct {
		id      int64
		enqueue time.Duration // how long Enqueue took
		commit  time.Time     // when COMMIT was sent
	}
	var sentMu sync.Mutex
	var sents []sent
	var pw sync.WaitGroup
	for p := range producers {
		pw.Go(func() {
			for i := 0; time.Since(opened) < hold; i++ {
				tx, err := pool.Begin(ctx)
				if err != nil {
					t.Error(err)
					return
				}
				start := time.Now()
				m, err := outbox.Enqueue(ctx, tx, msg(fmt.Sprintf("p%d-%d", p, i), "fast"))
				took := time.Since(start)
				if err != nil {
					_ = tx.Rollback(ctx)
					t.Error(err)
					return
				}
				commit := time.Now()
				if err := tx.Commit(ctx); err != nil {
					t.Error(err)
					return
				}
				sentMu.Lock()
				sents = append(sents, sent{m.ID, took, commit})
				sentMu.Unlock()
				time.Sleep(time.Duration(20+rand.IntN(130)) * time.Millisecond) // the producers' pace
			}
		})
	}
	pw.Wait()
	slowCommit, err := slowDone.Wait(t)
	if err != nil {
		t.Fatal(err)
	}
	idle, err := idleSeen.Wait(t)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "every message delivered", func() bool { return pending(t, pool) == 0 })

	mu.Lock()
	defer mu.Unlock()
	var maxEnqueue, maxDelivery time.Duration
	for _, s := range sents {
		maxEnqueue = max(maxEnqueue, s.enqueue)
		if s.enqueue > enqueueBound {
			t.Errorf("message %d: Enqueue took %v while the long transaction was open", s.id, s.enqueue)
		}
		at, ok := delivered[s.id]
		if !ok {
			t.Errorf("message %d never delivered", s.id)
			continue
		}
		maxDelivery = max(maxDelivery, at.Sub(s.commit))
		if d := at.Sub(s.commit); d > deliveryBound {
			t.Errorf("message %d delivered %v after its commit, more than %v", s.id, d, deliveryBound)
		}
	}
	slowDelivery := delivered[slowMsg.ID].Sub(slowCommit)
	var claims int64
	for _, r := range relays {
		claims += r.Stats().Claims
	}
	t.Logf("%d short transactions beside a %v one: Enqueue took at most %v; delivered at most %v after commit (the long one's message %v); %d claims; a relay idle at %d samples",
		len(sents), hold, maxEnqueue, maxDelivery, slowDelivery, claims, idle)
	if _, ok := delivered[slowMsg.ID]; !ok || slowDelivery > deliveryBound {
		t.Errorf("the long transaction's message delivered %v after its commit (delivered: %v), want within %v", slowDelivery, ok, deliveryBound)
	}
	if len(sents) < 30 || claims < 10 || idle == 0 {
		t.Fatalf("the run was too tame: %d short transactions, %d claims, a relay idle at %d samples", len(sents), claims, idle)
	}
}
