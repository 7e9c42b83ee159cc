package listen

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgcoord/pgcoord/internal/pgtest"
)

// Behind a transaction-mode pooler a waiter on a channel only sleeps: the notifier finds
// the pooler on the connection it takes, gives it back without LISTENing (no server
// session ever runs the LISTEN) and remembers the pool, so the next waiter takes no
// connection at all.
func TestBehindAPoolerWaitersOnlySleep(t *testing.T) {
	pgtest.NeedsPooler(t)
	ctx := context.Background()
	pool, schema := pgtest.Schema(t)
	channel := "listen_" + schema
	if Pooled(pool) {
		t.Fatal("a new pool is taken for pooled before any wait")
	}
	w, err := New(ctx, pool, channel, "")
	if err != nil {
		t.Fatalf("New behind the pooler: %v, want a waiter that sleeps", err)
	}
	defer w.Close()
	if w.Listening() || !Pooled(pool) {
		t.Fatalf("behind the pooler: Listening() = %v, Pooled = %v; want false, true", w.Listening(), Pooled(pool))
	}
	acquired := pool.Stat().AcquireCount()
	w2, err := New(ctx, pool, channel, "")
	if err != nil || w2.Listening() {
		t.Fatalf("second waiter: listening %v, %v", w2 != nil && w2.Listening(), err)
	}
	defer w2.Close()
	if n := pool.Stat().AcquireCount(); n != acquired {
		t.Errorf("the second waiter took %d connections; a pool found pooled needs none", n-acquired)
	}
	// It sleeps its whole timeout: no notification reaches it.
	start := time.Now()
	if _, err := pool.Exec(ctx, "SELECT pg_notify($1, '')", channel); err != nil {
		t.Fatal(err)
	}
	if err := w.Wait(ctx, 100*time.Millisecond); err != nil || time.Since(start) < 100*time.Millisecond {
		t.Errorf("Wait = %v after %v; want the whole 100ms", err, time.Since(start))
	}
	// No server session ever LISTENed on the channel.
	var listens int
	direct := pgtest.Direct(t, pool)
	if err := direct.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE query = $1`,
		"LISTEN "+pgx.Identifier{channel}.Sanitize()).Scan(&listens); err != nil {
		t.Fatal(err)
	}
	if listens != 0 {
		t.Errorf("%d server sessions LISTENed through the pooler", listens)
	}
}
