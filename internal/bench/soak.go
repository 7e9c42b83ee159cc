package bench

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// SoakScenarios are the scenarios a soak runs by default: one of each primitive's main
// operation, each writing its own rows.
var SoakScenarios = []string{
	"leases.acquire_release", "semaphore.acquire_release", "idempotency.first", "outbox.throughput",
	"ratelimit.allow", "dedupe.claim", "fenced.check", "singleton.run_once",
}

// SoakOptions configure Soak. A nil *SoakOptions means the defaults.
type SoakOptions struct {
	// Duration is how long the scenarios run. Default DefaultSoakDuration.
	Duration time.Duration
	// Interval is how often throughput and dead tuples are reported. Default
	// DefaultSoakInterval; at most Duration.
	Interval time.Duration
	// Workers is each scenario's number of workers (its connections). Default 2.
	Workers int
	// PinXmin holds a transaction open beside the scenarios, from before the first interval
	// to the end, whose snapshot keeps vacuum from removing any row version they leave
	// behind: a forgotten session, a long report, a stale replication slot.
	PinXmin bool
	// OnInterval, if set, is called with each interval as soon as it is measured.
	OnInterval func(SoakInterval)
}

// Defaults of SoakOptions.
const (
	DefaultSoakDuration = 10 * time.Minute
	DefaultSoakInterval = time.Minute
	// MaxSoakDuration bounds a soak: a day.
	MaxSoakDuration = 24 * time.Hour
)

// SoakInterval is what one interval of a soak measured.
type SoakInterval struct {
	// N is the interval's number, from 1; End is when it ended, from the soak's start.
	N   int
	End time.Duration
	// OpsPerSec is each scenario's throughput over the interval, by name.
	OpsPerSec map[string]float64
	// DeadTuples and LiveTuples are the bench schema's tables' n_dead_tup and n_live_tup
	// (pg_stat_user_tables, which the server updates about once a second) at its end.
	DeadTuples, LiveTuples int64
	// XminAge is how many transactions old the oldest snapshot of the soak's sessions is
	// (age(backend_xmin)): with PinXmin, the pinned one's, growing with every write.
	XminAge int64
}

// SoakResult is a soak's measure: every interval, and each scenario's throughput in the
// last interval as a fraction of the first (Steady).
type SoakResult struct {
	Intervals []SoakInterval
	Steady    map[string]float64
}

// Soak runs scenarios (no floors) side by side in a bench schema of their own for
// opts.Duration, each with opts.Workers workers, and reports each interval's throughput
// per scenario, the schema's dead and live tuples, and the age of the oldest snapshot —
// with PinXmin, beside a transaction that keeps vacuum from removing anything. It is how
// costs are watched as row versions pile up (issue 32: at the 10th minute, at least 0.8
// of the first).
func Soak(ctx context.Context, cfg *pgxpool.Config, scenarios []Scenario, opts *SoakOptions) (res SoakResult, err error) {
	o, err := opts.withDefaults()
	if err != nil {
		return res, err
	}
	if len(scenarios) == 0 {
		return res, errors.New("bench: no scenario to soak")
	}
	err = inBenchSchema(ctx, cfg, len(scenarios)*o.Workers+2, scenarios, func(ctx context.Context, pool *pgxpool.Pool, schema string) error {
		ops := make([][]Op, len(scenarios))
		var held []*pgxpool.Conn
		defer func() {
			for _, conn := range held {
				conn.Release()
			}
		}()
		cl := &cleanups{} // run before the connections are released
		defer cl.run()
		for i, s := range scenarios {
			conns := make([]*pgxpool.Conn, 0, o.Workers)
			for range o.Workers {
				conn, err := pool.Acquire(ctx)
				if err != nil {
					return fmt.Errorf("bench: soak %s: acquire connection: %w", s.Name, err)
				}
				held = append(held, conn)
				conns = append(conns, conn)
			}
			if ops[i], err = newWorkers(ctx, s, conns, cl); err != nil {
				return fmt.Errorf("bench: soak: %w", err)
			}
		}
		if o.PinXmin {
			pin, err := pool.Acquire(ctx)
			if err != nil {
				return fmt.Errorf("bench: soak: pin xmin: %w", err)
			}
			defer pin.Release()
			// A snapshot taken now and held: no row version a scenario leaves behind from
			// here on can be removed by vacuum until it ends.
			if _, err := pin.Exec(ctx, "BEGIN ISOLATION LEVEL REPEATABLE READ"); err != nil {
				return fmt.Errorf("bench: soak: pin xmin: %w", err)
			}
			defer func() {
				rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
				defer cancel()
				_, _ = pin.Exec(rctx, "ROLLBACK")
			}()
			if _, err := pin.Exec(ctx, "SELECT count(*) FROM pg_class"); err != nil {
				return fmt.Errorf("bench: soak: pin xmin: %w", err)
			}
		}
		start := time.Now()
		for n := 1; time.Since(start) < o.Duration; n++ {
			d := min(o.Interval, o.Duration-time.Since(start))
			iv, err := soakInterval(ctx, pool, schema, scenarios, ops, d)
			if err != nil {
				return err
			}
			iv.N, iv.End = n, time.Since(start)
			res.Intervals = append(res.Intervals, iv)
			if o.OnInterval != nil {
				o.OnInterval(iv)
			}
		}
		return nil
	})
	if err != nil {
		return res, err
	}
	res.Steady = map[string]float64{}
	first, last := res.Intervals[0], res.Intervals[len(res.Intervals)-1]
	for _, s := range scenarios {
		if f := first.OpsPerSec[s.Name]; f > 0 {
			res.Steady[s.Name] = last.OpsPerSec[s.Name] / f
		}
	}
	return res, nil
}

// soakInterval runs every scenario's ops side by side for d and reads the schema's tuples.
func soakInterval(ctx context.Context, pool *pgxpool.Pool, schema string, scenarios []Scenario, ops [][]Op, d time.Duration) (SoakInterval, error) {
	iv := SoakInterval{OpsPerSec: map[string]float64{}}
	var mu sync.Mutex
	var wg sync.WaitGroup
	errs := make([]error, len(scenarios))
	for i, s := range scenarios {
		wg.Go(func() {
			_, rate, err := runRound(ctx, ops[i], d, nil)
			if err != nil {
				errs[i] = fmt.Errorf("bench: soak %s: %w", s.Name, err)
				return
			}
			mu.Lock()
			iv.OpsPerSec[s.Name] = rate
			mu.Unlock()
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return iv, err
	}
	err := pool.QueryRow(ctx, `SELECT coalesce(sum(n_dead_tup), 0)::bigint, coalesce(sum(n_live_tup), 0)::bigint,
		(SELECT coalesce(max(age(backend_xmin)), 0)::bigint FROM pg_stat_activity
		  WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_xmin IS NOT NULL)
		FROM pg_stat_user_tables WHERE schemaname = $1`, schema).Scan(&iv.DeadTuples, &iv.LiveTuples, &iv.XminAge)
	if err != nil {
		return iv, fmt.Errorf("bench: soak: read the schema's tuples: %w", err)
	}
	return iv, nil
}

func (opts *SoakOptions) withDefaults() (SoakOptions, error) {
	var o SoakOptions
	if opts != nil {
		o = *opts
	}
	if o.Duration == 0 {
		o.Duration = DefaultSoakDuration
	}
	if o.Interval == 0 {
		o.Interval = min(DefaultSoakInterval, o.Duration)
	}
	if o.Workers == 0 {
		o.Workers = 2
	}
	switch {
	case o.Duration < 0 || o.Duration > MaxSoakDuration:
		return o, fmt.Errorf("bench: soak duration %v: want up to %v", o.Duration, MaxSoakDuration)
	case o.Interval < 100*time.Millisecond || o.Interval > o.Duration:
		return o, fmt.Errorf("bench: soak interval %v: want 100ms to the duration %v", o.Interval, o.Duration)
	case o.Workers < 1 || o.Workers > 64:
		return o, fmt.Errorf("bench: soak workers %d: want 1 to 64", o.Workers)
	}
	return o, nil
}

// SoakNames returns the scenarios named, in order, refusing an unknown one or a repeat.
func SoakNames(names []string) ([]Scenario, error) {
	var out []Scenario
	for _, n := range names {
		s, ok := Lookup(n)
		if !ok {
			return nil, fmt.Errorf("bench: soak: no scenario %q", n)
		}
		if slices.ContainsFunc(out, func(o Scenario) bool { return o.Name == n }) {
			return nil, fmt.Errorf("bench: soak: %q twice", n)
		}
		out = append(out, s)
	}
	return out, nil
}
