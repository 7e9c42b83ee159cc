package outbox_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/outbox"
	"github.com/pgcoord/pgcoord/pgcoord"
)

func TestEnqueueIsVisibleOnlyAfterCommit(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pgtest.Pool(t)

	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	m, err := outbox.Enqueue(ctx, tx, outbox.Message{
		Topic: "orders", Key: "order-1", Payload: []byte(`{"total": 42}`), JSON: true,
		Headers: map[string]string{"trace": "abc"},
	})
	if err != nil {
		t.Fatal(err)
	}
	if m.ID < 1 || m.State != outbox.Pending || m.CreatedAt.IsZero() || !m.AvailableAt.Equal(m.CreatedAt) {
		t.Fatalf("enqueued %+v: want an id, pending, available at creation", m)
	}
	// Before COMMIT, neither a relay nor anyone else sees it.
	if got, err := outbox.List(ctx, pool, nil); err != nil || len(got) != 0 {
		t.Fatalf("uncommitted message visible: %v, %v", got, err)
	}
	rec := &recorder{}
	relay := newRelay(t, pool, rec, outbox.Config{})
	if n := runBatch(t, relay); n != 0 {
		t.Fatalf("relay claimed %d uncommitted messages", n)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	got := get(t, pool, m.ID)
	if got.Topic != "orders" || got.Key != "order-1" || string(got.Payload) != `{"total": 42}` || !got.JSON ||
		got.Headers["trace"] != "abc" || got.State != outbox.Pending {
		t.Fatalf("stored %+v", got)
	}

	// A rolled-back message leaves nothing.
	tx, err = pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rolled, err := outbox.Enqueue(ctx, tx, msg("order-2", "x"))
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := outbox.Get(ctx, pool, rolled.ID); !errors.Is(err, outbox.ErrNotFound) {
		t.Fatalf("rolled-back message: Get err = %v, want ErrNotFound", err)
	}
	if n := runBatch(t, relay); n != 1 || len(rec.payloads()) != 1 || rec.payloads()[0] != `{"total": 42}` {
		t.Fatalf("relay claimed %d, delivered %q; want the committed message only", n, rec.payloads())
	}
}

func TestEnqueueRejectsBadInputBeforeSQL(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	tx := noSQL{}
	big := make([]byte, outbox.MaxPayload+1)
	cases := []struct {
		name string
		msg  outbox.Message
		want error
	}{
		{"empty topic", outbox.Message{Key: "k"}, pgcoord.ErrInvalidName},
		{"empty key", outbox.Message{Topic: "t"}, pgcoord.ErrInvalidName},
		{"long topic", outbox.Message{Topic: strings.Repeat("x", 256), Key: "k"}, pgcoord.ErrInvalidName},
		{"oversize payload", outbox.Message{Topic: "t", Key: "k", Payload: big}, outbox.ErrPayloadTooLarge},
		{"invalid JSON", outbox.Message{Topic: "t", Key: "k", Payload: []byte(`{"a":`), JSON: true}, outbox.ErrInvalidJSON},
		{"empty JSON", outbox.Message{Topic: "t", Key: "k", JSON: true}, outbox.ErrInvalidJSON},
		{"negative delay", outbox.Message{Topic: "t", Key: "k", Delay: -time.Second}, pgcoord.ErrInvalidArgument},
		{"huge delay", outbox.Message{Topic: "t", Key: "k", Delay: outbox.MaxDelay + time.Second}, pgcoord.ErrInvalidArgument},
		{"empty header name", outbox.Message{Topic: "t", Key: "k", Headers: map[string]string{"": "v"}}, pgcoord.ErrInvalidArgument},
		{"oversize headers", outbox.Message{Topic: "t", Key: "k", Headers: map[string]string{"h": strings.Repeat("v", outbox.MaxHeaders)}}, pgcoord.ErrInvalidArgument},
	}
	for _, c := range cases {
		if _, err := outbox.Enqueue(ctx, tx, c.msg); !errors.Is(err, c.want) {
			t.Errorf("%s: err = %v, want %v", c.name, err, c.want)
		}
	}
	if _, err := outbox.Enqueue(ctx, nil, msg("k", "x")); !errors.Is(err, pgcoord.ErrInvalidArgument) {
		t.Errorf("nil tx: err = %v", err)
	}
	// The payload cap is inclusive, and an empty payload is a payload.
	pool := pgtest.Pool(t)
	exact := make([]byte, outbox.MaxPayload)
	got := enqueue(t, pool, outbox.Message{Topic: "t", Key: "k", Payload: exact}, outbox.Message{Topic: "t", Key: "k"})
	if m := get(t, pool, got[0].ID); len(m.Payload) != outbox.MaxPayload {
		t.Fatalf("stored %d bytes", len(m.Payload))
	}
	if m := get(t, pool, got[1].ID); m.Payload == nil || len(m.Payload) != 0 {
		t.Fatalf("empty payload read back as %v", m.Payload)
	}
}

// The SQL API checks what the Go API checks, for callers that skip the Go library.
func TestSQLAPIEnqueue(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pgtest.Pool(t)
	var id int64
	err := pool.QueryRow(ctx, `SELECT id FROM pgcoord_outbox_enqueue('orders', 'o-1', '{"n": 1}', '{"trace": "t1", "n": 2}', '1 hour')`).Scan(&id)
	if err != nil {
		t.Fatal(err)
	}
	m := get(t, pool, id)
	if !m.JSON || string(m.Payload) != `{"n": 1}` || m.Headers["trace"] != "t1" || m.Headers["n"] != "2" ||
		m.AvailableAt.Sub(m.CreatedAt) != time.Hour {
		t.Fatalf("SQL API stored %+v", m)
	}
	for _, bad := range []string{
		`SELECT pgcoord_outbox_enqueue('', 'k', '{}')`,
		`SELECT pgcoord_outbox_enqueue('t', '', '{}')`,
		`SELECT pgcoord_outbox_enqueue('t', 'k', '{}', '{}', '-1 second')`,
		`SELECT pgcoord_outbox_enqueue_bytes('t', 'k', '\x7b', true)`, // "{": not JSON
		`SELECT pgcoord_outbox_enqueue_bytes('t', 'k', decode(repeat('00', 1048577), 'hex'))`,
	} {
		_, err := pool.Exec(ctx, bad)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || (pgErr.Code != "22023" && pgErr.Code != "22P02") {
			t.Errorf("%s: err = %v, want SQLSTATE 22023 or 22P02", bad, err)
		}
	}
}

func TestEnqueueDelay(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	m := enqueue(t, pool, outbox.Message{Topic: "t", Key: "k", Payload: []byte("later"), Delay: time.Hour})[0]
	if d := m.AvailableAt.Sub(m.CreatedAt); d != time.Hour {
		t.Fatalf("available %v after creation, want 1h", d)
	}
	clock := pgtest.NewClock(t, pool)
	clock.Freeze(m.CreatedAt.Add(59 * time.Minute))
	rec := &recorder{}
	r := newRelay(t, pool, rec, outbox.Config{})
	if n := runBatch(t, r); n != 0 {
		t.Fatalf("claimed %d messages before the delay ended", n)
	}
	clock.Advance(time.Minute)
	if n := runBatch(t, r); n != 1 || get(t, pool, m.ID).State != outbox.Delivered {
		t.Fatalf("claimed %d messages once the delay ended; state %s", n, get(t, pool, m.ID).State)
	}
}

// Two transactions writing one key are serialized by Enqueue: the second gets its id
// after the first committed, so the key's ids are in commit order.
func TestEnqueueSerializesWritersOfOneKey(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pgtest.Pool(t)
	first, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer first.Rollback(ctx)
	a, err := outbox.Enqueue(ctx, first, msg("k", "a"))
	if err != nil {
		t.Fatal(err)
	}
	second, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer second.Rollback(ctx)
	// Another key is not held up.
	if _, err := outbox.Enqueue(ctx, second, msg("other", "o")); err != nil {
		t.Fatal(err)
	}
	waiter, blocker := pgtest.BackendPID(t, second), pgtest.BackendPID(t, first)
	call := pgtest.Go(func() (outbox.Message, error) { return outbox.Enqueue(ctx, second, msg("k", "b")) })
	pgtest.WaitBlocked(t, pool, call, waiter, blocker)
	if err := first.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	b, err := call.Wait(t)
	if err != nil {
		t.Fatal(err)
	}
	if err := second.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if b.ID <= a.ID {
		t.Fatalf("second writer of the key got id %d, not above the first's %d", b.ID, a.ID)
	}
	rec := &recorder{}
	runBatch(t, newRelay(t, pool, rec, outbox.Config{}))
	if got := strings.Join(rec.payloads(), ","); got != "o,a,b" && got != "a,b,o" {
		t.Fatalf("delivered %s; want a before b", got)
	}
}

func TestEnqueueBatch(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pgtest.Pool(t)
	in := []outbox.Message{
		msg("b", "b1"), msg("a", "a1"), msg("b", "b2"),
		{Topic: "t", Key: "a", Payload: []byte(`[1]`), JSON: true, Headers: map[string]string{"h": "v"}, Delay: time.Minute},
	}
	var got []outbox.Message
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) (err error) {
		got, err = outbox.EnqueueBatch(ctx, tx, in)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	for i, m := range got {
		stored := get(t, pool, m.ID)
		if string(stored.Payload) != string(in[i].Payload) || stored.Key != in[i].Key || stored.JSON != in[i].JSON ||
			!stored.AvailableAt.Equal(m.AvailableAt) {
			t.Fatalf("message %d: returned %+v, stored %+v", i, m, stored)
		}
		if i > 0 && m.ID <= got[i-1].ID {
			t.Fatalf("ids %d then %d: not in the order given", got[i-1].ID, m.ID)
		}
	}
	if got[3].AvailableAt.Sub(got[3].CreatedAt) != time.Minute || get(t, pool, got[3].ID).Headers["h"] != "v" {
		t.Fatalf("delay or headers lost: %+v", got[3])
	}
	// Messages without headers store the column's default, an empty object, whichever way
	// they were written (the Go library sends no headers for them), so SQL readers see {}.
	one := enqueue(t, pool, msg("c", "c1"))[0]
	var empty int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pgcoord_outbox WHERE id = ANY ($1) AND headers = '{}'`,
		[]int64{got[0].ID, one.ID}).Scan(&empty); err != nil || empty != 2 {
		t.Fatalf("messages without headers stored with {}: %d of 2 (%v)", empty, err)
	}
	bad := []outbox.Message{msg("a", "x"), {Topic: "t", Key: "k", Payload: []byte("{"), JSON: true}}
	if _, err := outbox.EnqueueBatch(ctx, noSQL{}, bad); !errors.Is(err, outbox.ErrInvalidJSON) {
		t.Fatalf("batch with invalid JSON: err = %v", err)
	}
	if _, err := outbox.EnqueueBatch(ctx, noSQL{}, nil); !errors.Is(err, pgcoord.ErrInvalidArgument) {
		t.Fatalf("empty batch: err = %v", err)
	}
	// The SQL function checks too.
	_, err = pool.Exec(ctx, `SELECT pgcoord_outbox_enqueue_many('{t}', '{""}', '{x}', '{f}', '{"{}"}', '{NULL}')`)
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "22023" {
		t.Fatalf("empty key through SQL: err = %v", err)
	}
}

// The per-key order lock is the row lock of (topic, key) in pgcoord_outbox_keys, held
// until the producer's transaction ends, and Enqueue takes no advisory lock: an advisory
// key can be taken by any login, a row lock needs a grant on the table.
func TestEnqueueLockIsARowLock(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pgtest.Pool(t)
	enqueue(t, pool, msg("k", "first")) // the key's row exists (a new one is invisible until its commit)
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := outbox.Enqueue(ctx, tx, outbox.Message{Topic: "t", Key: "k", Payload: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	var advisory int
	if err := tx.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE pid = pg_backend_pid() AND locktype = 'advisory'`).Scan(&advisory); err != nil || advisory != 0 {
		t.Fatalf("Enqueue holds %d advisory locks (%v), want none", advisory, err)
	}
	other, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = other.Rollback(ctx) }()
	_, err = other.Exec(ctx, `SELECT FROM pgcoord_outbox_keys WHERE topic = 't' AND key = 'k' FOR UPDATE NOWAIT`)
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "55P03" {
		t.Fatalf("the key's row while its producer is open: %v, want 55P03 (locked)", err)
	}
}
