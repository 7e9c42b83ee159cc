package bench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/ratelimit"
)

// The rate limiter's scale scenarios: scale.ratelimit.N, ratelimit.Allow on keys spread
// over N live keys of state (issue 29: 1M keys at 0.9 or more of 1k keys).

// scaleRatelimitPolicy is the policy of the loaded keys: 1,000 units a second in bursts of
// a billion, so that a key a day ahead (as loaded) still admits for days of charges.
var scaleRatelimitPolicy = ratelimit.Policy{Name: "bench_scale", Rate: 1000, Period: time.Second, Burst: 1_000_000_000}

func init() {
	scaleFamily{
		name: "ratelimit", unit: "live keys", sizes: []int{1000, 1000000},
		what: "ratelimit.Allow of 1 unit on a random key of the worker's share of the loaded keys (autocommit)",
		load: loadRatelimitKeys, newOp: newScaleRatelimitOp,
	}.register()
}

// loadRatelimitKeys creates scale.ratelimit's policy and n keys of it, k1 to kn, live: their
// arrival time a day ahead, so that gc would keep them.
func loadRatelimitKeys(ctx context.Context, pool *pgxpool.Pool, n int) error {
	if _, err := ratelimit.Set(ctx, pool, scaleRatelimitPolicy); err != nil {
		return err
	}
	return loadRows(ctx, pool, "pgcoord_ratelimit_state", `
		INSERT INTO pgcoord_ratelimit_state (policy, key, tat)
		SELECT $1, 'k' || g, pgcoord_clock() + interval '1 day' FROM generate_series(1, $2::int) g`,
		scaleRatelimitPolicy.Name, n)
}

// newScaleRatelimitOp charges a random key of the worker's share of the n loaded keys
// (those whose number is its ID + 1 modulo the concurrency, so that workers never wait for
// each other's row lock), or, with fewer keys than workers, a key of its own.
func newScaleRatelimitOp(w Worker, n int) scaleOp {
	first := w.ID + 1
	count := 0
	if first <= n {
		count = (n-first)/w.Concurrency + 1
	}
	return func(ctx context.Context, pool *pgxpool.Pool) error {
		key := "w" + strconv.Itoa(w.ID)
		if count > 0 {
			key = "k" + strconv.Itoa(first+rand.IntN(count)*w.Concurrency)
		}
		d, err := ratelimit.Allow(ctx, pool, 1, []ratelimit.Limit{{Policy: scaleRatelimitPolicy.Name, Key: key}}, nil)
		if err != nil {
			return fmt.Errorf("bench: scale.ratelimit: %w", err)
		}
		if !d.Allowed {
			return fmt.Errorf("bench: scale.ratelimit: key %s refused: %+v", key, d)
		}
		return nil
	}
}
