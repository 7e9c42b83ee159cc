package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
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

// Two transactions writing one key are serialized, by Enqueue and by EnqueueBatch alike,
// whether the key's order row is new (the first writer creates it) or was left by an
// earlier message (the first writer locks it): the second gets its id after the first
// committed, so the key's ids are in commit order.
func TestEnqueueSerializesWritersOfOneKey(t *testing.T) {
	t.Parallel()
	one := func(ctx context.Context, tx pgx.Tx, m outbox.Message) (outbox.Message, error) {
		return outbox.Enqueue(ctx, tx, m)
	}
	batch := func(ctx context.Context, tx pgx.Tx, m outbox.Message) (outbox.Message, error) {
		// Keys of this writer's own on both sides of it, so the batch locks more than the
		// contended row, and only that row is both writers'.
		p := string(m.Payload)
		got, err := outbox.EnqueueBatch(ctx, tx, []outbox.Message{msg("a"+p, "-"), m, msg("z"+p, "-")})
		if err != nil {
			return outbox.Message{}, err
		}
		return got[1], nil
	}
	for _, c := range []struct {
		name    string
		enqueue func(context.Context, pgx.Tx, outbox.Message) (outbox.Message, error)
		known   bool // the key's row is there before the first writer
	}{{"Enqueue/new", one, false}, {"Enqueue/known", one, true}, {"EnqueueBatch/new", batch, false}, {"EnqueueBatch/known", batch, true}} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			pool := pgtest.Pool(t)
			if c.known {
				enqueue(t, pool, msg("k", "earlier"))
			}
			first, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer first.Rollback(ctx)
			a, err := c.enqueue(ctx, first, msg("k", "a"))
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
			call := pgtest.Go(func() (outbox.Message, error) { return c.enqueue(ctx, second, msg("k", "b")) })
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
			var k []string
			for _, p := range rec.payloads() {
				if p == "earlier" || p == "a" || p == "b" {
					k = append(k, p)
				}
			}
			want := "a,b"
			if c.known {
				want = "earlier,a,b"
			}
			if got := strings.Join(k, ","); got != want {
				t.Fatalf("delivered %s of key k; want %s", got, want)
			}
		})
	}
}

// A producer in a REPEATABLE READ transaction gets a serialization failure (40001) when
// another transaction created its key's order row after its snapshot (outbox/doc.go,
// Failure modes), from Enqueue and EnqueueBatch alike. A key whose row was there before its
// snapshot is written, and so is one whose row another transaction deletes (as pgcoord gc
// does) while the producer waits for it: the row is created again.
func TestEnqueueUnderRepeatableReadConflicts(t *testing.T) {
	t.Parallel()
	for _, batch := range []bool{false, true} {
		for _, deleted := range []bool{false, true} {
			t.Run(fmt.Sprintf("batch=%v/deleted=%v", batch, deleted), func(t *testing.T) {
				t.Parallel()
				ctx := t.Context()
				pool := pgtest.Pool(t)
				enqueue(t, pool, msg("old", "x"))
				rr, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
				if err != nil {
					t.Fatal(err)
				}
				defer rr.Rollback(ctx)
				if _, err := rr.Exec(ctx, `SELECT FROM pgcoord_outbox_keys LIMIT 1`); err != nil { // takes the snapshot
					t.Fatal(err)
				}
				write := func(m outbox.Message) (outbox.Message, error) {
					if batch {
						got, err := outbox.EnqueueBatch(ctx, rr, []outbox.Message{m})
						if err != nil {
							return outbox.Message{}, err
						}
						return got[0], nil
					}
					return outbox.Enqueue(ctx, rr, m)
				}
				if deleted {
					del, err := pool.Begin(ctx)
					if err != nil {
						t.Fatal(err)
					}
					defer del.Rollback(ctx)
					if _, err := del.Exec(ctx, `DELETE FROM pgcoord_outbox_keys WHERE topic = 't' AND key = 'old'`); err != nil {
						t.Fatal(err)
					}
					waiter, blocker := pgtest.BackendPID(t, rr), pgtest.BackendPID(t, del)
					call := pgtest.Go(func() (outbox.Message, error) { return write(msg("old", "x2")) })
					pgtest.WaitBlocked(t, pool, call, waiter, blocker)
					if err := del.Commit(ctx); err != nil {
						t.Fatal(err)
					}
					if _, err := call.Wait(t); err != nil {
						t.Fatalf("a key whose row was deleted while the producer waited: %v", err)
					}
					if err := rr.Commit(ctx); err != nil {
						t.Fatal(err)
					}
					var n int
					if err := pool.QueryRow(ctx, `SELECT count(*) FROM pgcoord_outbox_keys WHERE topic = 't' AND key = 'old'`).Scan(&n); err != nil || n != 1 {
						t.Fatalf("the key's order row: %d rows (%v), want 1", n, err)
					}
					return
				}
				enqueue(t, pool, msg("new", "y"))
				if _, err := write(msg("old", "x2")); err != nil {
					t.Fatalf("a key whose row predates the snapshot: %v", err)
				}
				_, err = write(msg("new", "y2"))
				if pgErr := (*pgconn.PgError)(nil); !errors.As(err, &pgErr) || pgErr.Code != "40001" {
					t.Fatalf("a key whose row another transaction created after the snapshot: %v, want SQLSTATE 40001", err)
				}
			})
		}
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

// Concurrent EnqueueBatch calls never deadlock on each other (outbox.go): each takes its
// keys' locks in one order, whatever order its messages come in. Eight writers each write
// batches of five of eight keys, in a random order, and hold them until commit.
func TestEnqueueBatchesNeverDeadlock(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	keys := []string{"a", "b", "c", "d", "e", "f", "g", "h"}
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for w := range 8 {
		wg.Go(func() {
			rnd := rand.New(rand.NewPCG(uint64(w), 1))
			for range 25 {
				perm := rnd.Perm(len(keys))
				var batch []outbox.Message
				for _, i := range perm[:5] {
					batch = append(batch, msg(keys[i], "-"))
				}
				err := pgx.BeginFunc(t.Context(), pool, func(tx pgx.Tx) error {
					_, err := outbox.EnqueueBatch(t.Context(), tx, batch)
					return err
				})
				if err != nil {
					errs <- fmt.Errorf("writer %d: %w", w, err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}
