package outbox_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/outbox"
)

// enqueueKeys writes one message to each of keys (topic "t", payload the key), in one
// statement, committed.
func enqueueKeys(t *testing.T, pool *pgxpool.Pool, keys []string) {
	t.Helper()
	msgs := make([]outbox.Message, len(keys))
	for i, k := range keys {
		msgs[i] = msg(k, k)
	}
	err := pgx.BeginFunc(t.Context(), pool, func(tx pgx.Tx) error {
		_, err := outbox.EnqueueBatch(t.Context(), tx, msgs)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

// join makes claimant a member of the relays of every topic (until an hour from now) by a
// claim of one message (if one is ready), which it releases at once.
func join(t *testing.T, pool *pgxpool.Pool, claimant string) {
	t.Helper()
	_, err := pool.Exec(t.Context(), `
		WITH c AS (SELECT * FROM pgcoord_outbox_claim($1, 1, 1, 1048576, interval '1 hour'))
		SELECT pgcoord_outbox_settle(c.claim_token, '{}', '{}', '{}', ARRAY[c.id], 5, interval '1 s', interval '1 s')
		  FROM c`, claimant)
	if err != nil {
		t.Fatal(err)
	}
}

// Two relays claiming at the same time walk different keys: a relay's claim, made while
// another relay's claim of 100 keys is in flight (locked, not committed), still gets the
// 100 messages it asked for. A walk in one key order for everyone counted the heads the
// other claim held, then skipped them as locked, and came back empty.
func TestConcurrentClaimsWalkDifferentKeys(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pgtest.Pool(t)
	var keys []string
	for i := range 1000 {
		keys = append(keys, fmt.Sprintf("k%04d", i))
	}
	enqueueKeys(t, pool, keys)
	join(t, pool, "relay-a")
	join(t, pool, "relay-b")

	// relay-a's claim, in flight.
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	var held int
	if err := tx.QueryRow(ctx, `SELECT count(*) FROM pgcoord_outbox_claim('relay-a', 100, 1, 1048576, interval '1 hour')`).Scan(&held); err != nil {
		t.Fatal(err)
	}
	if held != 100 {
		t.Fatalf("relay-a claimed %d messages, want 100", held)
	}

	rec := &recorder{}
	b := newRelay(t, pool, rec, outbox.Config{Claimant: "relay-b", BatchSize: 100, KeyBatchSize: 1, ClaimTTL: time.Hour})
	if n := runBatch(t, b); n != 100 {
		t.Fatalf("relay-b claimed %d messages beside relay-a's claim in flight, want 100 (its batch)", n)
	}
	if s := b.Stats(); s.Delivered != 100 {
		t.Fatalf("relay-b stats %+v, want 100 delivered", s)
	}
}

// A relay walks another relay's range only when its own has nothing ready and that relay
// has not claimed for a second: the range of a relay that stopped claiming (dead, but
// still a member until its claim's TTL runs out) is delivered by the others once theirs
// are dry, and a range whose relay claims is left to it.
func TestRelayTakesAnIdleRangeOnlyWhenItsOwnIsDry(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	clock := pgtest.NewClock(t, pool)
	clock.Freeze(dbNow(t, pool))
	// relay-a, first in claimant order, will own buckets 0 to 511, relay-b 512 to 1023.
	var inA, inB []string
	for i := 0; len(inA) < 10 || len(inB) < 1; i++ {
		k := fmt.Sprint("key-", i)
		var bucket int
		if err := pool.QueryRow(t.Context(), `SELECT pgcoord_outbox_bucket('t', $1)`, k).Scan(&bucket); err != nil {
			t.Fatal(err)
		}
		switch {
		case bucket < 512 && len(inA) < 10:
			inA = append(inA, k)
		case bucket >= 512 && len(inB) < 1:
			inB = append(inB, k)
		}
	}
	enqueueKeys(t, pool, append(inA, inB...))
	join(t, pool, "relay-a") // takes a message (and lets it go), then claims no more
	join(t, pool, "relay-b")

	rec := &recorder{}
	b := newRelay(t, pool, rec, outbox.Config{Claimant: "relay-b", ClaimTTL: time.Hour})
	if n := runBatch(t, b); n != 1 {
		t.Fatalf("relay-b's first claim took %d messages, want the 1 of its own range", n)
	}
	if got := rec.payloads(); len(got) != 1 || got[0] != inB[0] {
		t.Fatalf("relay-b delivered %v first, want %s (its own range)", got, inB[0])
	}
	if n := runBatch(t, b); n != 0 {
		t.Fatalf("relay-b's second claim took %d messages of relay-a's range, which relay-a took messages from less than a second ago", n)
	}
	clock.Advance(2 * time.Second) // relay-a took nothing since
	if n := runBatch(t, b); n != len(inA) {
		t.Fatalf("relay-b's third claim took %d messages, want relay-a's %d", n, len(inA))
	}
	if p := pending(t, pool); p != 0 {
		t.Fatalf("%d messages pending", p)
	}
}

// A relay that stops gives up its range at once: Run leaves the relays' membership.
func TestRunLeavesTheRelaysOnExit(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pgtest.Pool(t)
	enqueue(t, pool, msg("a", "1"))
	r := newRelay(t, pool, &recorder{}, outbox.Config{Claimant: "leaving", PollInterval: 10 * time.Millisecond})
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx) }()
	members := func() int {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM pgcoord_outbox_relays WHERE claimant = 'leaving'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	waitFor(t, "the relay delivered and is a member", func() bool { return r.Stats().Delivered == 1 && members() == 1 })
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n := members(); n != 0 {
		t.Fatalf("after Run returned, the relay is still a member (%d rows)", n)
	}
}
