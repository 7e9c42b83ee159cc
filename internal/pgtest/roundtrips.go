package pgtest

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// TracedPool returns a pool of n connections whose statements rt counts, on a migrated
// schema of its own, and a plain pool (of n+2) on the same schema for the test's own
// queries. The traced pool's sessions are named "traced " + t.Name() in pg_stat_activity.
func TracedPool(t *testing.T, n int32, rt *RoundTrips) (traced, plain *pgxpool.Pool) {
	t.Helper()
	plain = PoolMax(t, n+2)
	cfg := plain.Config()
	cfg.ConnConfig.Tracer = rt
	cfg.ConnConfig.RuntimeParams["application_name"] = "traced " + t.Name()
	cfg.MaxConns = n
	traced, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(traced.Close)
	return traced, plain
}

// RoundTrips is a pgx.QueryTracer that counts the statements and batches its connections
// send: each is one round trip once its prepared statements are cached (a pipelined batch
// is one, whatever it holds). Set it as a ConnConfig's Tracer; count with N.
type RoundTrips struct{ n atomic.Int64 }

// N returns how many statements and batches were sent so far.
func (c *RoundTrips) N() int64 { return c.n.Load() }

func (c *RoundTrips) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	return ctx
}

func (*RoundTrips) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (c *RoundTrips) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	c.n.Add(1)
	return ctx
}

func (*RoundTrips) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}

func (*RoundTrips) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// KillOneActive terminates one backend of TracedPool(t, ...)'s sessions that is running a
// statement, chosen at random, through pool (another pool of the same database), and
// reports whether there was one.
func KillOneActive(t *testing.T, pool *pgxpool.Pool) bool {
	t.Helper()
	var killed bool
	if err := pool.QueryRow(t.Context(), `SELECT coalesce(bool_or(pg_terminate_backend(pid)), false) FROM (
		SELECT pid FROM pg_stat_activity WHERE application_name = $1 AND state = 'active'
		 ORDER BY random() LIMIT 1) s`, "traced "+t.Name()).Scan(&killed); err != nil {
		t.Fatal(err)
	}
	return killed
}

// LockWaiters counts the sessions named app (application_name) that wait for a lock,
// through pool.
func LockWaiters(t *testing.T, pool *pgxpool.Pool, app string) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(t.Context(), `SELECT count(*) FROM pg_stat_activity
		WHERE application_name = $1 AND wait_event_type = 'Lock'`, app).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}
