package fenced_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/fenced"
	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/leases"
)

// takeover grants the lease name to A, lets A's grant expire by the database clock (A is
// paused) and grants it to B, who has not written anything yet.
func takeover(t *testing.T, pool *pgxpool.Pool, name string) (a, b leases.Lease) {
	t.Helper()
	clock := pgtest.NewClock(t, pool)
	a, err := leases.TryAcquire(t.Context(), pool, name, 30*time.Second, &leases.AcquireOpts{Holder: "A"})
	if err != nil {
		t.Fatal(err)
	}
	clock.Advance(time.Minute) // A sleeps through its TTL
	b, err = leases.TryAcquire(t.Context(), pool, name, 30*time.Second, &leases.AcquireOpts{Holder: "B"})
	if err != nil {
		t.Fatalf("B could not take the expired lease over: %v", err)
	}
	if b.Token <= a.Token {
		t.Fatalf("B's token %d is not above A's %d", b.Token, a.Token)
	}
	return a, b
}

// The README's incident, at the register: paused holder A wakes after B was granted the
// lease but before B wrote anything. With the lease's name as the resource, Check and Write
// refuse A already — the register consults the lease's newest grant — and then accept B.
// (A register that judged only the tokens it had seen accepted A's charge, then B's: two
// charges.)
func TestAStaleHolderIsRefusedBeforeTheNewHolderWrites(t *testing.T) {
	t.Parallel()
	writes := []struct {
		name  string
		write func(ctx context.Context, tx pgx.Tx, l leases.Lease) error
	}{
		{"Check", func(ctx context.Context, tx pgx.Tx, l leases.Lease) error {
			if err := fenced.Check(ctx, tx, l.Name, l.Token); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `INSERT INTO charges (order_id, worker, fence_token) VALUES (42, $1, $2)`, l.Holder, l.Token)
			return err
		}},
		{"Write", func(ctx context.Context, tx pgx.Tx, l leases.Lease) error {
			_, err := fenced.Write(ctx, tx, l.Name, l.Token,
				`INSERT INTO charges (order_id, worker, fence_token) VALUES (42, $1, $2)`, l.Holder, l.Token)
			return err
		}},
	}
	for _, w := range writes {
		t.Run(w.name, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			pool := pgtest.Pool(t)
			exec(t, pool, `CREATE TABLE charges (order_id int, worker text, fence_token bigint)`)
			a, b := takeover(t, pool, "order:42")
			charge := func(l leases.Lease) error {
				return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return w.write(ctx, tx, l) })
			}

			if err := charge(a); !errors.Is(err, fenced.ErrStale) {
				t.Fatalf("A's charge (token %d) after B was granted %d, before B wrote: %v, want ErrStale", a.Token, b.Token, err)
			}
			if got := register(t, pool, "order:42"); got != -1 {
				t.Errorf("A's refused charge left a register holding %d", got)
			}
			if err := charge(b); err != nil {
				t.Fatalf("B's charge: %v", err)
			}
			if err := charge(a); !errors.Is(err, fenced.ErrStale) {
				t.Fatalf("A's charge after B's: %v, want ErrStale", err)
			}
			var n, token int64
			if err := pool.QueryRow(ctx, `SELECT count(*), max(fence_token) FROM charges`).Scan(&n, &token); err != nil {
				t.Fatal(err)
			}
			if n != 1 || token != b.Token {
				t.Fatalf("%d charges, the last with token %d; want B's one charge, token %d", n, token, b.Token)
			}
		})
	}
}

// The same incident on a table guarded by the trigger with a resource column: every INSERT
// is judged against the register of "order:" || order_id, so A's late insert is refused by
// the database whichever code path sends it, even before B inserted anything; B's insert
// passes; a row that carries no token or no resource is refused.
func TestTheResourceGuardRefusesAStaleInsert(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pgtest.Pool(t)
	exec(t, pool, `CREATE TABLE charges (order_id int, amount int NOT NULL, fence_token bigint)`)
	if err := fenced.InstallGuard(ctx, pool, "charges", "fence_token", &fenced.GuardOpts{ResourceColumn: "order_id", ResourcePrefix: "order:"}); err != nil {
		t.Fatalf("InstallGuard: %v", err)
	}
	a, b := takeover(t, pool, "order:42")
	insert := func(orderID any, token any) error {
		_, err := pool.Exec(ctx, `INSERT INTO charges (order_id, amount, fence_token) VALUES ($1, 100, $2)`, orderID, token)
		return err
	}

	// A plain INSERT through the pool, not this package: refused by the database.
	err := insert(42, a.Token)
	guardError(t, "A's late insert before B wrote", err)
	if err := insert(42, b.Token); err != nil {
		t.Fatalf("B's insert: %v", err)
	}
	guardError(t, "A's late insert after B's", insert(42, a.Token))
	// B again, and an UPDATE by B, pass; an UPDATE lowering the token does not.
	if err := insert(42, b.Token); err != nil {
		t.Fatalf("B's second insert: %v", err)
	}
	if _, err := pool.Exec(ctx, `UPDATE charges SET amount = 200 WHERE fence_token = $1`, b.Token); err != nil {
		t.Fatalf("B's update: %v", err)
	}
	_, err = pool.Exec(ctx, `UPDATE charges SET fence_token = $1`, a.Token)
	guardError(t, "an update to A's token", err)
	// Another order has its own register: a fresh token for it is accepted.
	c, err := leases.TryAcquire(ctx, pool, "order:43", time.Minute, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := insert(43, c.Token); err != nil {
		t.Fatalf("an insert for order 43 with its lease's token: %v", err)
	}
	// Rows without a token or without a resource are refused.
	guardError(t, "an insert without a token", insert(44, nil))
	guardError(t, "an insert without a resource", insert(nil, c.Token))

	var n int64
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM charges WHERE fence_token = $1 OR order_id = 43`, b.Token).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if total := queryInt64(t, pool, `SELECT count(*) FROM charges`); total != 3 || n != 3 {
		t.Fatalf("%d rows (%d by B or for order 43), want B's two and order 43's", total, n)
	}
	// The register of order 42 records B's token, as Check would.
	if got := register(t, pool, "order:42"); got != b.Token {
		t.Errorf("register order:42 = %d, want B's %d", got, b.Token)
	}
}

// A resource not named like the lease knows only the tokens written to it: a stale holder
// that writes before the new holder's first write is accepted there (the documented limit of
// the register, which CheckLease does not have).
func TestARegisterNotNamedLikeTheLeaseKnowsOnlyWrittenTokens(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pgtest.Pool(t)
	a, b := takeover(t, pool, "order:42")
	if err := check(ctx, pool, "payments/42", a.Token); err != nil {
		t.Fatalf("A's check of a resource not named like the lease: %v, want it accepted (nobody wrote it)", err)
	}
	if err := check(ctx, pool, "payments/42", b.Token); err != nil {
		t.Fatalf("B's check: %v", err)
	}
	if err := check(ctx, pool, "payments/42", a.Token); !errors.Is(err, fenced.ErrStale) {
		t.Fatalf("A's check after B wrote: %v, want ErrStale", err)
	}
	if err := checkLease(ctx, pool, a); !errors.Is(err, leases.ErrLost) {
		t.Fatalf("A's CheckLease: %v, want ErrLost", err)
	}
}
