package idempotency_test

import (
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/idempotency"
	"github.com/pgcoord/pgcoord/internal/pgtest"
)

// The budget: in Atomic mode a new key costs at most one round trip more than the
// bare handler (the handler's own BEGIN and COMMIT are the attempt's) once the connection
// has had an Atomic attempt; a replay costs one. Counted, not timed: the bench shows what
// they cost.
func TestRoundTripBudget(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	cfg := pgtest.Pool(t).Config()
	rt := &pgtest.RoundTrips{}
	cfg.ConnConfig.Tracer = rt
	cfg.MaxConns = 4 // two Atomic attempts at once (half), and the non-atomic handler's
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
		before := rt.N()
		if err := f(); err != nil {
			t.Fatal(err)
		}
		return rt.N() - before
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
	// Both connections have an Atomic attempt first (the one that gets the connection its
	// pgx.Tx pays a round trip more).
	var warm []*idempotency.Attempt
	for i := range 2 {
		a, err := idempotency.Begin(ctx, pool, "rt", fmt.Sprint("warm-", i), fp, &idempotency.BeginOpts{Atomic: true})
		if err != nil {
			t.Fatal(err)
		}
		warm = append(warm, a)
	}
	for _, a := range warm {
		a.Close(ctx)
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
		if nAtomic > nBare+1 || nPlain > nBare+3 || nReplay != 1 {
			t.Errorf("round trips: bare %d, atomic new key %d (budget %d), non-atomic %d (budget %d), replay %d (budget 1)",
				nBare, nAtomic, nBare+1, nPlain, nBare+3, nReplay)
		}
	}
}
