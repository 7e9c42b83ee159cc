package listen

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"weak"

	"github.com/jackc/pgx/v5/pgxpool"
)

// A transaction-mode pooler (PgBouncer and its kin) delivers no notification to a client
// and leaves a LISTEN on a server connection that other clients then share, which some
// versions do not survive (PgBouncer 1.18 can exit with "server in bad state" when a
// notification reaches a server connection in the wrong state). So the notifier checks
// each connection it takes before its first LISTEN: through a pooler the server's
// pg_backend_pid() differs from the process id the connection was given at startup. A pool
// found so is remembered and its waiters only sleep, as with NoListen.

// errPooled is the notifier's answer to subscribers of a pool that goes through a pooler.
var errPooled = errors.New("listen: the pool goes through a transaction pooler: not listening")

// pooled holds the pools found behind a pooler, weakly, so that a closed and forgotten
// pool leaves nothing behind.
var pooled sync.Map // weak.Pointer[pgxpool.Pool] → struct{}

// Pooled reports whether pool was found to go through a transaction pooler, where waiting
// calls poll instead of listening.
func Pooled(pool *pgxpool.Pool) bool {
	_, ok := pooled.Load(weak.Make(pool))
	return ok
}

func markPooled(pool *pgxpool.Pool) {
	k := weak.Make(pool)
	if _, loaded := pooled.LoadOrStore(k, struct{}{}); !loaded {
		runtime.AddCleanup(pool, func(k weak.Pointer[pgxpool.Pool]) { pooled.Delete(k) }, k)
	}
}

// behindPooler reports whether c's server session is not the one the connection was given
// at startup: a pooler stands between.
func behindPooler(ctx context.Context, c *pgxpool.Conn) (bool, error) {
	var pid uint32
	if err := c.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		return false, err
	}
	return pid != c.Conn().PgConn().PID(), nil
}
