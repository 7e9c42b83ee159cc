package fenced_test

import (
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgcoord/pgcoord/fenced"
	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/leases"
)

// Every refusal of this package's calls is counted in Refusals, once, and nothing else
// is. Not parallel: the counters are the process's, and the package's parallel tests
// refuse writes too (they run after this one).
func TestRefusalsAreCounted(t *testing.T) {
	pool := pgtest.Pool(t)
	newPayments(t, pool)
	if err := fenced.InstallGuard(t.Context(), pool, "payments", "fence_token", nil); err != nil {
		t.Fatal(err)
	}
	before := fenced.Refusals()
	inTx := func(fn func(tx pgx.Tx) error) error { return pgx.BeginFunc(t.Context(), pool, fn) }
	refusals := []struct {
		name string
		run  func(tx pgx.Tx) error
	}{
		{"Check", func(tx pgx.Tx) error { return fenced.Check(t.Context(), tx, "orders/42", 4) }},
		{"Write", func(tx pgx.Tx) error {
			_, err := fenced.Write(t.Context(), tx, "orders/42", 3, `SELECT 1`)
			return err
		}},
		{"Exec (no row matched)", func(tx pgx.Tx) error {
			_, err := fenced.Exec(t.Context(), tx, chargeSQL, 42, 4, "charged")
			return err
		}},
		{"Exec (the guard trigger)", func(tx pgx.Tx) error {
			_, err := fenced.Exec(t.Context(), tx, `UPDATE payments SET fence_token = 1 WHERE order_id = 42`)
			return err
		}},
	}
	if err := inTx(func(tx pgx.Tx) error { return fenced.Check(t.Context(), tx, "orders/42", 5) }); err != nil {
		t.Fatal(err)
	}
	if fenced.Refusals().Stale != before.Stale {
		t.Fatal("an accepted Check was counted as a refusal")
	}
	for i, r := range refusals {
		if err := inTx(r.run); !errors.Is(err, fenced.ErrStale) {
			t.Fatalf("%s: %v, want ErrStale", r.name, err)
		}
		if got := fenced.Refusals().Stale - before.Stale; got != int64(i+1) {
			t.Fatalf("after %s: %d refusals counted, want %d", r.name, got, i+1)
		}
	}

	l, err := leases.TryAcquire(t.Context(), pool, "payments", time.Minute, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := inTx(func(tx pgx.Tx) error { return fenced.CheckLease(t.Context(), tx, l) }); err != nil {
		t.Fatal(err)
	}
	if _, err := leases.Expire(t.Context(), pool, "payments", "test"); err != nil {
		t.Fatal(err)
	}
	if err := inTx(func(tx pgx.Tx) error { return fenced.CheckLease(t.Context(), tx, l) }); !errors.Is(err, leases.ErrLost) {
		t.Fatalf("CheckLease after a forced expiry: %v, want ErrLost", err)
	}
	if got := fenced.Refusals().LeaseLost - before.LeaseLost; got != 1 {
		t.Fatalf("lease refusals counted %d, want 1", got)
	}
}
