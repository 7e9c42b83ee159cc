package pgcoord_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgcoord/pgcoord/internal/pgtest"
)

// A schema that has issued its whole budget of 2^44 tokens refuses to grant, loudly,
// rather than issue a token in the range of the next timeline (see pgcoord_token_floor).
func TestTokenBudgetSpentRefusesGrants(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	ctx := context.Background()
	var last int64
	if err := pool.QueryRow(ctx, `SELECT fence_token FROM pgcoord_lease_acquire('a', 'h', '1 minute')`).Scan(&last); err != nil {
		t.Fatal(err)
	}
	mustExec(t, pool, `SELECT setval('pgcoord_token_seq', (1::bigint << 44) - 2)`)
	if err := pool.QueryRow(ctx, `SELECT fence_token FROM pgcoord_lease_acquire('b', 'h', '1 minute')`).Scan(&last); err != nil {
		t.Fatal(err)
	}
	var floor int64
	if err := pool.QueryRow(ctx, `SELECT pgcoord_token_floor()`).Scan(&floor); err != nil {
		t.Fatal(err)
	}
	if last != floor+1<<44-1 {
		t.Fatalf("the last token of the budget is %d, want %d", last, floor+1<<44-1)
	}
	_, err := pool.Exec(ctx, `SELECT pgcoord_lease_acquire('c', 'h', '1 minute')`)
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "2200H" {
		t.Fatalf("a grant past the budget: %v, want SQLSTATE 2200H (sequence_generator_limit_exceeded)", err)
	}
	var held int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pgcoord_leases WHERE name = 'c'`).Scan(&held); err != nil || held != 0 {
		t.Fatalf("the refused grant left %d rows (%v)", held, err)
	}
}
