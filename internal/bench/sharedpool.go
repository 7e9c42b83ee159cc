package bench

import (
	"context"
	"fmt"
	"sync"

	"github.com/jackc/pgx/v5/pgxpool"
)

// sharedPools holds, per bench schema, a pool of up to MaxConcurrency connections that a
// scenario's workers share beside their own connections: for an API that runs on a pool
// (an outbox Relay), or whose concurrent calls on one pool the library coalesces
// (ratelimit.Allow on a hot key). Each is closed when the Run's context ends.
var sharedPools struct {
	sync.Mutex
	m map[string]*pgxpool.Pool
}

// setupSharedPool opens the shared pool of pool's schema, if it is not open: a Setup.
func setupSharedPool(ctx context.Context, pool *pgxpool.Pool) error {
	cfg := pool.Config().Copy()
	cfg.MaxConns = MaxConcurrency
	cfg.MinConns = 0
	schema := cfg.ConnConfig.RuntimeParams["search_path"]
	sharedPools.Lock()
	defer sharedPools.Unlock()
	if _, ok := sharedPools.m[schema]; ok {
		return nil
	}
	sp, err := pgxpool.NewWithConfig(context.WithoutCancel(ctx), cfg)
	if err != nil {
		return err
	}
	context.AfterFunc(ctx, func() {
		sp.Close()
		sharedPools.Lock()
		defer sharedPools.Unlock()
		delete(sharedPools.m, schema)
	})
	if sharedPools.m == nil {
		sharedPools.m = map[string]*pgxpool.Pool{}
	}
	sharedPools.m[schema] = sp
	return nil
}

// sharedPool returns the shared pool of w's schema.
func sharedPool(w Worker) (*pgxpool.Pool, error) {
	schema := w.Conn.Conn().Config().RuntimeParams["search_path"]
	sharedPools.Lock()
	defer sharedPools.Unlock()
	sp, ok := sharedPools.m[schema]
	if !ok {
		return nil, fmt.Errorf("no shared pool for schema %s (Setup did not run)", schema)
	}
	return sp, nil
}
