package dedupe_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/internal/pgconfig"
	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/pgcoord"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// waitLimit bounds every wait for a condition in these tests.
const waitLimit = 15 * time.Second

// newDB is pgtest.Pool with a pool of up to n connections.
func newDB(t *testing.T, n int32) *pgxpool.Pool {
	t.Helper()
	_, schema := pgtest.Schema(t)
	cfg, err := pgconfig.Pool(pgtest.URL(t), pgconfig.Options{AppName: "pgcoord-test", Schema: schema, MaxConns: n})
	if err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if _, err := pgcoord.Migrate(t.Context(), pool, nil); err != nil {
		t.Fatal(err)
	}
	return pool
}

// exec runs sql on db and fails t on error.
func exec(t *testing.T, db pgcoord.DBTX, sql string, args ...any) {
	t.Helper()
	if _, err := db.Exec(t.Context(), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// queryInt64 runs a query returning one bigint and fails t on error.
func queryInt64(t *testing.T, db pgcoord.DBTX, sql string, args ...any) int64 {
	t.Helper()
	var n int64
	if err := db.QueryRow(t.Context(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

// begin starts a transaction on pool, rolled back when t ends if still open.
func begin(t *testing.T, pool *pgxpool.Pool, opts pgx.TxOptions) pgx.Tx {
	t.Helper()
	tx, err := pool.BeginTx(t.Context(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	return tx
}

// backendPID returns the server process id behind db (a connection or transaction).
func backendPID(t *testing.T, db pgcoord.DBTX) int32 {
	t.Helper()
	return int32(queryInt64(t, db, "SELECT pg_backend_pid()"))
}

// sqlState returns the SQLSTATE of the *pgconn.PgError in err's chain, or "".
func sqlState(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}

// noSQL is a pgx.Tx (and pgcoord.DBTX) on which any call panics: passing it proves that a
// function rejected its input before running any SQL.
type noSQL struct{ pgx.Tx }

// pending is the outcome of a call running in its own goroutine.
type pending[T any] struct {
	done chan struct{}
	val  T
	err  error
}

// async runs f in a new goroutine.
func async[T any](f func() (T, error)) *pending[T] {
	p := &pending[T]{done: make(chan struct{})}
	go func() {
		defer close(p.done)
		p.val, p.err = f()
	}()
	return p
}

// returned reports whether the call has returned.
func (p *pending[T]) returned() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// wait waits, at most waitLimit, for the call to return and returns its results.
func (p *pending[T]) wait(t *testing.T) (T, error) {
	t.Helper()
	select {
	case <-p.done:
		return p.val, p.err
	case <-time.After(waitLimit):
		t.Fatalf("the call did not return within %v", waitLimit)
		panic("unreachable")
	}
}

// waitBlocked waits, at most waitLimit, until the server process waiter waits for a lock
// held by the server process blocker, and fails t if the call p that waiter runs returns
// first: p must block until blocker's transaction ends.
func waitBlocked[T any](t *testing.T, pool *pgxpool.Pool, p *pending[T], waiter, blocker int32) {
	t.Helper()
	deadline := time.Now().Add(waitLimit)
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for {
		var blocked bool
		err := pool.QueryRow(t.Context(), `SELECT $2::int = ANY (pg_blocking_pids($1))`, waiter, blocker).Scan(&blocked)
		if err != nil {
			t.Fatalf("waiting for process %d to block: %v", waiter, err)
		}
		if p.returned() {
			t.Fatalf("the call returned (%v, %v) instead of waiting for process %d", p.val, p.err, blocker)
		}
		if blocked {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("process %d was not seen waiting for a lock of process %d within %v", waiter, blocker, waitLimit)
		}
		<-tick.C
	}
}
