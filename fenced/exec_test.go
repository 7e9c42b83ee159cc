package fenced_test

import (
	"errors"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/fenced"
	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/pgcoord"
)

// chargeSQL is the conditional update of the mission's payment example.
const chargeSQL = `UPDATE payments SET status = $3, fence_token = $2
	WHERE order_id = $1 AND fence_token <= $2`

// newPayments creates a payments table with order 42 at token 5.
func newPayments(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	exec(t, pool, `CREATE TABLE payments (order_id int PRIMARY KEY, status text NOT NULL, fence_token bigint NOT NULL)`)
	exec(t, pool, `INSERT INTO payments VALUES (42, 'pending', 5)`)
}

// payment returns order id's status and fence token.
func payment(t *testing.T, pool *pgxpool.Pool, id int) (string, int64) {
	t.Helper()
	var status string
	var token int64
	if err := pool.QueryRow(t.Context(), `SELECT status, fence_token FROM payments WHERE order_id = $1`, id).Scan(&status, &token); err != nil {
		t.Fatal(err)
	}
	return status, token
}

func TestExecConditionalUpdate(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pgtest.Pool(t)
	newPayments(t, pool)

	// Higher and equal tokens write and return the statement's tag.
	for _, step := range []struct {
		token  int64
		status string
	}{{7, "charging"}, {7, "charged"}} {
		tag, err := fenced.Exec(ctx, pool, chargeSQL, 42, step.token, step.status)
		if err != nil {
			t.Fatalf("Exec with token %d: %v", step.token, err)
		}
		if !tag.Update() || tag.RowsAffected() != 1 || tag.String() != "UPDATE 1" {
			t.Fatalf("Exec with token %d: tag %q, want UPDATE 1", step.token, tag)
		}
		if status, token := payment(t, pool, 42); status != step.status || token != step.token {
			t.Fatalf("after Exec with token %d: row (%s, %d)", step.token, status, token)
		}
	}

	// A lower token matches no row: ErrStale, and the row is untouched.
	tag, err := fenced.Exec(ctx, pool, chargeSQL, 42, 6, "charged twice")
	if !errors.Is(err, fenced.ErrStale) || !fenced.IsStale(err) {
		t.Fatalf("Exec with a lower token = %v, want ErrStale", err)
	}
	if tag.RowsAffected() != 0 {
		t.Errorf("stale Exec tag = %q, want 0 rows", tag)
	}
	if status, token := payment(t, pool, 42); status != "charged" || token != 7 {
		t.Errorf("a stale Exec changed the row to (%s, %d)", status, token)
	}

	// Exec cannot tell a stale token from a missing row: both are "no row affected".
	if _, err := fenced.Exec(ctx, pool, chargeSQL, 43, 100, "charged"); !errors.Is(err, fenced.ErrStale) {
		t.Errorf("Exec on a missing row = %v, want ErrStale", err)
	}

	// Inside the caller's transaction: the write is part of it.
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fenced.Exec(ctx, tx, chargeSQL, 42, 8, "refunded"); err != nil {
		t.Fatalf("Exec in a transaction: %v", err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if status, token := payment(t, pool, 42); status != "charged" || token != 7 {
		t.Errorf("a rolled-back Exec left the row at (%s, %d)", status, token)
	}
}

func TestExecErrors(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pgtest.Pool(t)
	newPayments(t, pool)

	// A failing statement is not ErrStale, and the driver error stays reachable.
	_, err := fenced.Exec(ctx, pool, `UPDATE payments SET no_such_column = 1 WHERE order_id = $1`, 42)
	var pgErr *pgconn.PgError
	if err == nil || errors.Is(err, fenced.ErrStale) || fenced.IsStale(err) || !errors.As(err, &pgErr) || pgErr.Code != "42703" {
		t.Errorf("Exec of a bad statement = %v, want the undefined-column error, not ErrStale", err)
	}

	// A guard violation is ErrStale, with the driver error reachable.
	if err := fenced.InstallGuard(ctx, pool, "payments", "fence_token", nil); err != nil {
		t.Fatal(err)
	}
	_, err = fenced.Exec(ctx, pool, `UPDATE payments SET fence_token = 1 WHERE order_id = $1`, 42)
	if !errors.Is(err, fenced.ErrStale) || !errors.As(err, &pgErr) || pgErr.Code != fenced.GuardSQLState {
		t.Errorf("Exec lowering a guarded column = %v, want ErrStale wrapping SQLSTATE %s", err, fenced.GuardSQLState)
	}

	var nilPool *pgxpool.Pool
	for _, db := range []pgcoord.DBTX{nil, nilPool} {
		if _, err := fenced.Exec(ctx, db, chargeSQL, 42, 9, "x"); !errors.Is(err, pgcoord.ErrInvalidArgument) {
			t.Errorf("Exec on %#v = %v, want ErrInvalidArgument", db, err)
		}
	}
}
