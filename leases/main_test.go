package leases_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/pgcoord"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func migrate(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	if _, err := pgcoord.Migrate(context.Background(), pool, nil); err != nil {
		t.Fatal(err)
	}
}
