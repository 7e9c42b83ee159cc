package outbox_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/outbox"
	"github.com/pgcoord/pgcoord/partition"
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

// sqlBeat heartbeats member in the relays' group "outbox" through the SQL API (as a relay
// written in another language would), with a lease of ttl, releasing release; it returns
// the partitions the member holds and those it is asked to release.
func sqlBeat(t *testing.T, pool *pgxpool.Pool, member string, ttl time.Duration, release []int32) (owned, revoke []int32) {
	t.Helper()
	if release == nil {
		release = []int32{}
	}
	if err := pool.QueryRow(t.Context(), `SELECT owned, revoke FROM pgcoord_partition_heartbeat('outbox', $1, 1, $2, $3, true)`,
		member, ttl, release).Scan(&owned, &revoke); err != nil {
		t.Fatal(err)
	}
	return owned, revoke
}

// holding returns how many partitions of the group "outbox" member holds.
func holding(t *testing.T, pool *pgxpool.Pool, member string) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(t.Context(), `SELECT count(*) FROM pgcoord_partitions WHERE group_name = 'outbox' AND holder = $1`, member).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// share makes "relay-a", a member through the SQL API with a lease of ttl, and the relay b
// split the group "outbox" of 64 partitions: relay-a joins first and is granted all of
// them; b joins at its first batch, and claims nothing while relay-a holds every
// partition; relay-a then releases the 32 the plan moves to b, and share waits until b
// holds them. It returns relay-a's partitions.
func share(t *testing.T, pool *pgxpool.Pool, b *outbox.Relay, ttl time.Duration) []int32 {
	t.Helper()
	if _, err := pool.Exec(t.Context(), `SELECT pgcoord_partition_create('outbox', $1)`, outbox.RelayPartitions); err != nil {
		t.Fatal(err)
	}
	if owned, _ := sqlBeat(t, pool, "relay-a", ttl, nil); len(owned) != 64 {
		t.Fatalf("relay-a, alone, holds %d partitions, want 64", len(owned))
	}
	if n := runBatch(t, b); n != 0 {
		t.Fatalf("relay-b claimed %d messages while relay-a held every partition, want 0", n)
	}
	_, revoke := sqlBeat(t, pool, "relay-a", ttl, nil)
	if len(revoke) != 32 {
		t.Fatalf("relay-a is asked to release %v, want 32 partitions", revoke)
	}
	owned, _ := sqlBeat(t, pool, "relay-a", ttl, revoke)
	// b learns of the grants from a notification, or, behind a pooler, by heartbeating
	// instead of claiming while it holds no partition.
	waitFor(t, "relay-b holds 32 partitions", func() bool {
		if holding(t, pool, b.Claimant()) == 32 {
			return true
		}
		if pgtest.BehindPooler() {
			if n := runBatch(t, b); n != 0 {
				t.Fatalf("relay-b claimed %d messages before it held a partition", n)
			}
		}
		return false
	})
	return owned
}

// inPartitions reports whether key's bucket (topic "t") lies in one of partitions of 64.
func inPartitions(t *testing.T, pool *pgxpool.Pool, key string, partitions []int32) bool {
	t.Helper()
	var in bool
	if err := pool.QueryRow(t.Context(), `SELECT pgcoord_outbox_bucket('t', $1) * 64 / 1024 = ANY ($2)`, key, partitions).Scan(&in); err != nil {
		t.Fatal(err)
	}
	return in
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
	rec := &recorder{}
	b := newRelay(t, pool, rec, outbox.Config{Claimant: "relay-b", BatchSize: 100, KeyBatchSize: 1, ClaimTTL: time.Hour})
	share(t, pool, b, time.Hour)

	// relay-a's claim, in flight.
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	var held int
	if err := tx.QueryRow(ctx, `SELECT count(*) FROM pgcoord_outbox_claim('relay-a', 100, 1, 1048576, interval '1 hour', NULL, '', '', 'outbox')`).Scan(&held); err != nil {
		t.Fatal(err)
	}
	if held != 100 {
		t.Fatalf("relay-a claimed %d messages, want 100", held)
	}
	// relay-b's first batch once its member has applied the grants (share saw them
	// committed): a batch before that claims nothing.
	var n int
	waitFor(t, "relay-b claims", func() bool { n = runBatch(t, b); return n > 0 })
	if n != 100 {
		t.Fatalf("relay-b claimed %d messages beside relay-a's claim in flight, want 100 (its batch)", n)
	}
	if s := b.Stats(); s.Delivered != 100 {
		t.Fatalf("relay-b stats %+v, want 100 delivered", s)
	}
}

// A relay claims only the keys of its partitions: while another relay holds the other
// partitions (and has stopped claiming, but its lease lasts), their keys wait; once its
// lease expires, the group grants them to the live relay, which delivers the rest. Each
// message is delivered once.
func TestRelayClaimsOnlyItsPartitionsUntilTheirHolderExpires(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pgtest.Pool(t)
	clock := pgtest.NewClock(t, pool)
	clock.Freeze(dbNow(t, pool))
	var keys []string
	for i := range 300 {
		keys = append(keys, fmt.Sprintf("k%04d", i))
	}
	enqueueKeys(t, pool, keys)
	rec := &recorder{}
	// relay-b's lease, its ClaimTTL, outlives the frozen clock's advance below, and behind
	// a pooler (no notification) it heartbeats every third of it.
	b := newRelay(t, pool, rec, outbox.Config{Claimant: "relay-b", BatchSize: 50, ClaimTTL: 15 * time.Second})
	aParts := share(t, pool, b, 10*time.Second)

	var inA int
	for _, k := range keys {
		if inPartitions(t, pool, k, aParts) {
			inA++
		}
	}
	waitFor(t, "relay-b delivers its partitions' messages", func() bool {
		runBatch(t, b)
		return len(rec.payloads()) >= len(keys)-inA
	})
	for runBatch(t, b) > 0 {
	}
	got := rec.payloads()
	if len(got) != len(keys)-inA {
		t.Fatalf("relay-b delivered %d messages while relay-a held its 32 partitions, want the %d of its own", len(got), len(keys)-inA)
	}
	for _, k := range got {
		if inPartitions(t, pool, k, aParts) {
			t.Fatalf("relay-b delivered %s, of relay-a's partitions", k)
		}
	}
	if p := pending(t, pool); p != int64(inA) {
		t.Fatalf("%d messages pending, want relay-a's %d", p, inA)
	}

	// relay-a's lease runs out; a rebalance (as any change of the group would) makes the
	// plan forget it, and relay-b is granted its partitions.
	clock.Advance(11 * time.Second)
	if _, err := partition.Rebalance(ctx, pool, "outbox", "test"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "relay-b holds every partition", func() bool { return holding(t, pool, "relay-b") == 64 })
	// (The grants are committed before relay-b's member has applied the heartbeat's answer.)
	waitFor(t, "relay-b delivers relay-a's messages", func() bool {
		runBatch(t, b)
		return pending(t, pool) == 0
	})
	if got := rec.payloads(); len(got) != len(keys) {
		t.Fatalf("relay-b delivered %d messages, want each of %d once", len(got), len(keys))
	}
}

// A relay that stops gives up its partitions at once: Run leaves the group.
func TestRunLeavesTheGroupOnExit(t *testing.T) {
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
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM pgcoord_partition_members WHERE group_name = 'outbox' AND member = 'leaving'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	waitFor(t, "the relay delivered and is a member", func() bool { return r.Stats().Delivered == 1 && members() == 1 })
	if n := holding(t, pool, "leaving"); n != 64 {
		t.Fatalf("the relay, alone, holds %d partitions, want 64", n)
	}
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n, h := members(), holding(t, pool, "leaving"); n != 0 || h != 0 {
		t.Fatalf("after Run returned, the relay is still a member (%d rows) holding %d partitions", n, h)
	}
}

// The relays' group is named after their topic set, and two topic sets never share one,
// even when a topic holds a comma or the names are long.
func TestGroupName(t *testing.T) {
	long := strings.Repeat("t", 150)
	for _, c := range []struct {
		topics []string
		want   string
	}{
		{nil, "outbox"},
		{[]string{"orders"}, "outbox:orders"},
		{[]string{"b", "a", "b"}, "outbox:a,b"},
	} {
		if got := outbox.GroupName(c.topics); got != c.want {
			t.Errorf("GroupName(%q) = %q, want %q", c.topics, got, c.want)
		}
	}
	names := map[string][]string{}
	for _, ts := range [][]string{{"a", "b"}, {"a,b"}, {"a", "b,c"}, {"a,b", "c"}, {long, long + "x"}, {long, long + "y"}} {
		n := outbox.GroupName(ts)
		if other, ok := names[n]; ok {
			t.Errorf("GroupName(%q) = GroupName(%q) = %q", ts, other, n)
		}
		names[n] = ts
		if len(n) > partition.MaxGroupLen {
			t.Errorf("GroupName(%q) = %q: longer than %d bytes", ts, n, partition.MaxGroupLen)
		}
	}
}

// A relay driven by RunBatch alone leaves its group once it has made no batch for its
// lease (ClaimTTL, here a second): an abandoned Relay does not hold its partitions.
func TestIdleRunBatchRelayLeavesItsGroup(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	enqueue(t, pool, msg("a", "1"))
	r := newRelay(t, pool, &recorder{}, outbox.Config{Claimant: "cron", ClaimTTL: time.Second})
	if n := runBatch(t, r); n != 1 {
		t.Fatalf("claimed %d, want 1", n)
	}
	if h := holding(t, pool, "cron"); h != 64 {
		t.Fatalf("the relay holds %d partitions after its batch, want 64", h)
	}
	waitFor(t, "the idle relay left its group", func() bool {
		var n int
		if err := pool.QueryRow(t.Context(), `SELECT count(*) FROM pgcoord_partition_members WHERE member = 'cron'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 0 && holding(t, pool, "cron") == 0
	})
	// It joins again at its next batch. (The database shows the leave committed a moment
	// before the relay has finished it; a batch made meanwhile claims nothing, by design,
	// and CI saw one: the batch is made again until the relay claims.)
	enqueue(t, pool, msg("a", "2"))
	waitFor(t, "the relay joined again and claimed the new message", func() bool { return runBatch(t, r) == 1 })
}

// A revoked partition moves only after the batch under way is settled: while relay-a's
// Handler holds a batch, relay-b (joining through the SQL API) is granted nothing of the
// partitions the plan moves to it, through two heartbeats of relay-a after the revoke
// (at the first, relay-a learns of it; a relay that did not wait for its batch released
// them at the second); once the batch is settled, they are granted.
func TestRevokedPartitionsMoveAfterTheBatchUnderWay(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pgtest.Pool(t)
	var keys []string
	for i := range 200 {
		keys = append(keys, fmt.Sprintf("k%04d", i))
	}
	enqueueKeys(t, pool, keys)
	entered, release := make(chan struct{}), make(chan struct{})
	a := newRelay(t, pool, outbox.HandlerFunc(func(ctx context.Context, m outbox.Message) error {
		select {
		case entered <- struct{}{}:
			<-release
		default:
		}
		return nil
	}), outbox.Config{Claimant: "relay-a", ClaimTTL: time.Minute})
	openOnCleanup(t, release)
	done := make(chan int, 1)
	go func() { n, _ := a.RunBatch(ctx); done <- n }()
	<-entered // relay-a holds every partition, and a batch under way
	beats := func() (at time.Time) {
		if err := pool.QueryRow(ctx, `SELECT expires_at FROM pgcoord_partition_members WHERE member = 'relay-a'`).Scan(&at); err != nil {
			t.Fatal(err)
		}
		return at
	}
	before := beats()
	if _, revoke := sqlBeat(t, pool, "relay-b", time.Minute, nil); len(revoke) != 0 {
		t.Fatalf("relay-b was asked to release %v", revoke)
	}
	seen := before
	for n := 0; n < 2; {
		waitFor(t, "relay-a heartbeats", func() bool { return beats().After(seen) })
		seen = beats()
		n++
		if owned, _ := sqlBeat(t, pool, "relay-b", time.Minute, nil); len(owned) != 0 {
			t.Fatalf("relay-b was granted %v while relay-a's batch was under way", owned)
		}
	}
	close(release)
	if n := <-done; n == 0 {
		t.Fatal("relay-a's batch claimed nothing")
	}
	waitFor(t, "relay-b is granted its 32 partitions", func() bool {
		owned, _ := sqlBeat(t, pool, "relay-b", time.Minute, nil)
		return len(owned) == 32
	})
}
