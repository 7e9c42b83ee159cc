package outbox_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/outbox"
)

// Producers notify only while a relay waits, once per committed transaction whatever it
// wrote and through whichever write path, never for a rollback; a rolled-back savepoint
// undoes its check, so the transaction checks again.
func TestWakeUpOncePerCommittedTransaction(t *testing.T) {
	pgtest.NeedsSession(t, "LISTEN: counts the notifications themselves")
	t.Parallel()
	ctx := t.Context()
	pool := pgtest.Pool(t)
	var channel string
	if err := pool.QueryRow(ctx, `SELECT pgcoord_channel('outbox')`).Scan(&channel); err != nil {
		t.Fatal(err)
	}
	listener, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer listener.Release()
	if _, err := listener.Exec(ctx, "LISTEN "+pgx.Identifier{channel}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	// notifications returns how many wake-ups arrived before a marker sent now: they are
	// delivered in commit order, so the marker closes the count without a timeout.
	notifications := func() int {
		t.Helper()
		if _, err := pool.Exec(ctx, `SELECT pg_notify($1, 'marker')`, channel); err != nil {
			t.Fatal(err)
		}
		for n := 0; ; n++ {
			note, err := listener.Conn().WaitForNotification(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if note.Payload == "marker" {
				return n
			}
		}
	}
	inTx := func(fn func(tx pgx.Tx) error) {
		t.Helper()
		if err := pgx.BeginFunc(ctx, pool, fn); err != nil {
			t.Fatal(err)
		}
	}
	everyPath := func(tx pgx.Tx) error {
		for _, k := range []string{"a", "b"} {
			if _, err := outbox.Enqueue(ctx, tx, msg(k, "x")); err != nil {
				return err
			}
		}
		if _, err := outbox.EnqueueBatch(ctx, tx, []outbox.Message{msg("c", "x"), msg("d", "x")}); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `SELECT pgcoord_outbox_enqueue('t', 'e', '{}'); SELECT pgcoord_outbox_enqueue_bytes('t', 'f', '\x00')`)
		return err
	}

	inTx(everyPath)
	if n := notifications(); n != 0 {
		t.Fatalf("no relay waits, yet %d notifications", n)
	}
	if _, err := pool.Exec(ctx, `SELECT pgcoord_outbox_idle('relay', '1 hour')`); err != nil {
		t.Fatal(err)
	}
	for _, path := range []struct {
		name string
		fn   func(tx pgx.Tx) error
	}{
		{"every write path in one transaction", everyPath},
		{"the SQL API first", func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `SELECT pgcoord_outbox_enqueue_bytes('t', 'g', '\x00')`)
			if err == nil {
				_, err = outbox.Enqueue(ctx, tx, msg("h", "x"))
			}
			return err
		}},
		{"a batch first", func(tx pgx.Tx) error {
			_, err := outbox.EnqueueBatch(ctx, tx, []outbox.Message{msg("i", "x")})
			return err
		}},
	} {
		inTx(path.fn)
		if n := notifications(); n != 1 {
			t.Fatalf("%s: %d notifications, want 1", path.name, n)
		}
	}

	// A rollback notifies nobody.
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := outbox.Enqueue(ctx, tx, msg("j", "x")); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if n := notifications(); n != 0 {
		t.Fatalf("rolled back: %d notifications, want 0", n)
	}

	// The check made inside a rolled-back savepoint is undone with it (its notification
	// too): the next message checks again.
	inTx(func(tx pgx.Tx) error {
		sp, err := tx.Begin(ctx)
		if err != nil {
			return err
		}
		if _, err := outbox.Enqueue(ctx, sp, msg("k", "x")); err != nil {
			return err
		}
		if err := sp.Rollback(ctx); err != nil {
			return err
		}
		_, err = outbox.Enqueue(ctx, tx, msg("l", "x"))
		return err
	})
	if n := notifications(); n != 1 {
		t.Fatalf("after a rolled-back savepoint: %d notifications, want 1", n)
	}
}

// Producers check for idle relays before they take their keys' locks, so a producer never
// holds a key's lock while it queues for the wake-up lock behind a registering relay. If it
// did, a producer already past its check that then wants that key would wait for it — for
// as long as the queued producer's transaction — while the relay waits for that producer.
func TestWakeUpCheckComesBeforeTheKeyLock(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pgtest.Pool(t)
	begin := func() pgx.Tx {
		t.Helper()
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = tx.Rollback(context.WithoutCancel(ctx)) })
		return tx
	}
	// a has checked (it holds the wake-up lock, shared) and holds key 1.
	a := begin()
	if _, err := outbox.Enqueue(ctx, a, msg("1", "x")); err != nil {
		t.Fatal(err)
	}
	// A relay registers: it waits for a, the producer that checked before it.
	relay, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer relay.Release()
	relayPID := pgtest.BackendPID(t, relay)
	registered := pgtest.Go(func() (struct{}, error) {
		_, err := relay.Exec(ctx, `SELECT pgcoord_outbox_idle('relay', '1 minute')`)
		return struct{}{}, err
	})
	pgtest.WaitBlocked(t, pool, registered, relayPID, pgtest.BackendPID(t, a))
	// c's first message, to key 2, queues behind the relay for its check.
	c := begin()
	cPID := pgtest.BackendPID(t, c)
	queued := pgtest.Go(func() (outbox.Message, error) { return outbox.Enqueue(ctx, c, msg("2", "x")) })
	pgtest.WaitBlocked(t, pool, queued, cPID, relayPID)
	// c holds no key yet, so a gets key 2 at once.
	if _, err := a.Exec(ctx, `SET LOCAL lock_timeout = '500ms'`); err != nil {
		t.Fatal(err)
	}
	if _, err := outbox.Enqueue(ctx, a, msg("2", "y")); err != nil {
		t.Fatalf("a producer waited for key 2, held by one queued behind the relay: %v", err)
	}
	if err := a.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := registered.Wait(t); err != nil {
		t.Fatal(err)
	}
	if _, err := queued.Wait(t); err != nil {
		t.Fatal(err)
	}
	if err := c.Commit(ctx); err != nil {
		t.Fatal(err)
	}
}
