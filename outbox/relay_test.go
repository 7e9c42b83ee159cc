package outbox_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/outbox"
)

// Producers commit in an order unrelated to their ids, some roll back, while three relays
// run side by side: every committed message is delivered, no rolled-back one is, and each
// key's messages are first delivered in commit order (which, per key, is id order).
func TestRelaysDeliverCommittedMessagesInKeyOrder(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pgtest.PoolMax(t, 20)

	var mu sync.Mutex
	first := map[int64]bool{}     // ids delivered at least once
	order := map[string][]int64{} // per key: ids in the order of their first delivery
	handler := outbox.HandlerFunc(func(_ context.Context, m outbox.Message) error {
		mu.Lock()
		defer mu.Unlock()
		if !first[m.ID] {
			first[m.ID] = true
			order[m.Key] = append(order[m.Key], m.ID)
		}
		return nil
	})
	rctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for range 3 {
		r := newRelay(t, pool, handler, outbox.Config{BatchSize: 7, KeyBatchSize: 3, PollInterval: 20 * time.Millisecond})
		wg.Go(func() { _ = r.Run(rctx) })
	}
	defer func() { stop(); wg.Wait() }()

	// Transactions of several producers interleave, so they commit in an order unrelated
	// to when their ids were drawn. Writers of one key wait for each other inside Enqueue;
	// a transaction writes its keys in sorted order, so two never wait for each other in
	// a cycle (a deadlock).
	const producers, perProducer = 8, 25
	keys := []string{"a", "b", "c", "d", "e"}
	var committed, rolledBack sync.Map // id -> key
	var pw sync.WaitGroup
	for p := range producers {
		pw.Go(func() {
			for i := range perProducer {
				tx, err := pool.Begin(ctx)
				if err != nil {
					t.Error(err)
					return
				}
				var ids []int64
				txKeys := make([]string, 1+rand.IntN(3))
				for j := range txKeys {
					txKeys[j] = keys[rand.IntN(len(keys))]
				}
				slices.Sort(txKeys)
				for _, k := range txKeys {
					m, err := outbox.Enqueue(ctx, tx, msg(k, fmt.Sprintf("p%d-%d", p, i)))
					if err != nil {
						t.Error(err)
						_ = tx.Rollback(ctx)
						return
					}
					ids = append(ids, m.ID)
				}
				if rand.IntN(4) == 0 {
					_ = tx.Rollback(ctx)
					for _, id := range ids {
						rolledBack.Store(id, true)
					}
					continue
				}
				if err := tx.Commit(ctx); err != nil {
					t.Error(err)
					return
				}
				for _, id := range ids {
					committed.Store(id, true)
				}
			}
		})
	}
	pw.Wait()
	waitFor(t, "every committed message delivered", func() bool { return pending(t, pool) == 0 })

	mu.Lock()
	defer mu.Unlock()
	n := 0
	committed.Range(func(id, _ any) bool {
		n++
		if !first[id.(int64)] {
			t.Errorf("committed message %d never delivered", id)
		}
		return true
	})
	rolledBack.Range(func(id, _ any) bool {
		if first[id.(int64)] {
			t.Errorf("rolled-back message %d delivered", id)
		}
		return true
	})
	for k, ids := range order {
		if !slices.IsSorted(ids) {
			t.Errorf("key %s first delivered in order %v, not in commit (id) order", k, ids)
		}
	}
	if n == 0 || len(first) != n {
		t.Fatalf("%d committed, %d delivered", n, len(first))
	}
}

// A message whose transaction commits after later messages were delivered is still
// delivered: claiming works on state, not on an id horizon.
func TestLateCommitIsNotSkipped(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pgtest.Pool(t)
	late, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer late.Rollback(ctx)
	early, err := outbox.Enqueue(ctx, late, msg("k1", "late"))
	if err != nil {
		t.Fatal(err)
	}
	after := enqueue(t, pool, msg("k2", "on time"))[0]
	if after.ID <= early.ID {
		t.Fatalf("ids %d, %d: want the late transaction's id lower", early.ID, after.ID)
	}
	rec := &recorder{}
	r := newRelay(t, pool, rec, outbox.Config{})
	runBatch(t, r)
	if err := late.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	runBatch(t, r)
	if got := strings.Join(rec.payloads(), ","); got != "on time,late" {
		t.Fatalf("delivered %q", got)
	}
}

// A failure is retried after an exponential backoff with jitter, by the database clock;
// after MaxAttempts failures the message is dead, and Retry brings it back.
func TestRetryBackoffDeadAndRetry(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pgtest.Pool(t)
	m := enqueue(t, pool, msg("k", "poison"))[0]
	clock := pgtest.NewClock(t, pool)
	now := dbNow(t, pool)
	clock.Freeze(now)
	rec := &recorder{fail: map[string]bool{"poison": true}}
	r := newRelay(t, pool, rec, outbox.Config{MaxAttempts: 3, Backoff: 10 * time.Second, MaxBackoff: time.Hour})

	for attempt, backoff := range []time.Duration{10 * time.Second, 20 * time.Second} {
		if n := runBatch(t, r); n != 1 {
			t.Fatalf("attempt %d: claimed %d", attempt+1, n)
		}
		got := get(t, pool, m.ID)
		wait := got.AvailableAt.Sub(now)
		if got.State != outbox.Pending || got.Attempts != attempt+1 || got.LastError != "boom" ||
			wait < backoff*8/10 || wait > backoff*12/10 {
			t.Fatalf("after failure %d: %+v, due in %v; want pending, due in %v ±20%%", attempt+1, got, wait, backoff)
		}
		if n := runBatch(t, r); n != 0 {
			t.Fatalf("claimed %d during the backoff", n)
		}
		now = now.Add(wait)
		clock.Freeze(now)
	}
	runBatch(t, r)
	dead := get(t, pool, m.ID)
	if dead.State != outbox.Dead || dead.Attempts != 3 || dead.DeadAt.IsZero() {
		t.Fatalf("after 3 failures: %+v; want dead", dead)
	}
	if s := r.Stats(); s.Failed != 3 || s.Dead != 1 || s.Delivered != 0 {
		t.Fatalf("stats %+v", s)
	}
	clock.Advance(24 * time.Hour)
	if n := runBatch(t, r); n != 0 {
		t.Fatalf("claimed a dead message")
	}
	if err := outbox.Retry(ctx, pool, m.ID); err != nil {
		t.Fatal(err)
	}
	delete(rec.fail, "poison")
	if n := runBatch(t, r); n != 1 {
		t.Fatalf("claimed %d after Retry", n)
	}
	if got := get(t, pool, m.ID); got.State != outbox.Delivered || got.Attempts != 0 {
		t.Fatalf("after Retry: %+v", got)
	}
	if err := outbox.Retry(ctx, pool, m.ID); err == nil {
		t.Fatal("Retry of a delivered message succeeded")
	}
}

// A failing message parks its own key only: the key's later messages wait, other keys
// flow, and the key resumes in order once the message is delivered or dead.
func TestPoisonMessageParksOnlyItsKey(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	// Keys a, b and c, named so that a claim walks them in this order.
	k := walkOrder(t, pool, "t", 3)
	a, b, c := k[0], k[1], k[2]
	enqueue(t, pool, msg(a, "a1"), msg(a, "a2"), msg(b, "b1"), msg(a, "a3"), msg(b, "b2"))
	clock := pgtest.NewClock(t, pool)
	clock.Freeze(dbNow(t, pool))
	rec := &recorder{fail: map[string]bool{"a1": true}}
	r := newRelay(t, pool, rec, outbox.Config{MaxAttempts: 2, Backoff: time.Minute, MaxBackoff: time.Minute})
	runBatch(t, r)
	if got := strings.Join(rec.payloads(), ","); got != "a1,b1,b2" {
		t.Fatalf("first batch delivered %q; want a1 (failing), then key b only", got)
	}
	if s := r.Stats(); s.Released != 2 || s.Delivered != 2 || s.Failed != 1 {
		t.Fatalf("stats %+v: want a2, a3 released untried", s)
	}
	enqueue(t, pool, msg(b, "b3"), msg(c, "c1")) // the clock stands: a1's backoff (1m) has not passed
	runBatch(t, r)
	if got := strings.Join(rec.payloads(), ","); got != "a1,b1,b2,b3,c1" {
		t.Fatalf("while a1 waits, delivered %q; want b3 and c1 only", got)
	}
	clock.Advance(2 * time.Minute)
	runBatch(t, r) // a1 fails again: dead, and the key moves on
	runBatch(t, r)
	if got := strings.Join(rec.payloads(), ","); got != "a1,b1,b2,b3,c1,a1,a2,a3" {
		t.Fatalf("delivered %q; want a1 twice, then a2, a3", got)
	}
}

// A relay paused past its claim cannot record outcomes for messages another relay has
// claimed since. (The two relays are of different topic sets, so of different partition
// groups, and both walk the key: the takeover rests on the claim's expiry alone. Relays of
// one group hand a key over only with its partition, see relay_scale_test.go.)
func TestTakenOverClaimIsFenced(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pgtest.Pool(t)
	m := enqueue(t, pool, msg("k", "x"))[0]
	clock := pgtest.NewClock(t, pool)
	clock.Freeze(dbNow(t, pool))
	entered, release := make(chan struct{}), make(chan struct{})
	slow := newRelay(t, pool, outbox.HandlerFunc(func(context.Context, outbox.Message) error {
		close(entered)
		<-release // paused, past its claim by the database clock
		return nil
	}), outbox.Config{ClaimTTL: time.Hour, Claimant: "slow", Topics: []string{"t"}})
	openOnCleanup(t, release)
	call := pgtest.Go(func() (int, error) { return slow.RunBatch(ctx) })
	<-entered

	rec := &recorder{fail: map[string]bool{"x": true}}
	clock.Advance(time.Hour + time.Second) // the slow relay's claim has expired
	fast := newRelay(t, pool, rec, outbox.Config{Claimant: "fast", Backoff: time.Minute, MaxBackoff: time.Minute})
	if n := runBatch(t, fast); n != 1 {
		t.Fatalf("the expired claim was not taken over: claimed %d", n)
	}
	close(release)
	if _, err := call.Wait(t); err != nil {
		t.Fatal(err)
	}
	got := get(t, pool, m.ID)
	if got.State != outbox.Pending || got.Attempts != 1 || got.ClaimedBy != "fast" {
		t.Fatalf("message %+v: want the new claimant's failure recorded, not the stale relay's delivery", got)
	}
	if s := slow.Stats(); s.Fenced != 1 || s.Delivered != 0 {
		t.Fatalf("stale relay stats %+v: want its outcome refused", s)
	}
}

// When another relay takes over part of an expired claim, the stale relay's counts still
// add up: each message it claimed is counted once, as what the database recorded for it
// (delivered) or as refused (fenced), never both.
func TestPartlyTakenOverClaimCountsEachMessageOnce(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pgtest.Pool(t)
	enqueue(t, pool, msg("a", "a1"), msg("b", "b1"))
	clock := pgtest.NewClock(t, pool)
	clock.Freeze(dbNow(t, pool))
	var once sync.Once
	entered, release := make(chan struct{}), make(chan struct{})
	slow := newRelay(t, pool, outbox.HandlerFunc(func(context.Context, outbox.Message) error {
		once.Do(func() { close(entered) })
		<-release // paused, past its claim by the database clock
		return nil
	}), outbox.Config{ClaimTTL: time.Hour, Claimant: "slow", Topics: []string{"t"}})
	openOnCleanup(t, release)
	call := pgtest.Go(func() (int, error) { return slow.RunBatch(ctx) })
	<-entered

	clock.Advance(time.Hour + time.Second) // the slow relay's claim has expired
	fast := newRelay(t, pool, &recorder{}, outbox.Config{Claimant: "fast", BatchSize: 1})
	if n := runBatch(t, fast); n != 1 {
		t.Fatalf("the fast relay claimed %d messages, want 1 of the 2 expired ones", n)
	}
	close(release)
	if n, err := call.Wait(t); err != nil || n != 2 {
		t.Fatalf("the slow relay's batch = %d, %v; want its 2 messages", n, err)
	}
	s := slow.Stats()
	if s.Claimed != 2 || s.Delivered != 1 || s.Fenced != 1 || s.Failed+s.Released != 0 {
		t.Fatalf("stale relay stats %+v: want 2 claimed = 1 delivered (the message not taken over) + 1 fenced", s)
	}
}

// A commit wakes an idle relay through NOTIFY, long before its poll interval.
func TestNotifyWakesIdleRelay(t *testing.T) {
	pgtest.NeedsSession(t, "LISTEN: the wake-up by notification; behind a pooler the relay polls (pooler_test.go)")
	t.Parallel()
	ctx := t.Context()
	pool := pgtest.Pool(t)
	delivered := make(chan string, 1)
	r := newRelay(t, pool, outbox.HandlerFunc(func(_ context.Context, m outbox.Message) error {
		delivered <- string(m.Payload)
		return nil
	}), outbox.Config{PollInterval: time.Hour})
	rctx, stop := context.WithCancel(ctx)
	done := pgtest.Go(func() (struct{}, error) { return struct{}{}, r.Run(rctx) })
	defer func() { stop(); done.Wait(t) }()

	// Wait until the relay idles: listening, and registered as waiting.
	waitFor(t, "relay waiting", func() bool {
		var n int
		_ = pool.QueryRow(ctx, `SELECT count(*) FROM pgcoord_outbox_idle WHERE claimant = $1`, r.Claimant()).Scan(&n)
		return n == 1
	})
	enqueue(t, pool, msg("k", "wake"))
	select {
	case got := <-delivered:
		if got != "wake" {
			t.Fatalf("delivered %q", got)
		}
	case <-time.After(pgtest.WaitLimit):
		t.Fatalf("not delivered within %v with a 1h poll interval: NOTIFY did not wake the relay", pgtest.WaitLimit)
	}
}

func TestRelayConfigValidation(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	h := &recorder{}
	for _, cfg := range []*outbox.Config{
		nil, {}, {Handler: h, BatchSize: -1}, {Handler: h, BatchSize: outbox.MaxBatchSize + 1},
		{Handler: h, BatchSize: 10, KeyBatchSize: 11}, {Handler: h, ClaimTTL: time.Millisecond},
		{Handler: h, MaxAttempts: -1}, {Handler: h, Backoff: time.Hour, MaxBackoff: time.Minute},
		{Handler: h, Topics: []string{""}}, {Handler: h, Concurrency: -2},
		{Handler: h, BatchBytes: -1}, {Handler: h, BatchBytes: outbox.MaxBatchBytes + 1},
		{Handler: h, PollInterval: -time.Second}, {Handler: h, PollInterval: 2 * time.Hour},
	} {
		if _, err := outbox.NewRelay(pool, cfg); err == nil {
			t.Errorf("NewRelay(%+v) accepted", cfg)
		}
	}
	if _, err := outbox.NewRelay(nil, &outbox.Config{Handler: h}); err == nil {
		t.Error("NewRelay(nil pool) accepted")
	}
}

// Topics restricts a relay; Concurrency delivers keys in parallel, each key in order.
func TestRelayTopicsAndConcurrency(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	var msgs []outbox.Message
	for i := range 40 {
		msgs = append(msgs, outbox.Message{Topic: "orders", Key: fmt.Sprint("k", i%8), Payload: []byte(fmt.Sprint(i))})
	}
	msgs = append(msgs, outbox.Message{Topic: "audit", Key: "k", Payload: []byte("audit")})
	enqueue(t, pool, msgs...)
	rec := &recorder{}
	r := newRelay(t, pool, rec, outbox.Config{Topics: []string{"orders"}, Concurrency: 4})
	for runBatch(t, r) > 0 {
	}
	got := rec.payloads()
	if len(got) != 40 || slices.Contains(got, "audit") {
		t.Fatalf("delivered %d messages %v; want the 40 of topic orders", len(got), got)
	}
	last := map[string]int{}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	for _, m := range rec.got {
		var i int
		fmt.Sscan(string(m.Payload), &i)
		if prev, ok := last[m.Key]; ok && i < prev {
			t.Fatalf("key %s: %d delivered after %d", m.Key, i, prev)
		}
		last[m.Key] = i
	}
}
