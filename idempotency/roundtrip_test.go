package idempotency_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/idempotency"
	"github.com/pgcoord/pgcoord/internal/pgtest"
)

// The budget: a new key costs one round trip before its handler (the claim) and, in
// Atomic mode, nothing after it (the response is stored with the handler's commit): an
// Atomic new key costs what the bare handler does (its BEGIN rides with the claim), once
// the connection has had an Atomic attempt; a non-Atomic one costs the claim and the
// stored response beside the handler. A replay costs one. Counted, not timed: the bench
// shows what they cost.
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
		if nAtomic > nBare || nPlain > nBare+2 || nReplay != 1 {
			t.Errorf("round trips: bare %d, atomic new key %d (budget %d), non-atomic %d (budget %d), replay %d (budget 1)",
				nBare, nAtomic, nBare, nPlain, nBare+2, nReplay)
		}
	}
}

// rollbackGate is a pgx tracer that holds every batch that starts with ROLLBACK until
// released: what a caller does not wait for goes on while it is held.
type rollbackGate struct {
	pgtest.RoundTrips
	held    chan struct{} // one per held batch
	release chan struct{}
}

func (g *rollbackGate) TraceBatchStart(ctx context.Context, c *pgx.Conn, d pgx.TraceBatchStartData) context.Context {
	if qs := d.Batch.QueuedQueries; len(qs) > 0 && qs[0].SQL == "ROLLBACK" {
		g.held <- struct{}{}
		<-g.release
	}
	return g.RoundTrips.TraceBatchStart(ctx, c, d)
}

// A replay in Atomic mode costs its caller one round trip too: the claim comes back with
// the stored response (the handler's transaction, begun with it, is rolled back after
// Begin has returned: here Begin returns while that rollback is held back), and the claim
// wrote nothing — the completed key's row is not even locked (its xmax is unchanged).
func TestAtomicReplayIsOneRoundTripAndWritesNothing(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	cfg := pgtest.Pool(t).Config()
	g := &rollbackGate{held: make(chan struct{}, 10), release: make(chan struct{})}
	cfg.ConnConfig.Tracer = g
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	atomic := &idempotency.BeginOpts{Atomic: true}
	a, err := idempotency.Begin(ctx, pool, "rt", "k", fp, atomic)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Complete(ctx, idempotency.Response{Status: 201, Body: []byte("{}")}); err != nil {
		t.Fatal(err)
	}
	xmax := func() (x string) {
		t.Helper()
		if err := pool.QueryRow(ctx, `SELECT xmax::text FROM pgcoord_idempotency_keys WHERE scope = 'rt' AND key = 'k'`).Scan(&x); err != nil {
			t.Fatal(err)
		}
		return x
	}
	before := xmax()
	for i := range 3 {
		n := g.N()
		r, err := idempotency.Begin(ctx, pool, "rt", "k", fp, atomic)
		if err != nil || r.Replay() == nil {
			t.Fatalf("replay %d: %v, %+v", i, err, r)
		}
		if sent := g.N() - n; sent != 1 {
			t.Errorf("replay %d: Begin waited for %d round trips, want 1", i, sent)
		}
		<-g.held // its rollback, sent after Begin returned
		g.release <- struct{}{}
		// The connection back in the pool before the next replay, which then reuses it
		// (a new one would pay for its setup).
		for pool.Stat().AcquiredConns() > 0 {
			time.Sleep(time.Millisecond)
		}
	}
	if after := xmax(); after != before {
		t.Errorf("the completed key's row was locked or written by a replay: xmax %s, then %s", before, after)
	}
}
