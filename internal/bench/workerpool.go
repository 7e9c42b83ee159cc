package bench

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/internal/pgconfig"
)

// workerPoolIdle is how long a worker pool stays open without use.
const workerPoolIdle = 2 * time.Second

// workerPools are the worker pools of one kind: one per worker connection, all made
// alike. A scenario whose API takes a pool (singleton.RunOnce) or that needs a second
// session (leases.handoff) keeps a kind of its own.
type workerPools struct {
	what   string                                     // names the pools in errors
	tracer func(next pgx.QueryTracer) pgx.QueryTracer // wraps the connection's tracer, if set
	// schemaSuffix, if set, makes the pools' search_path the schema named by the bench
	// schema, "_" and it (a scale scenario's size) instead of the bench schema.
	schemaSuffix string
	// conns, if set, is how many connections each pool holds (1 by default).
	conns int32

	mu sync.Mutex
	m  map[*pgx.Conn]*workerPool
}

// workerPool is a worker's extra pool (of one connection unless its kind says more), opened from its connection's
// config. Workers have no end-of-measurement hook: the pool closes itself once idle for
// workerPoolIdle, and reopens when the worker uses it again.
type workerPool struct {
	kind *workerPools
	cfg  *pgxpool.Config
	key  *pgx.Conn

	mu       sync.Mutex
	pool     *pgxpool.Pool // nil when closed
	users    int           // ops and waiters using pool now
	lastUsed time.Time
}

// poolFor returns the pool of w's connection, creating it (and its connection) if needed.
func (k *workerPools) poolFor(ctx context.Context, w Worker) (*workerPool, error) {
	key := w.Conn.Conn()
	k.mu.Lock()
	wp, ok := k.m[key]
	if !ok {
		cfg, err := connPoolConfig(key)
		if err != nil {
			k.mu.Unlock()
			return nil, fmt.Errorf("bench: %s: %w", k.what, err)
		}
		cc := cfg.ConnConfig
		if k.tracer != nil {
			cc.Tracer = k.tracer(cc.Tracer)
		}
		if k.schemaSuffix != "" {
			var bench string
			if err := w.Conn.QueryRow(ctx, `SELECT current_schema()`).Scan(&bench); err != nil {
				k.mu.Unlock()
				return nil, fmt.Errorf("bench: %s: %w", k.what, err)
			}
			cc.RuntimeParams["search_path"] = pgconfig.QuoteIdent(bench + "_" + k.schemaSuffix)
		}
		cfg.MaxConns, cfg.MinConns = max(1, k.conns), 0
		wp = &workerPool{kind: k, cfg: cfg, key: key}
		if k.m == nil {
			k.m = map[*pgx.Conn]*workerPool{}
		}
		k.m[key] = wp
	}
	k.mu.Unlock()
	// Open and connect now, every connection, so that no measured op pays for connecting.
	p, err := wp.use()
	if err != nil {
		return nil, err
	}
	defer wp.done()
	conns := make([]*pgxpool.Conn, 0, p.Config().MaxConns)
	defer func() {
		for _, c := range conns {
			c.Release()
		}
	}()
	for range p.Config().MaxConns {
		c, err := p.Acquire(ctx)
		if err != nil {
			return nil, fmt.Errorf("bench: %s: %w", k.what, err)
		}
		conns = append(conns, c)
	}
	return wp, nil
}

// use returns the open pool, reopening it if it was closed for idleness; call done after.
func (wp *workerPool) use() (*pgxpool.Pool, error) {
	wp.mu.Lock()
	defer wp.mu.Unlock()
	if wp.pool == nil {
		p, err := pgxpool.NewWithConfig(context.Background(), wp.cfg)
		if err != nil {
			return nil, fmt.Errorf("bench: %s: %w", wp.kind.what, err)
		}
		wp.pool = p
		go wp.closeWhenIdle()
	}
	wp.users++
	wp.lastUsed = time.Now()
	return wp.pool, nil
}

func (wp *workerPool) done() {
	wp.mu.Lock()
	defer wp.mu.Unlock()
	wp.users--
	wp.lastUsed = time.Now()
}

// closeWhenIdle closes the pool once nobody has used it for workerPoolIdle.
func (wp *workerPool) closeWhenIdle() {
	tick := time.NewTicker(workerPoolIdle / 4)
	defer tick.Stop()
	for range tick.C {
		wp.mu.Lock()
		if wp.users > 0 || time.Since(wp.lastUsed) < workerPoolIdle {
			wp.mu.Unlock()
			continue
		}
		p := wp.pool
		wp.pool = nil
		wp.mu.Unlock()
		k := wp.kind
		k.mu.Lock()
		if k.m[wp.key] == wp { // a worker still holding wp reopens it
			delete(k.m, wp.key)
		}
		k.mu.Unlock()
		p.Close()
		return
	}
}

// connPoolConfig returns the config of a pool of connections like conn: its search_path,
// application_name and all.
func connPoolConfig(conn *pgx.Conn) (*pgxpool.Config, error) {
	cc := conn.Config() // a copy
	cfg, err := pgxpool.ParseConfig(cc.ConnString())
	if err != nil {
		return nil, err
	}
	// The copy still delivers notifications to conn's buffer (pgx sets OnNotification only
	// when it is nil): let the pool's connections buffer their own.
	cc.OnNotification = nil
	cfg.ConnConfig = cc
	return cfg, nil
}
