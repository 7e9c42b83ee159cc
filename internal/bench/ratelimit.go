package bench

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/pgcoord"
	"github.com/pgcoord/pgcoord/ratelimit"
)

// The rate limit scenarios and their floors. The policies of allow, nested and hot_key admit
// far more than a bench can ask, so every call is admitted and charged: the measure is the
// cost of a decision. That of refuse admits one unit a day, charged when a worker starts,
// so every call is refused by the key's stored state: the measure is the cost of a refusal.
const (
	// FloorGCRA is ratelimit.allow's floor: one statement that upserts a key's theoretical
	// arrival time by GCRA into a table shaped like pgcoord_ratelimit_state (autocommit).
	FloorGCRA = "ratelimit.floor_gcra"
	// FloorGCRANested is ratelimit.nested's floor: three such upserts in one transaction.
	FloorGCRANested = "ratelimit.floor_gcra_nested"
	// FloorGCRAHot is ratelimit.hot_key's floor: the one-statement upsert, every worker on
	// one key.
	FloorGCRAHot = "ratelimit.floor_gcra_hot"
	// FloorGCRARefuse is ratelimit.refuse's floor: one autocommit SELECT of the worker's
	// key's row by primary key, computing the GCRA refusal from it.
	FloorGCRARefuse = "ratelimit.floor_gcra_refuse"
)

// benchPolicies are the scenarios' policies: a billion units a second, in bursts of a
// billion.
var benchPolicies = []string{"bench_key", "bench_tenant", "bench_global"}

// unloggedPolicy is ratelimit.unlogged's: the bench policies' limit, its keys unlogged.
var unloggedPolicy = ratelimit.Policy{Name: "bench_unlogged", Rate: 1_000_000_000, Period: time.Second, Burst: 1_000_000_000, Unlogged: true}

// refusePolicy is ratelimit.refuse's policy: one unit a day, in bursts of one. A key charged
// once is refused for a day.
var refusePolicy = ratelimit.Policy{Name: "bench_refuse", Rate: 1, Period: 24 * time.Hour, Burst: 1}

func init() {
	Register(Scenario{
		Name:        "ratelimit.allow",
		Description: "ratelimit.Allow of 1 unit on the worker's own key (autocommit)",
		Floor:       FloorGCRA,
		Setup:       setupRatelimit,
		NewWorker:   newAllowWorker(benchPolicies[0], 1, false),
	})
	Register(Scenario{
		Name:        "ratelimit.nested",
		Description: "ratelimit.Allow of 1 unit on three limits at once: the worker's key, its tenant (one per 4 workers), and a global key",
		Floor:       FloorGCRANested,
		Setup:       setupRatelimit,
		NewWorker:   newAllowWorker(benchPolicies[0], 3, false),
	})
	Register(Scenario{
		Name:        "ratelimit.unlogged",
		Description: "ratelimit.Allow of 1 unit on the worker's own key of an unlogged policy (its keys in an UNLOGGED table; autocommit)",
		Floor:       FloorGCRA,
		Setup:       setupRatelimit,
		NewWorker:   newAllowWorker(unloggedPolicy.Name, 1, false),
	})
	Register(Scenario{
		Name:        "ratelimit.hot_key",
		Description: "ratelimit.Allow of 1 unit, every worker on one key, through one pool the workers share (which coalesces their calls)",
		Floor:       FloorGCRAHot,
		Setup: func(ctx context.Context, pool *pgxpool.Pool) error {
			if err := setupRatelimit(ctx, pool); err != nil {
				return err
			}
			return setupSharedPool(ctx, pool)
		},
		NewWorker: newAllowWorker(benchPolicies[0], 1, true),
	})
	Register(Scenario{
		Name: "ratelimit.refuse",
		Description: "ratelimit.Allow of 1 unit on the worker's own key, refused by its stored state " +
			"(1 unit a day in bursts of 1, the key charged when the worker starts)",
		Floor:     FloorGCRARefuse,
		Setup:     setupRatelimit,
		NewWorker: newRefuseWorker,
	})
	Register(Scenario{
		Name:        FloorGCRA,
		Description: "raw SQL: one INSERT ... ON CONFLICT DO UPDATE of the worker's key's arrival time by GCRA, RETURNING it",
		Floor:       "floor.select1",
		Setup:       setupRatelimit,
		NewWorker:   newFloorGCRAWorker(1, false),
	})
	Register(Scenario{
		Name:        FloorGCRANested,
		Description: "raw SQL: BEGIN, the GCRA upsert of three keys (as ratelimit.nested's), COMMIT",
		Floor:       "floor.select1",
		Setup:       setupRatelimit,
		NewWorker:   newFloorGCRAWorker(3, false),
	})
	Register(Scenario{
		Name:        FloorGCRAHot,
		Description: "raw SQL: the GCRA upsert, every worker on one key",
		Floor:       "floor.select1",
		Setup:       setupRatelimit,
		NewWorker:   newFloorGCRAWorker(1, true),
	})
	Register(Scenario{
		Name: FloorGCRARefuse,
		Description: "raw SQL: one SELECT of the worker's key's row (charged when the worker starts) by primary key, " +
			"computing the GCRA refusal and its retry time (autocommit)",
		Floor:     "floor.select1",
		Setup:     setupRatelimit,
		NewWorker: newFloorRefuseWorker,
	})
}

// floorRatelimitTable is the floors' copy of pgcoord_ratelimit_state.
const floorRatelimitTable = "bench_floor_ratelimit"

func setupRatelimit(ctx context.Context, pool *pgxpool.Pool) error {
	for _, name := range benchPolicies {
		if _, err := ratelimit.Set(ctx, pool, ratelimit.Policy{Name: name, Rate: 1_000_000_000, Period: time.Second, Burst: 1_000_000_000}); err != nil {
			return err
		}
	}
	for _, p := range []ratelimit.Policy{refusePolicy, unloggedPolicy} {
		if _, err := ratelimit.Set(ctx, pool, p); err != nil {
			return err
		}
	}
	_, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+floorRatelimitTable+` (LIKE pgcoord_ratelimit_state INCLUDING ALL)`)
	return err
}

// benchLimits are the (policy, key) pairs a worker charges: its own key under policy; with
// three, also its tenant's (workers 0-3, 4-7, ...) and the global key; with hot, one key
// for all.
func benchLimits(w Worker, policy string, n int, hot bool) []ratelimit.Limit {
	key := "w" + strconv.Itoa(w.ID)
	if hot {
		key = "hot"
	}
	ls := []ratelimit.Limit{{Policy: policy, Key: key}}
	if n == 3 {
		ls = append(ls, ratelimit.Limit{Policy: benchPolicies[1], Key: "t" + strconv.Itoa(w.ID/4)},
			ratelimit.Limit{Policy: benchPolicies[2], Key: "all"})
	}
	return ls
}

func newAllowWorker(policy string, n int, hot bool) func(context.Context, Worker) (Op, error) {
	return func(_ context.Context, w Worker) (Op, error) {
		limits := benchLimits(w, policy, n, hot)
		var db pgcoord.DBTX = w.Conn
		if hot {
			sp, err := sharedPool(w)
			if err != nil {
				return nil, err
			}
			db = sp
		}
		return func(ctx context.Context) error {
			d, err := ratelimit.Allow(ctx, db, 1, limits, nil)
			if err != nil {
				return fmt.Errorf("bench: ratelimit.Allow: %w", err)
			}
			if !d.Allowed {
				return fmt.Errorf("bench: ratelimit.Allow refused by %s: the bench policies admit a billion a second", d.Policy)
			}
			return nil
		}, nil
	}
}

// floorGCRA is the GCRA charge of one unit at one microsecond a unit with a tolerance of
// a billion microseconds, on the floor's table: what pgcoord_ratelimit_take does for one
// pair, in one statement.
const floorGCRA = `INSERT INTO ` + floorRatelimitTable + ` AS s (policy, key, tat)
	VALUES ($1, $2, clock_timestamp() + interval '1 microsecond')
	ON CONFLICT (policy, key) DO UPDATE
	   SET tat = greatest(s.tat, clock_timestamp()) + interval '1 microsecond'
	 WHERE greatest(s.tat, clock_timestamp()) + interval '1 microsecond' - clock_timestamp() <= interval '1000 seconds'
	RETURNING s.tat`

func newFloorGCRAWorker(n int, hot bool) func(context.Context, Worker) (Op, error) {
	return func(_ context.Context, w Worker) (Op, error) {
		limits := benchLimits(w, benchPolicies[0], n, hot)
		charge := func(ctx context.Context, db interface {
			QueryRow(context.Context, string, ...any) pgx.Row
		}) error {
			for _, l := range limits {
				var tat time.Time
				if err := db.QueryRow(ctx, floorGCRA, l.Policy, l.Key).Scan(&tat); err != nil {
					return fmt.Errorf("bench: %s: %w", FloorGCRA, err)
				}
			}
			return nil
		}
		if n == 1 {
			return func(ctx context.Context) error { return charge(ctx, w.Conn) }, nil
		}
		return func(ctx context.Context) error {
			return pgx.BeginFunc(ctx, w.Conn, func(tx pgx.Tx) error { return charge(ctx, tx) })
		}, nil
	}
}

// refuseLimit is the worker's key under refusePolicy.
func refuseLimit(w Worker) ratelimit.Limit {
	return ratelimit.Limit{Policy: refusePolicy.Name, Key: "w" + strconv.Itoa(w.ID)}
}

// newRefuseWorker charges the worker's key once (admitted the first time the key is used,
// refused after: either way its stored state now refuses it for a day), then refuses.
func newRefuseWorker(ctx context.Context, w Worker) (Op, error) {
	limits := []ratelimit.Limit{refuseLimit(w)}
	if _, err := ratelimit.Allow(ctx, w.Conn, 1, limits, nil); err != nil {
		return nil, fmt.Errorf("bench: ratelimit.refuse: charge the key: %w", err)
	}
	return func(ctx context.Context) error {
		d, err := ratelimit.Allow(ctx, w.Conn, 1, limits, nil)
		if err != nil {
			return fmt.Errorf("bench: ratelimit.Allow: %w", err)
		}
		if d.Allowed || d.RetryAfter <= 0 {
			return fmt.Errorf("bench: ratelimit.refuse: %+v: the key was charged a unit of a day's one, it must be refused", d)
		}
		return nil
	}, nil
}

// floorRefuse reads a key's arrival time and judges a call of one unit on it by GCRA at
// one unit a day (T) in bursts of one (tau = T): admitted when max(tat, now) + T - tau <=
// now, else retry then. One autocommit statement that reads one row and writes nothing.
const floorRefuse = `SELECT b.base + interval '1 day' - interval '1 day' <= n.now AS admitted,
       b.base + interval '1 day' - interval '1 day' - n.now AS retry_after
  FROM ` + floorRatelimitTable + ` s
 CROSS JOIN LATERAL (SELECT clock_timestamp() AS now) n
 CROSS JOIN LATERAL (SELECT greatest(s.tat, n.now) AS base) b
 WHERE s.policy = $1 AND s.key = $2`

// floorCharge charges a key of the floor's table one unit a day, once: its arrival time a
// day ahead.
const floorCharge = `INSERT INTO ` + floorRatelimitTable + ` (policy, key, tat)
	VALUES ($1, $2, clock_timestamp() + interval '1 day')
	ON CONFLICT (policy, key) DO NOTHING`

func newFloorRefuseWorker(ctx context.Context, w Worker) (Op, error) {
	l := refuseLimit(w)
	if _, err := w.Conn.Exec(ctx, floorCharge, l.Policy, l.Key); err != nil {
		return nil, fmt.Errorf("bench: %s: charge the key: %w", FloorGCRARefuse, err)
	}
	return func(ctx context.Context) error {
		var admitted bool
		var retry time.Duration
		if err := w.Conn.QueryRow(ctx, floorRefuse, l.Policy, l.Key).Scan(&admitted, &retry); err != nil {
			return fmt.Errorf("bench: %s: %w", FloorGCRARefuse, err)
		}
		if admitted || retry <= 0 {
			return fmt.Errorf("bench: %s: admitted %v, retry after %v: the key was charged a unit of a day's one, it must be refused", FloorGCRARefuse, admitted, retry)
		}
		return nil
	}, nil
}
