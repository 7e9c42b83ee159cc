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

// A relay's registration as idle never waits for producers, so no producer queues behind
// it, however long another producer's transaction stays open. It reports whether it is
// tight: false while a producer that checked for idle relays before it is uncommitted
// (that one may commit without notifying), true once none is. On the old protocol the
// registration waited for such a producer, and every new producer queued behind it.
func TestIdleRegistrationNeverWaitsForProducers(t *testing.T) {
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
		// A wait for a lock fails the test instead of hanging it.
		if _, err := tx.Exec(ctx, `SET LOCAL lock_timeout = '10s'`); err != nil {
			t.Fatal(err)
		}
		return tx
	}
	register := func() bool {
		t.Helper()
		var tight bool
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `SET LOCAL lock_timeout = '10s'`); err != nil {
				return err
			}
			return tx.QueryRow(ctx, `SELECT pgcoord_outbox_idle('relay', '1 minute')`).Scan(&tight)
		})
		if err != nil {
			t.Fatalf("registration: %v", err)
		}
		return tight
	}

	// slow has checked for idle relays (it holds the wake-up lock, shared) and stays open.
	slow := begin()
	if _, err := outbox.Enqueue(ctx, slow, msg("1", "slow")); err != nil {
		t.Fatal(err)
	}
	if register() {
		t.Fatal("registration tight while a producer that checked before it is uncommitted")
	}
	// Another producer writes and commits at once, and a registration is still loose.
	other := begin()
	if _, err := outbox.Enqueue(ctx, other, msg("2", "other")); err != nil {
		t.Fatalf("a producer waited behind a registering relay: %v", err)
	}
	if err := other.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if register() {
		t.Fatal("registration tight while the slow producer is uncommitted")
	}
	if err := slow.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if !register() {
		t.Fatal("registration loose with no producer uncommitted")
	}
	// The claim after a registration sees every message committed before it.
	if n := runBatch(t, newRelay(t, pool, &recorder{}, outbox.Config{})); n != 2 {
		t.Fatalf("claim after the registration found %d messages, want 2", n)
	}
}
