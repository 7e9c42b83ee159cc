package bench

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/idempotency"
	"github.com/pgcoord/pgcoord/internal/pgconfig"
	"github.com/pgcoord/pgcoord/leases"
	"github.com/pgcoord/pgcoord/pgcoord"
	"github.com/pgcoord/pgcoord/semaphore"
)

// The scale scenarios measure how an operation's cost grows with the data beside it: the
// same operation at several sizes (tenants with demand, rows in the leases or idempotency
// table), each size in a schema of its own (loaded once, in Setup), the smallest size being
// the floor of the others. A ratio of 0.5 at 10k tenants means an operation there runs at
// half the rate it runs at with 10. They load up to a million rows each, so the default
// run leaves them out: `pgcoord bench --scale` runs them (ScalePrefix).

// ScalePrefix starts the name of every scale scenario.
const ScalePrefix = "scale."

// scaleDivisor divides the rows every scale scenario loads: 1 in production; tests raise it
// to run the scenarios on small tables.
var scaleDivisor = 1

// scaled is n rows divided by scaleDivisor, at least 1 unless n is 0.
func scaled(n int) int {
	if n == 0 {
		return 0
	}
	return max(1, n/scaleDivisor)
}

// scaleFamily is one operation measured at several sizes.
type scaleFamily struct {
	name string
	what string // the description of one operation, without its size
	unit string // what a size counts
	// unitOf, if set, says what size n counts, in place of unit.
	unitOf func(n int) string
	sizes  []int // smallest first
	// load fills the size's schema (pool's search_path) with n units.
	load func(ctx context.Context, pool *pgxpool.Pool, n int) error
	// newOp returns one worker's operation with n units loaded; it runs on pool, the
	// worker's connection to the size's schema.
	newOp func(w Worker, n int) scaleOp
	// conns, if set, is how many connections the worker's pool holds at size n (1 if not).
	conns func(n int) int
	// maxConcurrency, if set, is the Scenario's MaxConcurrency.
	maxConcurrency int
	// unscaled sizes are left as they are by scaleDivisor: they count no rows (relays), or
	// the family scales what it loads itself (partition_rebalance).
	unscaled bool
}

// scaleOp is one operation of a scale scenario, on the worker's pool of its size's schema.
type scaleOp func(ctx context.Context, pool *pgxpool.Pool) error

func init() {
	for _, f := range []scaleFamily{
		{
			name: "next", unit: "tenants with demand", sizes: []int{10, 1000, 10000},
			what: "semaphore.Next (fair admission across every key) then Release",
			load: loadTenants, newOp: newScaleNextOp,
		},
		{
			name: "add_demand", unit: "tenants", sizes: []int{10, 1000, 10000},
			what: "semaphore.AddDemand(+1) on a tenant (each worker its own), autocommit",
			load: loadTenants, newOp: newScaleAddDemandOp,
		},
		{
			name: "leases", unit: "lease rows", sizes: []int{1000, 100000, 1000000},
			what: "leases.TryAcquire then Release of a lease per worker, beside other (free) leases",
			load: loadLeases, newOp: newScaleLeaseOp,
		},
		{
			name: "idempotency", unit: "stored keys", sizes: []int{0, 1000000},
			what: "idempotency.Begin of a new key then Complete, beside completed keys",
			load: loadIdempotencyKeys, newOp: newScaleIdempotencyOp,
		},
		{
			name: "relays", unit: "relays", sizes: []int{1, 2, 4, 8}, unscaled: true, maxConcurrency: 1,
			what: fmt.Sprintf("relays (claims of up to %d, a no-op handler) together deliver at least %d messages of a "+
				"standing backlog of %d over %d keys, then as many are written behind it: ops/s is messages/s, "+
				"latency is per op",
				scaleRelayBatch, scaleRelayOpMessages, scaleRelayBacklog, scaleRelayKeys),
			load: loadRelayBacklog, newOp: newScaleRelaysOp, conns: func(n int) int { return n },
		},
		{
			name: "outbox_drain", unit: "delivered messages not yet pruned", sizes: []int{0, 1000000},
			what: fmt.Sprintf("an EnqueueBatch of %d messages, then the worker's relay delivers them (as outbox.throughput), "+
				"beside delivered messages of the same topic: ops/s x %d is messages/s", OutboxBatchMessages, OutboxBatchMessages),
			load: loadDeliveredMessages, newOp: newEnqueueDeliverOp("scale.outbox_drain", scaleDrainTopic),
		},
		{
			name: "outbox_parked", unit: "keys parked behind a delayed message", sizes: []int{0, 1000, 10000},
			what: fmt.Sprintf("an EnqueueBatch of %d messages, then the worker's relay delivers them (as outbox.throughput), "+
				"beside keys of the same topic whose one message is due in a day: ops/s x %d is messages/s",
				OutboxBatchMessages, OutboxBatchMessages),
			load: loadParkedKeys, newOp: newEnqueueDeliverOp("scale.outbox_parked", scaleParkedTopic),
		},
	} {
		f.register()
	}
}

// sizeLabel names a size: 10, 1k, 10k, 1m.
func sizeLabel(n int) string {
	switch {
	case n >= 1000000 && n%1000000 == 0:
		return strconv.Itoa(n/1000000) + "m"
	case n >= 1000 && n%1000 == 0:
		return strconv.Itoa(n/1000) + "k"
	}
	return strconv.Itoa(n)
}

func (f scaleFamily) scenarioName(n int) string {
	return ScalePrefix + f.name + "." + sizeLabel(n)
}

func (f scaleFamily) register() {
	for i, n := range f.sizes {
		floor := f.scenarioName(f.sizes[0])
		if i == 0 {
			floor = "floor.select1"
		}
		schemaSuffix := strings.ReplaceAll(strings.TrimPrefix(f.scenarioName(n), ScalePrefix), ".", "_")
		pools := &workerPools{what: f.scenarioName(n), schemaSuffix: schemaSuffix}
		if f.conns != nil {
			pools.conns = int32(f.conns(n))
		}
		// Computed when used: tests set scaleDivisor in an init function of their own.
		size := func() int {
			if f.unscaled {
				return n
			}
			return scaled(n)
		}
		unit := f.unit
		if f.unitOf != nil {
			unit = f.unitOf(n)
		}
		Register(Scenario{
			Name:           f.scenarioName(n),
			Description:    fmt.Sprintf("%s, with %d %s", f.what, n, unit),
			Floor:          floor,
			MaxConcurrency: f.maxConcurrency,
			Setup: func(ctx context.Context, pool *pgxpool.Pool) error {
				sp, err := sizeSchema(ctx, pool, schemaSuffix)
				if err != nil {
					return err
				}
				defer sp.Close()
				return f.load(ctx, sp, size())
			},
			NewWorker: func(ctx context.Context, w Worker) (Op, error) {
				wp, err := pools.poolFor(ctx, w)
				if err != nil {
					return nil, err
				}
				op := f.newOp(w, size())
				return func(ctx context.Context) error {
					p, err := wp.use() // reopened if it closed, idle, between measurements
					if err != nil {
						return err
					}
					defer wp.done()
					return op(ctx, p)
				}, nil
			},
		})
	}
}

// sizeSchema creates the schema of one size — named after the bench schema, so that Run
// drops it with the bench schema — migrates pgcoord into it and returns a pool on it.
func sizeSchema(ctx context.Context, pool *pgxpool.Pool, suffix string) (*pgxpool.Pool, error) {
	var bench string
	if err := pool.QueryRow(ctx, `SELECT current_schema()`).Scan(&bench); err != nil {
		return nil, err
	}
	schema := bench + "_" + suffix
	if _, err := pool.Exec(ctx, "CREATE SCHEMA "+pgconfig.QuoteIdent(schema)); err != nil {
		return nil, fmt.Errorf("create schema %s: %w", schema, err)
	}
	cfg := pool.Config()
	cfg.ConnConfig.RuntimeParams["search_path"] = pgconfig.QuoteIdent(schema)
	cfg.MaxConns = 2
	sp, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if _, err := pgcoord.Migrate(ctx, sp, nil); err != nil {
		sp.Close()
		return nil, fmt.Errorf("migrate schema %s: %w", schema, err)
	}
	return sp, nil
}

// loadRows runs one loading statement and analyzes the table it filled, as autovacuum would
// before long.
func loadRows(ctx context.Context, pool *pgxpool.Pool, table, sql string, args ...any) error {
	if _, err := pool.Exec(ctx, sql, args...); err != nil {
		return fmt.Errorf("load %s: %w", table, err)
	}
	_, err := pool.Exec(ctx, "ANALYZE "+table)
	return err
}

// loadTenants creates n tenants with demand that never runs out and a limit never reached,
// each served once already (so AddDemand's search for the key served last has them all).
func loadTenants(ctx context.Context, pool *pgxpool.Pool, n int) error {
	return loadRows(ctx, pool, "pgcoord_semaphores", `
		INSERT INTO pgcoord_semaphores (key, permit_limit, demand, vtime, served_at)
		SELECT 'tenant-' || g, 1000000, 1000000000000, random(), pgcoord_now() - g * interval '1 ms'
		  FROM generate_series(1, $1::int) g`, n)
}

func newScaleNextOp(Worker, int) scaleOp {
	return func(ctx context.Context, pool *pgxpool.Pool) error {
		p, err := semaphore.Next(ctx, pool, time.Minute, nil)
		if err != nil {
			return fmt.Errorf("bench: scale.next: %w", err)
		}
		return semaphore.Release(ctx, pool, p)
	}
}

func newScaleAddDemandOp(w Worker, n int) scaleOp {
	// The worker's tenants: those whose number is its ID modulo the concurrency, so that
	// workers never wait for each other's row lock (with fewer tenants than workers, one
	// tenant of its own, made here).
	var mine []string
	for g := w.ID + 1; g <= n; g += w.Concurrency {
		mine = append(mine, "tenant-"+strconv.Itoa(g))
	}
	if len(mine) == 0 {
		mine = []string{"tenant-w" + strconv.Itoa(w.ID)}
	}
	var i int
	return func(ctx context.Context, pool *pgxpool.Pool) error {
		i++
		return semaphore.AddDemand(ctx, pool, mine[i%len(mine)], 1, nil)
	}
}

// loadLeases creates n free leases (released, as most rows of a busy leases table are).
func loadLeases(ctx context.Context, pool *pgxpool.Pool, n int) error {
	return loadRows(ctx, pool, "pgcoord_leases", `
		INSERT INTO pgcoord_leases (name, fence_token, acquired_at, released_at)
		SELECT 'job/' || g, g, pgcoord_now(), pgcoord_now() FROM generate_series(1, $1::int) g`, n)
}

func newScaleLeaseOp(w Worker, _ int) scaleOp {
	name := "scale/" + strconv.Itoa(w.ID)
	return func(ctx context.Context, pool *pgxpool.Pool) error {
		l, err := leases.TryAcquire(ctx, pool, name, time.Minute, nil)
		if err != nil {
			return fmt.Errorf("bench: scale.leases: %w", err)
		}
		return leases.Release(ctx, pool, l, nil)
	}
}

// loadIdempotencyKeys stores n completed keys.
func loadIdempotencyKeys(ctx context.Context, pool *pgxpool.Pool, n int) error {
	return loadRows(ctx, pool, "pgcoord_idempotency_keys", `
		INSERT INTO pgcoord_idempotency_keys (scope, key, fingerprint, state, holder, status, headers, body,
		                                      created_at, updated_at, completed_at, expires_at)
		SELECT 'bench', 'stored-' || g, '\x01', 'completed', 'bench', 201, '{}', '{"order":1}',
		       pgcoord_now(), pgcoord_now(), pgcoord_now(), pgcoord_now() + interval '1 day'
		  FROM generate_series(1, $1::int) g`, n)
}

func newScaleIdempotencyOp(Worker, int) scaleOp {
	next := freshKeys()
	return func(ctx context.Context, pool *pgxpool.Pool) error {
		key := next()
		a, err := idempotency.Begin(ctx, pool, "bench", key, []byte(key), nil)
		if err != nil {
			return fmt.Errorf("bench: scale.idempotency: %w", err)
		}
		defer a.Close(ctx)
		if a.Replay() != nil {
			return fmt.Errorf("bench: scale.idempotency: the fresh key %q was already used", key)
		}
		return a.Complete(ctx, idempotency.Response{Status: 201, Body: []byte(`{"order":1}`)})
	}
}
