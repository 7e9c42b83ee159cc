package outbox_test

import (
	"errors"
	"testing"
	"time"

	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/outbox"
	"github.com/pgcoord/pgcoord/pgcoord"
)

func TestStats(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pgtest.Pool(t)
	ms := enqueue(t, pool,
		msg("a", "a1"), msg("a", "a2"), msg("b", "b1"),
		outbox.Message{Topic: "t", Key: "c", Payload: []byte("later"), Delay: time.Hour},
		outbox.Message{Topic: "audit", Key: "x", Payload: []byte("fails")})
	clock := pgtest.NewClock(t, pool)
	clock.Freeze(dbNow(t, pool))
	// One failure of "fails" in audit (MaxAttempts 1: dead at once), and key b claimed
	// by a relay that is still delivering.
	dead := newRelay(t, pool, &recorder{fail: map[string]bool{"fails": true}}, outbox.Config{Topics: []string{"audit"}, MaxAttempts: 1})
	runBatch(t, dead)
	if _, err := pool.Exec(ctx, `SELECT pgcoord_outbox_claim('busy', 1, 1, 1048576, '1 hour', '{t}', 't', 'a')`); err != nil {
		t.Fatal(err)
	}
	clock.Advance(time.Second)
	stats, err := outbox.Stats(ctx, pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(stats) != 2 || stats[0].Topic != "audit" || stats[1].Topic != "t" {
		t.Fatalf("stats %+v: want topics audit and t", stats)
	}
	audit, tt := stats[0], stats[1]
	if audit.Pending != 0 || audit.Dead != 1 || !audit.OldestPending.IsZero() || audit.OldestPendingAge() != 0 {
		t.Fatalf("audit %+v", audit)
	}
	if tt.Pending != 4 || tt.Due != 2 || tt.InFlight != 1 || tt.Dead != 0 || !tt.OldestPending.Equal(ms[0].CreatedAt) ||
		tt.OldestPendingAge() < time.Second {
		t.Fatalf("t %+v: want 4 pending, 2 due (a1, a2), 1 in flight (b1), oldest from the first enqueue", tt)
	}
	one, err := outbox.Stats(ctx, pool, &outbox.StatsOpts{Topic: "audit"})
	if err != nil || len(one) != 1 || one[0].Topic != "audit" {
		t.Fatalf("Stats(audit) = %+v, %v", one, err)
	}

	dl, err := outbox.List(ctx, pool, &outbox.ListOpts{State: outbox.Dead})
	if err != nil || len(dl) != 1 || dl[0].ID != ms[4].ID || dl[0].LastError != "boom" {
		t.Fatalf("List(dead) = %+v, %v", dl, err)
	}
	page, err := outbox.List(ctx, pool, &outbox.ListOpts{Topic: "t", After: ms[0].ID, Limit: 2})
	if err != nil || len(page) != 2 || page[0].ID != ms[1].ID || page[1].ID != ms[2].ID {
		t.Fatalf("List(page) = %+v, %v", page, err)
	}
	if _, err := outbox.List(ctx, pool, &outbox.ListOpts{State: "gone"}); !errors.Is(err, pgcoord.ErrInvalidArgument) {
		t.Fatalf("List(bad state) err = %v", err)
	}

	n, err := outbox.RetryDead(ctx, pool, &outbox.RetryDeadOpts{DryRun: true})
	if err != nil || n != 1 {
		t.Fatalf("RetryDead dry run = %d, %v", n, err)
	}
	if got := get(t, pool, ms[4].ID); got.State != outbox.Dead {
		t.Fatalf("dry run changed the message: %+v", got)
	}
	if n, err := outbox.RetryDead(ctx, pool, &outbox.RetryDeadOpts{Topic: "audit"}); err != nil || n != 1 {
		t.Fatalf("RetryDead = %d, %v", n, err)
	}
	if got := get(t, pool, ms[4].ID); got.State != outbox.Pending || got.Attempts != 0 {
		t.Fatalf("after RetryDead: %+v", got)
	}
	if err := outbox.Retry(ctx, pool, 1<<40); !errors.Is(err, outbox.ErrNotFound) {
		t.Fatalf("Retry(unknown) err = %v", err)
	}
}

// GC deletes delivered messages past the retention, in batches, and never a pending
// one; dead ones only when asked.
func TestGCInBatches(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pgtest.Pool(t)
	var msgs []outbox.Message
	for i := range 25 {
		msgs = append(msgs, msg(string(rune('a'+i)), "ok"))
	}
	msgs = append(msgs, msg("dead", "fails"))
	enqueue(t, pool, msgs...)
	r := newRelay(t, pool, &recorder{fail: map[string]bool{"fails": true}}, outbox.Config{MaxAttempts: 1})
	runBatch(t, r)
	stillPending := enqueue(t, pool, msg("p", "pending"))[0]

	if n, err := outbox.GC(ctx, pool, nil); err != nil || n != 0 {
		t.Fatalf("GC with the default 7-day retention deleted %d (%v) fresh messages", n, err)
	}
	pgtest.NewClock(t, pool).Advance(8 * 24 * time.Hour)
	if n, err := outbox.GC(ctx, pool, &outbox.GCOpts{DryRun: true}); err != nil || n != 25 {
		t.Fatalf("dry run = %d, %v; want 25", n, err)
	}
	var progress []int64
	n, err := outbox.GC(ctx, pool, &outbox.GCOpts{Batch: 10, Progress: func(d int64) { progress = append(progress, d) }})
	if err != nil || n != 25 {
		t.Fatalf("GC = %d, %v; want 25", n, err)
	}
	if len(progress) != 3 || progress[0] != 10 || progress[1] != 20 || progress[2] != 25 {
		t.Fatalf("progress %v; want batches of 10: 10, 20, 25", progress)
	}
	if got := get(t, pool, stillPending.ID); got.State != outbox.Pending {
		t.Fatalf("pending message %+v after GC", got)
	}
	if dl, _ := outbox.List(ctx, pool, &outbox.ListOpts{State: outbox.Dead}); len(dl) != 1 {
		t.Fatalf("dead messages after GC without Dead: %d, want 1 kept", len(dl))
	}
	if n, err := outbox.GC(ctx, pool, &outbox.GCOpts{Dead: true}); err != nil || n != 1 {
		t.Fatalf("GC(Dead) = %d, %v; want the dead message", n, err)
	}
	for _, bad := range []*outbox.GCOpts{{Batch: -1}, {Batch: outbox.MaxGCBatch + 1}, {OlderThan: -time.Hour}} {
		if _, err := outbox.GC(ctx, noSQL{}, bad); !errors.Is(err, pgcoord.ErrInvalidArgument) {
			t.Errorf("GC(%+v) err = %v", bad, err)
		}
	}
}
