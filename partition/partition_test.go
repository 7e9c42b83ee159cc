package partition_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/fenced"
	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/partition"
	"github.com/pgcoord/pgcoord/pgcoord"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

const ttl = 3 * time.Second

// events records what a member's callbacks saw.
type events struct {
	mu       sync.Mutex
	assigned map[int][]int64 // partition → tokens, in order
	revoked  map[int]int
}

func newEvents() *events { return &events{assigned: map[int][]int64{}, revoked: map[int]int{}} }

func (e *events) opts(o partition.Options) *partition.Options {
	o.OnAssign = func(p partition.Partition) {
		e.mu.Lock()
		defer e.mu.Unlock()
		e.assigned[p.ID] = append(e.assigned[p.ID], p.Token)
	}
	if o.OnRevoke == nil {
		o.OnRevoke = func(context.Context, partition.Partition) {}
	}
	revoke := o.OnRevoke
	o.OnRevoke = func(ctx context.Context, p partition.Partition) {
		revoke(ctx, p)
		e.mu.Lock()
		defer e.mu.Unlock()
		e.revoked[p.ID]++
	}
	if o.TTL == 0 {
		o.TTL = ttl
	}
	return &o
}

// join joins group as member name, leaving when the test ends.
func join(t *testing.T, pool *pgxpool.Pool, group, name string, o partition.Options) (*partition.Member, *events) {
	t.Helper()
	e := newEvents()
	o.Member = name
	m, err := partition.Join(t.Context(), pool, group, e.opts(o))
	if err != nil {
		t.Fatalf("Join %s: %v", name, err)
	}
	t.Cleanup(func() { _ = m.Leave(context.Background()) })
	return m, e
}

// holders returns each partition's live holder ("" when free), by the database clock.
func holders(t *testing.T, pool *pgxpool.Pool, group string) map[int]string {
	t.Helper()
	rows, err := pool.Query(context.Background(), `
		SELECT partition, CASE WHEN expires_at > pgcoord_now() THEN holder ELSE '' END
		  FROM pgcoord_partitions WHERE group_name = $1`, group)
	if err != nil {
		t.Fatal(err)
	}
	out := map[int]string{}
	for rows.Next() {
		var p int
		var h *string
		if err := rows.Scan(&p, &h); err != nil {
			t.Fatal(err)
		}
		if h != nil {
			out[p] = *h
		} else {
			out[p] = ""
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// settled waits until every partition of group is held by the member the plan gives it to.
func settled(t *testing.T, pool *pgxpool.Pool, group string) map[int]string {
	t.Helper()
	pgtest.Until(t, "every partition of "+group+" held by its planned member", func() bool {
		var off int
		err := pool.QueryRow(context.Background(), `
			SELECT count(*) FROM pgcoord_partitions p JOIN pgcoord_partition_groups g ON g.name = p.group_name
			 WHERE p.group_name = $1 AND (p.target IS NULL OR p.holder IS DISTINCT FROM p.target
			       OR p.expires_at <= pgcoord_now() OR p.epoch <> g.epoch OR p.partition >= g.partitions)`, group).Scan(&off)
		return err == nil && off == 0
	})
	return holders(t, pool, group)
}

func counts(h map[int]string) map[string]int {
	c := map[string]int{}
	for _, m := range h {
		c[m]++
	}
	return c
}

// TestJoinAndLeaveMoveOnlyWhatMust: four members share 64 partitions 16 each; a fifth
// joining moves at most ceil(64/5) = 13 of them, to itself, and leaves every member within
// one of 64/5; its leaving moves only its own.
func TestJoinAndLeaveMoveOnlyWhatMust(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	for i := range 4 {
		join(t, pool, "g", fmt.Sprintf("m%d", i), partition.Options{Partitions: 64})
	}
	before := settled(t, pool, "g")
	for m, n := range counts(before) {
		if n != 16 {
			t.Fatalf("%s holds %d partitions of 64 among 4, want 16: %v", m, n, counts(before))
		}
	}
	fifth, _ := join(t, pool, "g", "m4", partition.Options{})
	after := settled(t, pool, "g")
	moved := 0
	for p, h := range after {
		if h != before[p] {
			moved++
			if h != "m4" {
				t.Errorf("partition %d moved from %s to %s, not to the member that joined", p, before[p], h)
			}
		}
	}
	if moved > 13 {
		t.Errorf("a join moved %d partitions, want at most 13", moved)
	}
	for m, n := range counts(after) {
		if n < 12 || n > 13 {
			t.Errorf("%s holds %d partitions of 64 among 5, want 12 or 13: %v", m, n, counts(after))
		}
	}
	// The partitions were granted by the members that released them; the fifth learns of
	// them from a notification, or behind a pooler from its next heartbeat: Sync is one.
	if err := fifth.Sync(t.Context()); err != nil {
		t.Fatal(err)
	}
	held := fifth.Owned()
	if len(held) != counts(after)["m4"] {
		t.Fatalf("after Sync the fifth member owns %d partitions, the database grants it %d", len(held), counts(after)["m4"])
	}
	if err := fifth.Leave(t.Context()); err != nil {
		t.Fatal(err)
	}
	if len(held) == 0 || held[0].Context.Err() == nil {
		t.Fatalf("the fifth member held %v; its contexts must be done after Leave", held)
	}
	err := pgx.BeginFunc(t.Context(), pool, func(tx pgx.Tx) error { return fifth.Check(t.Context(), tx, held[0]) })
	if !errors.Is(err, partition.ErrLeft) {
		t.Errorf("Check after Leave: %v, want ErrLeft", err)
	}
	final := settled(t, pool, "g")
	for p, h := range final {
		if after[p] != "m4" && h != after[p] {
			t.Errorf("partition %d of %s moved to %s when m4 left", p, after[p], h)
		}
	}
	for m, n := range counts(final) {
		if n != 16 {
			t.Errorf("after the leave %s holds %d, want 16: %v", m, n, counts(final))
		}
	}
}

// TestWeights: members of weights 1, 2 and 5 share 64 partitions within one of 8, 16 and 40.
func TestWeights(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	for i, w := range []int{1, 2, 5} {
		join(t, pool, "w", fmt.Sprintf("m%d", i), partition.Options{Partitions: 64, Weight: w})
	}
	c := counts(settled(t, pool, "w"))
	for m, share := range map[string]float64{"m0": 8, "m1": 16, "m2": 40} {
		if d := float64(c[m]) - share; d <= -1 || d >= 1 {
			t.Errorf("%s holds %d, want within one of %v: %v", m, c[m], share, c)
		}
	}
}

// TestRevokeBeforeGrant: a partition moves to a joining member only after its owner's
// OnRevoke returned; the new grant's token is higher, and from then on the old token is
// refused by Member.Check and by the fence register of the partition's resource.
func TestRevokeBeforeGrant(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	gate := make(chan struct{})
	var once sync.Once
	revoking := make(chan struct{})
	a, ea := join(t, pool, "r", "a", partition.Options{Partitions: 8, RevokeGrace: ttl,
		OnRevoke: func(ctx context.Context, p partition.Partition) {
			once.Do(func() { close(revoking) })
			select {
			case <-gate:
			case <-ctx.Done():
			}
		}})
	old := a.Owned()
	if len(old) != 8 {
		t.Fatalf("the only member holds %d of 8 partitions", len(old))
	}
	b, eb := join(t, pool, "r", "b", partition.Options{})
	<-revoking
	// b heartbeats (every TTL/3) while a's OnRevoke waits: it gets none of a's partitions.
	var renewed time.Time
	pgtest.Until(t, "a heartbeat of b after a's revoke began", func() bool {
		var at time.Time
		_ = pool.QueryRow(context.Background(), `SELECT expires_at FROM pgcoord_partition_members WHERE group_name = 'r' AND member = 'b'`).Scan(&at)
		if renewed.IsZero() {
			renewed = at
		}
		return at.After(renewed)
	})
	if got := b.Owned(); len(got) != 0 {
		t.Fatalf("b was granted %v while a's OnRevoke had not returned", got)
	}
	for p, h := range holders(t, pool, "r") {
		if h != "a" {
			t.Fatalf("partition %d is held by %q while a's OnRevoke waits", p, h)
		}
	}
	close(gate)
	if c := counts(settled(t, pool, "r")); c["b"] != 4 {
		t.Fatalf("b holds %d partitions after the move, want 4", c["b"])
	}
	// a's release granted them to b; b learns of them from its read.
	pgtest.Until(t, "b to take its 4 partitions", func() bool { return len(b.Owned()) == 4 })
	for _, np := range b.Owned() {
		var op partition.Partition
		for _, p := range old {
			if p.ID == np.ID {
				op = p
			}
		}
		if np.Token <= op.Token {
			t.Errorf("partition %d: b's token %d is not above a's %d", np.ID, np.Token, op.Token)
		}
		if op.Context.Err() == nil {
			t.Errorf("partition %d: a's context was not cancelled at the revoke", np.ID)
		}
		err := pgx.BeginFunc(t.Context(), pool, func(tx pgx.Tx) error { return a.Check(t.Context(), tx, op) })
		if !errors.Is(err, partition.ErrRevoked) {
			t.Errorf("a.Check of moved partition %d: %v, want ErrRevoked", np.ID, err)
		}
		err = pgx.BeginFunc(t.Context(), pool, func(tx pgx.Tx) error { return fenced.Check(t.Context(), tx, op.Resource(), op.Token) })
		if !errors.Is(err, fenced.ErrStale) {
			t.Errorf("fenced.Check of a's token for moved partition %d: %v, want ErrStale (before b wrote)", np.ID, err)
		}
		err = pgx.BeginFunc(t.Context(), pool, func(tx pgx.Tx) error {
			if err := b.Check(t.Context(), tx, np); err != nil {
				return err
			}
			return fenced.Check(t.Context(), tx, np.Resource(), np.Token)
		})
		if err != nil {
			t.Errorf("b's checks of partition %d: %v", np.ID, err)
		}
	}
	ea.mu.Lock()
	defer ea.mu.Unlock()
	eb.mu.Lock()
	defer eb.mu.Unlock()
	for _, np := range b.Owned() {
		if ea.revoked[np.ID] != 1 || len(eb.assigned[np.ID]) != 1 {
			t.Errorf("partition %d: revoked %d times from a, assigned %d times to b; want once each", np.ID, ea.revoked[np.ID], len(eb.assigned[np.ID]))
		}
	}
}

// TestResizeRegrantsUnderTheNewCount: resizing 16 to 32 partitions while two members run
// revokes every grant and grants all 32 anew, with higher tokens; no grant of the new
// epoch lives while one of the old does.
func TestResizeRegrantsUnderTheNewCount(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	a, _ := join(t, pool, "z", "a", partition.Options{Partitions: 16})
	join(t, pool, "z", "b", partition.Options{})
	settled(t, pool, "z")
	var maxOld int64
	if err := pool.QueryRow(t.Context(), `SELECT max(fence_token) FROM pgcoord_partitions WHERE group_name = 'z'`).Scan(&maxOld); err != nil {
		t.Fatal(err)
	}
	if _, err := partition.Resize(t.Context(), pool, "z", 32, "test"); err != nil {
		t.Fatal(err)
	}
	pgtest.Until(t, "all 32 partitions granted under the new count", func() bool {
		var mixed, live int
		err := pool.QueryRow(context.Background(), `
			SELECT count(DISTINCT epoch) FILTER (WHERE expires_at > pgcoord_now()),
			       count(*) FILTER (WHERE expires_at > pgcoord_now() AND epoch = 2 AND partition < 32)
			  FROM pgcoord_partitions WHERE group_name = 'z'`).Scan(&mixed, &live)
		if err != nil {
			t.Fatal(err)
		}
		if mixed > 1 {
			t.Fatalf("grants of two epochs live at once")
		}
		return live == 32
	})
	var minNew int64
	if err := pool.QueryRow(t.Context(), `SELECT min(fence_token) FROM pgcoord_partitions WHERE group_name = 'z'`).Scan(&minNew); err != nil {
		t.Fatal(err)
	}
	if minNew <= maxOld {
		t.Errorf("a grant after the resize has token %d, not above the highest before it (%d)", minNew, maxOld)
	}
	pgtest.Until(t, "a member sees the new count", func() bool { return a.Partitions() == 32 })
}

// TestDrainMovesEverythingAway: a drained member keeps nothing; the drain is audited.
func TestDrainMovesEverythingAway(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	a, _ := join(t, pool, "d", "a", partition.Options{Partitions: 8})
	join(t, pool, "d", "b", partition.Options{})
	settled(t, pool, "d")
	ok, err := partition.Drain(t.Context(), pool, "d", "a", "ops")
	if err != nil || !ok {
		t.Fatalf("Drain: %v, %v", ok, err)
	}
	for p, h := range settled(t, pool, "d") {
		if h != "b" {
			t.Errorf("partition %d held by %s after a's drain", p, h)
		}
	}
	pgtest.Until(t, "a owns nothing", func() bool { return len(a.Owned()) == 0 })
	var n int
	if err := pool.QueryRow(t.Context(), `SELECT count(*) FROM pgcoord_audit WHERE action = 'partitions.drain' AND target = 'd' AND actor = 'ops'`).Scan(&n); err != nil || n != 1 {
		t.Errorf("audit rows of the drain: %d, %v", n, err)
	}
	if ok, err := partition.Drain(t.Context(), pool, "d", "nobody", "ops"); err != nil || ok {
		t.Errorf("Drain of an unknown member: %v, %v; want false, nil", ok, err)
	}
}

// TestBadInput: bad options and names are refused before any SQL runs; an unknown group
// and a size other than the group's are refused by the database; nothing is written.
func TestBadInput(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	ctx := t.Context()
	for name, c := range map[string]struct {
		group string
		o     partition.Options
	}{
		"no group":        {"", partition.Options{Partitions: 4}},
		"long group":      {strings.Repeat("g", 201), partition.Options{Partitions: 4}},
		"control char":    {"g\n", partition.Options{Partitions: 4}},
		"negative count":  {"g", partition.Options{Partitions: -1}},
		"too many":        {"g", partition.Options{Partitions: partition.MaxPartitions + 1}},
		"weight 1001":     {"g", partition.Options{Partitions: 4, Weight: 1001}},
		"negative weight": {"g", partition.Options{Partitions: 4, Weight: -1}},
		"short ttl":       {"g", partition.Options{Partitions: 4, TTL: time.Millisecond}},
		"long member":     {"g", partition.Options{Partitions: 4, Member: strings.Repeat("m", 256)}},
		"grace over ttl":  {"g", partition.Options{Partitions: 4, TTL: time.Second, RevokeGrace: 2 * time.Second}},
	} {
		_, err := partition.Join(ctx, pool, c.group, &c.o)
		if !errors.Is(err, pgcoord.ErrInvalidArgument) && !errors.Is(err, pgcoord.ErrInvalidName) {
			t.Errorf("%s: %v, want an invalid-input error", name, err)
		}
	}
	if _, err := partition.Join(ctx, pool, "nope", nil); !errors.Is(err, partition.ErrUnknownGroup) {
		t.Errorf("Join of an unknown group: %v, want ErrUnknownGroup", err)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM pgcoord_partition_groups) + (SELECT count(*) FROM pgcoord_partition_members)`).Scan(&n); err != nil || n != 0 {
		t.Errorf("refused joins wrote %d rows (%v)", n, err)
	}
	join(t, pool, "four", "a", partition.Options{Partitions: 4})
	if _, err := partition.Join(ctx, pool, "four", &partition.Options{Partitions: 8}); !errors.Is(err, pgcoord.ErrInvalidArgument) ||
		!strings.Contains(err.Error(), "resize") {
		t.Errorf("Join with another size: %v, want an invalid-argument error naming resize", err)
	}
	if _, err := partition.Resize(ctx, pool, "four", 0, "ops"); !errors.Is(err, pgcoord.ErrInvalidArgument) {
		t.Errorf("Resize to 0: %v", err)
	}
	if _, err := partition.Resize(ctx, pool, "nope", 4, "ops"); !errors.Is(err, partition.ErrUnknownGroup) {
		t.Errorf("Resize of an unknown group: %v", err)
	}
}

// TestKeyPartitionMatchesSQL: KeyPartition and pgcoord_key_partition agree, and growing the
// count moves a key only to a new partition.
func TestKeyPartitionMatchesSQL(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	keys := []string{"", "a", "é", "order:42", strings.Repeat("k", 1000)}
	for i := range 2000 {
		keys = append(keys, fmt.Sprintf("key-%d", i))
	}
	for _, n := range []int{1, 2, 7, 64, 1000, partition.MaxPartitions} {
		var got []int32
		if err := pool.QueryRow(t.Context(), `SELECT array_agg(pgcoord_key_partition(k, $2) ORDER BY i)
			FROM unnest($1::text[]) WITH ORDINALITY u(k, i)`, keys, n).Scan(&got); err != nil {
			t.Fatal(err)
		}
		for i, k := range keys {
			if want := partition.KeyPartition(k, n); int(got[i]) != want {
				t.Fatalf("key %q among %d: SQL %d, Go %d", k, n, got[i], want)
			}
		}
	}
	for _, k := range keys {
		if p, q := partition.KeyPartition(k, 64), partition.KeyPartition(k, 128); q != p && q < 64 {
			t.Fatalf("key %q moved from %d to %d, not to a new partition", k, p, q)
		}
	}
	if partition.KeyPartition("a", 0) != -1 {
		t.Error("KeyPartition with no partitions did not return -1")
	}
}

// Sync heartbeats at once: a member whose lease and grants expired by the database clock
// (its heartbeats are a third of an hour apart) is granted its partitions again, under new
// tokens, when Sync returns, and OnAssign has run for them. After Leave, Sync is ErrLeft.
func TestSyncHeartbeatsAtOnce(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	clock := pgtest.NewClock(t, pool)
	clock.Freeze(clock.Now())
	m, e := join(t, pool, "sync", "w1", partition.Options{Partitions: 4, TTL: time.Hour})
	before := m.Owned()
	if len(before) != 4 {
		t.Fatalf("alone, w1 holds %v, want 4 partitions", before)
	}
	clock.Advance(2 * time.Hour)
	if h := holders(t, pool, "sync"); len(counts(h)) != 1 || counts(h)[""] != 4 {
		t.Fatalf("holders %v two hours later: want every grant expired", h)
	}
	if err := m.Sync(t.Context()); err != nil {
		t.Fatal(err)
	}
	if h := holders(t, pool, "sync"); counts(h)["w1"] != 4 {
		t.Fatalf("holders %v after Sync, want w1 on all 4", h)
	}
	after := m.Owned()
	if len(after) != 4 {
		t.Fatalf("after Sync w1 owns %v, want 4 partitions", after)
	}
	e.mu.Lock()
	for i, p := range after {
		if p.Token <= before[i].Token || len(e.assigned[p.ID]) != 2 {
			t.Errorf("partition %d after Sync: token %d (was %d), assigned %v: want a new grant, assigned again",
				p.ID, p.Token, before[i].Token, e.assigned[p.ID])
		}
	}
	e.mu.Unlock()
	if err := m.Leave(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := m.Sync(t.Context()); !errors.Is(err, partition.ErrLeft) {
		t.Fatalf("Sync after Leave: %v, want ErrLeft", err)
	}
}

// beats counts a member's heartbeats, and those that ended with an error, as a Tracer.
type beats struct{ n, failed atomic.Int64 }

func (b *beats) Start(ctx context.Context, _ string, _ ...pgcoord.Attr) (context.Context, pgcoord.Span) {
	b.n.Add(1)
	return ctx, beatSpan{b}
}
func (b *beats) Extract(ctx context.Context, _ map[string]string) context.Context { return ctx }

type beatSpan struct{ b *beats }

func (beatSpan) SetAttrs(...pgcoord.Attr)         {}
func (beatSpan) AddEvent(string, ...pgcoord.Attr) {}
func (s beatSpan) End(err error) {
	if err != nil {
		s.b.failed.Add(1)
	}
}

// holdGroupRow locks group's row in a transaction it returns, rolled back when t ends:
// no heartbeat of the group completes until the transaction ends.
func holdGroupRow(t *testing.T, pool *pgxpool.Pool, group string) pgx.Tx {
	t.Helper()
	tx, err := pool.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	if _, err := tx.Exec(t.Context(), `SELECT FROM pgcoord_partition_groups WHERE name = $1 FOR UPDATE`, group); err != nil {
		t.Fatal(err)
	}
	return tx
}

// TestHeartbeatsTheDatabaseCannotAnswerLapseTheGrants: while a transaction holds the
// group's row, no heartbeat can complete. Each one ends with an error three TTLs after it
// was sent and is tried again (none waits for the lock for good); the member gives its
// grants up by its own clock (OnRevoke runs for each), and takes them again, under new
// tokens, once a heartbeat completes.
func TestHeartbeatsTheDatabaseCannotAnswerLapseTheGrants(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pgtest.Pool(t)
	if _, err := pool.Exec(ctx, `SELECT pgcoord_partition_create('blocked', 2)`); err != nil {
		t.Fatal(err)
	}
	b := &beats{}
	m, e := join(t, pool, "blocked", "only", partition.Options{TTL: time.Second, Tracer: b})
	pgtest.Until(t, "the member holds both partitions", func() bool { return len(m.Owned()) == 2 })
	before := map[int]int64{}
	for _, p := range m.Owned() {
		before[p.ID] = p.Token
	}

	tx := holdGroupRow(t, pool, "blocked")
	failedBefore := b.failed.Load()
	pgtest.Until(t, "two heartbeats failed while the group's row is held", func() bool { return b.failed.Load() >= failedBefore+2 })
	pgtest.Until(t, "the member gave its grants up", func() bool {
		e.mu.Lock()
		defer e.mu.Unlock()
		return len(m.Owned()) == 0 && e.revoked[0] >= 1 && e.revoked[1] >= 1
	})
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	pgtest.Until(t, "the member holds both partitions again", func() bool { return len(m.Owned()) == 2 })
	for _, p := range m.Owned() {
		if p.Token <= before[p.ID] {
			t.Errorf("partition %d taken again under token %d, not above its lapsed grant's %d", p.ID, p.Token, before[p.ID])
		}
	}
}

// TestSlowHeartbeatIsAnsweredWhileItsGrantsLapse: a heartbeat that waits for the group's row
// longer than the TTL is not given up at the TTL (which would close its connection, and on
// a busy server the next heartbeat, on a new connection, is slower still): it is answered
// once the row is free, without an error. Its grants lapse meanwhile, at their deadline by
// the member's clock, not when the heartbeat ends.
func TestSlowHeartbeatIsAnsweredWhileItsGrantsLapse(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pgtest.Pool(t)
	if _, err := pool.Exec(ctx, `SELECT pgcoord_partition_create('slow', 2)`); err != nil {
		t.Fatal(err)
	}
	b := &beats{}
	m, e := join(t, pool, "slow", "only", partition.Options{TTL: 2 * time.Second, Tracer: b})
	pgtest.Until(t, "the member holds both partitions", func() bool { return len(m.Owned()) == 2 })

	tx := holdGroupRow(t, pool, "slow")
	holder := pgtest.BackendPID(t, tx)
	failed := b.failed.Load()
	pgtest.Until(t, "a heartbeat waited for the group's row longer than the TTL", func() bool {
		var n int
		// Only this test's heartbeat: the one the transaction blocks (other tests' wait too).
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE $1 = ANY (pg_blocking_pids(pid)) AND query LIKE '%pgcoord_partition_heartbeat%'
			  AND clock_timestamp() - query_start > interval '2.4 seconds'`, holder).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 1
	})
	pgtest.Until(t, "the member gave its grants up while the heartbeat waits", func() bool {
		e.mu.Lock()
		defer e.mu.Unlock()
		return len(m.Owned()) == 0 && e.revoked[0] == 1 && e.revoked[1] == 1
	})
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	pgtest.Until(t, "the member holds both partitions again", func() bool { return len(m.Owned()) == 2 })
	if n := b.failed.Load() - failed; n != 0 {
		t.Errorf("%d heartbeats failed while the group's row was held for less than three TTLs, want none", n)
	}
}

// TestWaitForAConnectionLeavesTheGrantsTheirTime: a grant's deadline counts from when the
// pool handed the heartbeat a connection, not from before. A member whose pool takes
// longer than the TTL to hand one over (opening a connection on a busy server took longer
// than a one-second TTL) still takes what its heartbeat was granted: OnAssign runs for both
// partitions before Join returns, rather than the answer being judged too late.
func TestWaitForAConnectionLeavesTheGrantsTheirTime(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	plain := pgtest.Pool(t)
	if _, err := plain.Exec(ctx, `SELECT pgcoord_partition_create('handover', 2)`); err != nil {
		t.Fatal(err)
	}
	const ttl, handOver = 2 * time.Second, 3 * time.Second
	var slow atomic.Bool
	cfg := plain.Config()
	prepare := cfg.PrepareConn
	cfg.PrepareConn = func(ctx context.Context, c *pgx.Conn) (bool, error) {
		if slow.Load() {
			time.Sleep(handOver)
		}
		if prepare != nil {
			return prepare(ctx, c)
		}
		return true, nil
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	slow.Store(true)
	_, e := join(t, pool, "handover", "only", partition.Options{TTL: ttl})
	slow.Store(false)
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.assigned) != 2 {
		t.Fatalf("OnAssign ran for %v when Join returned, want both partitions", e.assigned)
	}
}

// A partition whose expired grant a transaction still holds (a Check of its last holder,
// left open) is granted to its next owner once the transaction ends; meanwhile the next
// owner, which waits for that expiry, heartbeats a few times a second, not in a loop.
func TestHeldExpiredGrantIsRetriedNotInALoop(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pgtest.Pool(t)
	if _, err := pool.Exec(ctx, `SELECT pgcoord_partition_create('held', 1)`); err != nil {
		t.Fatal(err)
	}
	var token int64
	if err := pool.QueryRow(ctx, `SELECT tokens[1] FROM pgcoord_partition_heartbeat('held', 'old', 1, interval '1 second', '{}', true)`).Scan(&token); err != nil {
		t.Fatal(err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	var held int
	if err := tx.QueryRow(ctx, `SELECT count(*) FROM pgcoord_partition_check('held', 0, 'old', $1)`, token).Scan(&held); err != nil || held != 1 {
		t.Fatalf("check: %d rows, %v", held, err)
	}
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(pgtest.WaitLimit)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	waitFor("the old grant to expire", func() bool { return len(holders(t, pool, "held")) == 1 && holders(t, pool, "held")[0] == "" })
	b := &beats{}
	m, _ := join(t, pool, "held", "new", partition.Options{Tracer: b}) // TTL 3s: a retry every 100ms
	time.Sleep(time.Second)
	if n := b.n.Load(); n > 40 {
		t.Fatalf("%d heartbeats in a second while the expired grant was held: a loop", n)
	}
	if len(m.Owned()) != 0 {
		t.Fatalf("granted %v while a transaction holds the partition", m.Owned())
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor("the partition to be granted", func() bool { return len(m.Owned()) == 1 })
}

// TestLeaveGrantsToTheNextOwner: Leave grants the leaver's partitions to the member the
// plan names in its own transaction — that member holds them when Leave returns, before it
// made any call — and the member, woken by the leave's notification, takes them from a
// read: OnAssign runs for them without a heartbeat of its. (Behind a pooler, where no
// notification comes, it takes them at its next heartbeat: Sync here.)
func TestLeaveGrantsToTheNextOwner(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	long := time.Minute // heartbeats every 20 s: none is due while the test runs
	if pgtest.BehindPooler() {
		long = ttl // heartbeats are how members learn there: every second
	}
	a, _ := join(t, pool, "handoff", "a", partition.Options{Partitions: 4, TTL: long})
	b := &beats{}
	m, e := join(t, pool, "handoff", "b", partition.Options{TTL: long, Tracer: b})
	if got := counts(settled(t, pool, "handoff")); got["a"] != 2 || got["b"] != 2 {
		t.Fatalf("settled as %v, want two each", got)
	}
	before := b.n.Load()
	if err := a.Leave(t.Context()); err != nil {
		t.Fatal(err)
	}
	if got := counts(holders(t, pool, "handoff")); got["b"] != 4 {
		t.Fatalf("holders when Leave returned: %v, want all 4 granted to b by the leave", got)
	}
	if pgtest.BehindPooler() {
		if err := m.Sync(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	pgtest.Until(t, "b assigned all 4", func() bool {
		e.mu.Lock()
		defer e.mu.Unlock()
		return len(e.assigned) == 4
	})
	if n := b.n.Load() - before; n != 0 && !pgtest.BehindPooler() {
		t.Errorf("b heartbeated %d times to take the leaver's partitions; a read should do", n)
	}
}

// TestPendingPartitionMakesTheReadHeartbeat: a release the grant had to skip (a check of
// the releaser's grant still open) leaves the partition free; the member it is planned for,
// woken by the release's notification, reads that it waits for a free partition and
// heartbeats at once (not at the next third of its TTL) — and so, once the check ended,
// takes it with Sync.
func TestPendingPartitionMakesTheReadHeartbeat(t *testing.T) {
	pgtest.NeedsSession(t, "the release's notification wakes the member")
	t.Parallel()
	ctx := t.Context()
	pool := pgtest.Pool(t)
	if _, err := pool.Exec(ctx, `SELECT pgcoord_partition_create('pending', 2)`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `SELECT pgcoord_partition_heartbeat('pending', 'sql', 1, interval '1 hour', '{}', true)`); err != nil {
		t.Fatal(err)
	}
	b := &beats{}
	m, _ := join(t, pool, "pending", "go", partition.Options{TTL: time.Minute, Tracer: b}) // planned partition 1
	var token int64
	if err := pool.QueryRow(ctx, `SELECT fence_token FROM pgcoord_partitions WHERE group_name = 'pending' AND partition = 1 AND holder = 'sql'`).Scan(&token); err != nil {
		t.Fatal(err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := tx.Exec(ctx, `SELECT count(*) FROM pgcoord_partition_check('pending', 1, 'sql', $1)`, token); err != nil {
		t.Fatal(err)
	}
	before := b.n.Load()
	if _, err := pool.Exec(ctx, `SELECT pgcoord_partition_heartbeat('pending', 'sql', 1, interval '1 hour', '{1}')`); err != nil {
		t.Fatal(err)
	}
	if h := holders(t, pool, "pending"); h[1] != "" {
		t.Fatalf("partition 1 held by %q after a release under an open check, want free", h[1])
	}
	pgtest.Until(t, "a heartbeat of go after its read found partition 1 free", func() bool { return b.n.Load() > before })
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := m.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if got := m.Owned(); len(got) != 1 || got[0].ID != 1 {
		t.Fatalf("go owns %v after the check ended, want partition 1", got)
	}
}

// TestLeaveHonoursItsContext: a Leave whose ctx ends while an OnRevoke still runs returns
// ctx's error then, without releasing the partition (it moves when the lease expires).
func TestLeaveHonoursItsContext(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	gate := make(chan struct{})
	defer close(gate)
	m, _ := join(t, pool, "stuck", "a", partition.Options{Partitions: 1, TTL: time.Minute,
		OnRevoke: func(ctx context.Context, _ partition.Partition) {
			select {
			case <-gate:
			case <-ctx.Done():
			}
		}})
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := m.Leave(ctx)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Leave with an OnRevoke that does not return: %v, want DeadlineExceeded", err)
	}
	if waited := time.Since(start); waited > 10*time.Second {
		t.Errorf("Leave returned after %v; its ctx ended after 200ms (RevokeGrace is 20s)", waited)
	}
	if h := holders(t, pool, "stuck"); h[0] != "a" {
		t.Errorf("partition 0 held by %q after a Leave that gave up, want still a's until its lease expires", h[0])
	}
}
