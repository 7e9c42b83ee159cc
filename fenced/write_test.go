package fenced_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/fenced"
	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/pgcoord"
)

// Write checks and writes in one round trip: an accepted token writes, a stale one writes
// nothing — the statement after the check never runs — and leaves the register as it was.
var ctx = context.Background()

func TestWriteRunsTheStatementOnlyForACurrentToken(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	if _, err := pool.Exec(ctx, `CREATE TABLE ledger (id serial PRIMARY KEY, token bigint NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	write := func(token int64) error {
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			tag, err := fenced.Write(ctx, tx, "ledger", token, `INSERT INTO ledger (token) VALUES ($1)`, token)
			if err == nil && tag.RowsAffected() != 1 {
				t.Errorf("token %d: tag %v", token, tag)
			}
			return err
		})
	}
	for _, token := range []int64{3, 3, 5} {
		if err := write(token); err != nil {
			t.Fatalf("token %d: %v", token, err)
		}
	}
	if err := write(4); !errors.Is(err, fenced.ErrStale) {
		t.Fatalf("stale token 4 after 5: %v, want ErrStale", err)
	}
	var rows, highest int64
	if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM ledger), (SELECT fence_token FROM pgcoord_fences WHERE resource = 'ledger')`).Scan(&rows, &highest); err != nil {
		t.Fatal(err)
	}
	if rows != 3 || highest != 5 {
		t.Fatalf("after writes 3, 3, 5 and a refused 4: %d rows, register %d; want 3 rows, 5", rows, highest)
	}
	// An error of the write itself is not a stale token.
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := fenced.Write(ctx, tx, "ledger", 6, `INSERT INTO no_such_table VALUES (1)`)
		return err
	})
	if err == nil || errors.Is(err, fenced.ErrStale) {
		t.Fatalf("a failing statement: %v, want its own error", err)
	}
}

func TestWriteRejectsBadInputBeforeSQL(t *testing.T) {
	t.Parallel()
	var nilTx *pgxpool.Tx
	if _, err := fenced.Write(ctx, nilTx, "r", 1, `SELECT 1`); !errors.Is(err, pgcoord.ErrInvalidArgument) {
		t.Errorf("typed nil tx: %v", err)
	}
	if _, err := fenced.Write(ctx, nil, "", 1, `SELECT 1`); !errors.Is(err, pgcoord.ErrInvalidName) {
		t.Errorf("empty resource: %v", err)
	}
	if err := fenced.Check(ctx, nilTx, "r", 1); !errors.Is(err, pgcoord.ErrInvalidArgument) {
		t.Errorf("Check with a typed nil tx: %v", err)
	}
}
