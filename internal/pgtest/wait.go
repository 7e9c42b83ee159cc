package pgtest

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/pgcoord"
)

// WaitLimit bounds every wait for a condition in pgcoord's tests: long enough for a loaded
// CI machine, short enough that a hang fails the test instead of the whole run.
const WaitLimit = 15 * time.Second

// PoolMax is Pool with a pool of at most maxConns connections.
func PoolMax(t testing.TB, maxConns int32) *pgxpool.Pool {
	t.Helper()
	pool, schema := schemaPool(t, maxConns)
	migrate(t, pool, schema, nil)
	return pool
}

// BackendPID returns the server process behind db (a connection or a transaction).
func BackendPID(t testing.TB, db pgcoord.DBTX) int32 {
	t.Helper()
	var pid int32
	if err := db.QueryRow(context.Background(), "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		t.Fatal(err)
	}
	return pid
}

// Call is a call running in a goroutine of its own, so a test can check that it blocks.
type Call[T any] struct {
	done chan struct{}
	val  T
	err  error
}

// Go runs f in a new goroutine.
func Go[T any](f func() (T, error)) *Call[T] {
	c := &Call[T]{done: make(chan struct{})}
	go func() {
		defer close(c.done)
		c.val, c.err = f()
	}()
	return c
}

// Returned reports whether the call has returned.
func (c *Call[T]) Returned() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// Wait waits, at most WaitLimit, for the call to return and returns its results.
func (c *Call[T]) Wait(t testing.TB) (T, error) {
	t.Helper()
	select {
	case <-c.done:
		return c.val, c.err
	case <-time.After(WaitLimit):
		t.Fatalf("pgtest: the call did not return within %v", WaitLimit)
		panic("unreachable")
	}
}

// WaitBlocked waits, at most WaitLimit, until server process waiter waits for a lock held
// by server process blocker, and fails t if call — the call waiter runs — returns first:
// the call must block until blocker's transaction ends.
func WaitBlocked[T any](t testing.TB, pool *pgxpool.Pool, call *Call[T], waiter, blocker int32) {
	t.Helper()
	deadline := time.Now().Add(WaitLimit)
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for {
		var blocked bool
		var event string
		err := pool.QueryRow(context.Background(), `
			SELECT $2::int = ANY (pg_blocking_pids($1)), coalesce(wait_event_type, '')
			  FROM pg_stat_activity WHERE pid = $1`, waiter, blocker).Scan(&blocked, &event)
		if err != nil {
			t.Fatalf("pgtest: waiting for process %d to block: %v", waiter, err)
		}
		if blocked && event == "Lock" {
			if call.Returned() {
				t.Fatalf("pgtest: the call returned (%v, %v) although it was seen blocked", call.val, call.err)
			}
			return
		}
		if call.Returned() {
			t.Fatalf("pgtest: the call returned (%v, %v) instead of waiting for process %d", call.val, call.err, blocker)
		}
		if time.Now().After(deadline) {
			t.Fatalf("pgtest: process %d was not seen waiting for a lock of process %d within %v", waiter, blocker, WaitLimit)
		}
		<-tick.C
	}
}
