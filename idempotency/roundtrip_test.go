package idempotency_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/idempotency"
	"github.com/pgcoord/pgcoord/internal/pgtest"
)

// roundTrips counts the statements and batches a pool sends: each is one round trip once
// its prepared statements are cached (a pipelined batch is one, whatever it holds).
type roundTrips struct{ n atomic.Int64 }

func (c *roundTrips) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	return ctx
}
func (*roundTrips) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (c *roundTrips) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	c.n.Add(1)
	return ctx
}
func (*roundTrips) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (*roundTrips) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}

// The budget: a new key costs at most two round trips more than the bare handler
// (in Atomic mode the handler's own BEGIN and COMMIT are the attempt's), and a replay one.
// Counted, not timed: the bench shows what they cost.
func TestRoundTripBudget(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	cfg := pgtest.Pool(t).Config()
	rt := &roundTrips{}
	cfg.ConnConfig.Tracer = rt
	cfg.MaxConns = 2 // the attempt's connection, and the non-atomic handler's
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	exec(t, pool, `CREATE TABLE orders (id serial PRIMARY KEY)`)
	handler := func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO orders DEFAULT VALUES`)
		return err
	}
	count := func(f func() error) int64 {
		t.Helper()
		before := rt.n.Load()
		if err := f(); err != nil {
			t.Fatal(err)
		}
		return rt.n.Load() - before
	}
	bare := func() error { return pgx.BeginFunc(ctx, pool, handler) }
	first := func(atomic bool, key string) func() error {
		return func() error {
			a, err := idempotency.Begin(ctx, pool, "rt", key, fp, &idempotency.BeginOpts{Atomic: atomic})
			if err != nil {
				return err
			}
			defer a.Close(ctx)
			if atomic {
				if err := handler(a.Tx()); err != nil {
					return err
				}
			} else if err := bare(); err != nil {
				return err
			}
			return a.Complete(ctx, idempotency.Response{Status: 201, Body: []byte("{}")})
		}
	}
	replay := func(key string) func() error {
		return func() error {
			a, err := idempotency.Begin(ctx, pool, "rt", key, fp, nil)
			if err == nil && a.Replay() == nil {
				err = fmt.Errorf("%s was not replayed", key)
			}
			return err
		}
	}
	for i := range 4 { // the first rounds warm both connections' statement caches
		nBare := count(bare)
		nAtomic := count(first(true, fmt.Sprint("atomic-", i)))
		nPlain := count(first(false, fmt.Sprint("plain-", i)))
		nReplay := count(replay(fmt.Sprint("atomic-", i)))
		if i < 3 {
			continue
		}
		t.Logf("round trips: bare handler %d, new key atomic %d, new key non-atomic %d (with a handler of %d), replay %d",
			nBare, nAtomic, nPlain, nBare, nReplay)
		if nAtomic > nBare+2 || nPlain > nBare+3 || nReplay != 1 {
			t.Errorf("round trips: bare %d, atomic new key %d (budget %d), non-atomic %d (budget %d), replay %d (budget 1)",
				nBare, nAtomic, nBare+2, nPlain, nBare+3, nReplay)
		}
	}
}
