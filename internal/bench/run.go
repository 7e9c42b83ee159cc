package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/internal/pgconfig"
	"github.com/pgcoord/pgcoord/pgcoord"
)

// Defaults of Options.
const (
	// DefaultDuration is the default of Options.Duration.
	DefaultDuration = 5 * time.Second
	// DefaultRound is the default of Options.Round.
	DefaultRound = 250 * time.Millisecond
)

// DefaultConcurrency is the default of Options.Concurrency.
var DefaultConcurrency = []int{1, 8, 32}

// Options configure Run. A nil *Options means the defaults.
type Options struct {
	// Concurrency lists the numbers of workers to measure each scenario with, in order.
	// Default DefaultConcurrency (1, 8, 32).
	Concurrency []int
	// Duration is the time each scenario is measured at each concurrency; its floor is
	// measured for as long again, interleaved. Default DefaultDuration (5s).
	Duration time.Duration
	// Round is the target length of one round. Duration is split into rounds of about
	// this length, but at least 3 rounds when Duration allows rounds of 50ms or more.
	// Default DefaultRound (250ms).
	Round time.Duration
	// Progress, if set, is called before each measurement starts.
	Progress func(Progress)
	// OnResult, if set, is called with each result as soon as it is measured.
	OnResult func(Result)
	// AfterRun, if set, is called after the last measurement and before the bench schema
	// is dropped, with the bench pool: for tests and sanity checks of what the scenarios
	// wrote. Its error fails Run.
	AfterRun func(ctx context.Context, pool *pgxpool.Pool) error
}

// Progress describes a measurement about to start.
type Progress struct {
	Scenario    string
	Floor       string // the scenario's floor, or its own name when it is its own reference
	Concurrency int
	Rounds      int           // rounds of the scenario (and as many of the floor)
	RoundLength time.Duration // the length of each round
}

// Result is the measurement of one scenario at one concurrency.
type Result struct {
	Scenario    string
	Concurrency int
	// Floor is the reference the scenario was measured against: its Floor, or its own
	// name when it is its own reference.
	Floor string
	// Rounds is the number of rounds of the scenario (and of its floor).
	Rounds int
	// Ops is the number of operations the scenario completed over all its rounds, as the
	// scenario counts them (a relays op counts the messages it delivered).
	Ops int64
	// OpsPerSec is the median of the scenario's per-round throughputs.
	OpsPerSec float64
	// FloorOpsPerSec is the median of the floor's per-round throughputs (OpsPerSec when
	// the scenario is its own reference).
	FloorOpsPerSec float64
	// Ratio is OpsPerSec / FloorOpsPerSec: 1 means as fast as the floor.
	Ratio float64
	// P50 and P99 are percentiles of the latency of the scenario's operations.
	P50, P99 time.Duration
	// RoundOpsPerSec and FloorRoundOpsPerSec are the per-round throughputs of the scenario
	// and of its floor, in the order measured (round i of the floor ran right after round i
	// of the scenario); the same slice when the scenario is its own reference.
	RoundOpsPerSec, FloorRoundOpsPerSec []float64
	// AllocsPerOp and BytesPerOp are the heap allocations and bytes allocated per operation
	// during the scenario's rounds (runtime.MemStats' Mallocs and TotalAlloc before and after
	// each round, summed, divided by Ops). They count the whole process's allocations
	// during the rounds, which in a bench are its workers' (and what they run, such as a
	// relay): the client-side cost of an operation.
	AllocsPerOp, BytesPerOp float64
}

// pair is a scenario to measure and its floor (nil when it is its own reference).
type pair struct {
	a     Scenario
	floor *Scenario
}

// Run measures scenarios at each concurrency of opts, in order, each alternating with its
// floor, and returns one Result per scenario and concurrency. Floors are resolved among
// scenarios and then the registry; a floor is measured beside the scenarios that need it
// but reported only if it is in scenarios itself.
//
// Run connects with cfg (copied; its search_path is replaced by the bench schema and its
// MaxConns raised to the highest concurrency plus one), creates and migrates the bench
// schema, runs every Setup, measures, calls AfterRun, and drops the schema whatever
// happened. An op's error stops Run and is returned with the scenario, concurrency and
// worker; the results measured before are returned with it. When ctx is cancelled, Run
// stops, drops the schema and returns an error wrapping ctx's error.
func Run(ctx context.Context, cfg *pgxpool.Config, scenarios []Scenario, opts *Options) (results []Result, err error) {
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	pairs, needed, err := plan(scenarios)
	if err != nil {
		return nil, err
	}
	err = inBenchSchema(ctx, cfg, slices.Max(o.Concurrency)+1, needed, func(ctx context.Context, pool *pgxpool.Pool, _ string) error {
		for _, p := range pairs {
			for _, c := range p.a.concurrencies(o.Concurrency) {
				r, err := measure(ctx, pool, p, c, o)
				if err != nil {
					return err
				}
				results = append(results, r)
				if o.OnResult != nil {
					o.OnResult(r)
				}
			}
		}
		if o.AfterRun != nil {
			if err := o.AfterRun(ctx, pool); err != nil {
				return fmt.Errorf("bench: after run: %w", err)
			}
		}
		return nil
	})
	return results, err
}

// inBenchSchema connects with cfg (copied; its search_path is replaced by a new bench
// schema and its MaxConns raised to at least conns), creates and migrates the schema,
// runs the Setup of each of needed, calls f, and drops the schema whatever happened. When
// ctx is cancelled it stops, drops the schema and returns an error wrapping ctx's error.
func inBenchSchema(ctx context.Context, cfg *pgxpool.Config, conns int, needed []Scenario,
	f func(ctx context.Context, pool *pgxpool.Pool, schema string) error,
) (err error) {
	schema, err := newSchemaName()
	if err != nil {
		return err
	}
	cfg = cfg.Copy()
	cfg.ConnConfig.RuntimeParams["search_path"] = pgconfig.QuoteIdent(schema)
	cfg.MaxConns = max(cfg.MaxConns, int32(conns))
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	created := false
	defer func() {
		// A fresh context: the schema must go also when ctx was cancelled (Ctrl-C).
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		derr := dropSchemas(cctx, pool, schema)
		pool.Close()
		if err != nil && ctx.Err() != nil {
			err = fmt.Errorf("bench: interrupted: %w", ctx.Err()) // the op's error is a consequence
		}
		if derr != nil && created { // if CREATE failed, it already said why
			err = errors.Join(err, fmt.Errorf("bench: drop schema %s (drop it by hand): %w", schema, derr))
		}
	}()
	if _, err := pool.Exec(ctx, "CREATE SCHEMA "+pgconfig.QuoteIdent(schema)); err != nil {
		return fmt.Errorf("bench: create schema %s on %s: %w", schema, pgconfig.Describe(cfg), err)
	}
	created = true
	if _, err := pgcoord.Migrate(ctx, pool, nil); err != nil {
		return fmt.Errorf("bench: migrate schema %s: %w", schema, err)
	}
	for _, s := range needed {
		if s.Setup == nil {
			continue
		}
		if err := s.Setup(ctx, pool); err != nil {
			return fmt.Errorf("bench: %s: setup: %w", s.Name, err)
		}
	}
	return f(ctx, pool, schema)
}

// concurrencies returns the concurrencies s is measured at: each of cs, lowered to its
// MaxConcurrency if it has one, once each, in order.
func (s Scenario) concurrencies(cs []int) []int {
	if s.MaxConcurrency <= 0 {
		return cs
	}
	var out []int
	for _, c := range cs {
		if c = min(c, s.MaxConcurrency); !slices.Contains(out, c) {
			out = append(out, c)
		}
	}
	return out
}

func (opts *Options) withDefaults() (Options, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	if len(o.Concurrency) == 0 {
		o.Concurrency = DefaultConcurrency
	}
	for _, c := range o.Concurrency {
		if c < 1 || c > MaxConcurrency {
			return o, fmt.Errorf("bench: concurrency %d: want 1 to %d", c, MaxConcurrency)
		}
	}
	if o.Duration == 0 {
		o.Duration = DefaultDuration
	}
	if o.Round == 0 {
		o.Round = DefaultRound
	}
	if o.Duration < 0 || o.Round < 0 {
		return o, fmt.Errorf("bench: negative duration %v or round %v", o.Duration, o.Round)
	}
	return o, nil
}

// MaxConcurrency is the highest concurrency Run accepts: each worker holds a connection.
const MaxConcurrency = 10000

// plan pairs each scenario with its floor and lists every scenario that needs its Setup
// run, each once, in order.
func plan(scenarios []Scenario) (pairs []pair, needed []Scenario, err error) {
	if len(scenarios) == 0 {
		return nil, nil, errors.New("bench: no scenario to run")
	}
	seen := map[string]bool{}
	add := func(s Scenario) {
		if !seen[s.Name] {
			seen[s.Name] = true
			needed = append(needed, s)
		}
	}
	for _, s := range scenarios {
		if s.Name == "" || s.NewWorker == nil {
			return nil, nil, errors.New("bench: scenario needs a Name and a NewWorker")
		}
		add(s)
	}
	for _, s := range scenarios {
		p := pair{a: s}
		if s.Floor != "" && s.Floor != s.Name {
			f, ok := findScenario(scenarios, s.Floor)
			if !ok {
				return nil, nil, fmt.Errorf("bench: %s: floor %q is not registered", s.Name, s.Floor)
			}
			p.floor = &f
			add(f)
		}
		pairs = append(pairs, p)
	}
	return pairs, needed, nil
}

func findScenario(scenarios []Scenario, name string) (Scenario, bool) {
	for _, s := range scenarios {
		if s.Name == name {
			return s, true
		}
	}
	return Lookup(name)
}

// dropSchemas drops the bench schema and the schemas named after it (those of the scale
// scenarios' sizes).
func dropSchemas(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	rows, err := pool.Query(ctx, `SELECT nspname FROM pg_namespace WHERE nspname = $1 OR starts_with(nspname, $1 || '_')`, schema)
	if err != nil {
		return err
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil || len(names) == 0 {
		return err
	}
	// One at a time: a DROP locks every object it drops until it commits, and a run's
	// schemas together (one per --scale scenario, each migrated) outgrew the server's lock
	// table (out of shared memory, 53200) beside other work.
	for _, n := range names {
		if _, derr := pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgconfig.QuoteIdent(n)+" CASCADE"); derr != nil {
			err = errors.Join(err, derr)
		}
	}
	return err
}

func newSchemaName() (string, error) {
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("bench: %w", err)
	}
	return SchemaPrefix + hex.EncodeToString(b[:]), nil
}
