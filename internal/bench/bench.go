// Package bench measures pgcoord's coordination operations against a real database, each
// beside its raw-SQL floor: the same work done with the fewest plain statements a
// hand-written client would send. It backs `pgcoord bench`.
//
// # Scenarios
//
// A [Scenario] is a named operation run repeatedly by concurrent workers. Scenarios are
// registered with [Register], usually from an init function in a file of this package (one
// file per feature: leases.go, outbox.go, ...):
//
//	func init() {
//		bench.Register(bench.Scenario{
//			Name:        "leases.acquire_release",
//			Description: "leases.Acquire then Release of a key per worker",
//			Floor:       "floor.lease",
//			NewWorker: func(ctx context.Context, w bench.Worker) (bench.Op, error) {
//				name := fmt.Sprintf("bench/%d", w.ID) // per-worker state
//				return func(ctx context.Context) error {
//					l, err := leases.Acquire(ctx, w.Conn, name, ...)
//					...
//				}, nil
//			},
//		})
//	}
//
// The floors registered here are "floor.select1" (SELECT 1: the round-trip floor, its own
// reference) and "floor.lease" (a raw upsert acquire plus a compare-and-release, autocommit,
// on a key per worker).
//
// # Measurement
//
// [Run] measures each scenario at each concurrency. A scenario and its floor are measured in
// the same run, alternating in short rounds (A B A B ...) on the same connections, because
// the cost of a durable commit drifts by up to 10x within an hour on a shared machine: only
// the ratio of the medians of the per-round throughputs is stable. Latency percentiles come
// from a histogram of every operation of the scenario (about 1% precision).
//
// # Isolation
//
// Run never touches the application's pgcoord tables: it creates a schema named
// pgcoord_bench_<random hex>, migrates pgcoord into it, runs everything with that schema as
// the only entry of search_path and drops it (CASCADE) at the end, also on error or
// cancellation. A bench process killed outright leaves its schema behind; any schema named
// pgcoord_bench_* can be dropped safely. Run needs the CREATE privilege on the database.
package bench

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/internal/pgconfig"
	"github.com/pgcoord/pgcoord/pgcoord"
)

// SchemaPrefix starts the name of every schema Run creates.
const SchemaPrefix = "pgcoord_bench_"

// Scenario is one operation to measure.
type Scenario struct {
	// Name identifies the scenario: dotted, feature first ("leases.acquire_release").
	Name string
	// Description says in one line what one operation does.
	Description string
	// Floor names the scenario that does the same work with the fewest plain SQL
	// statements; the two are measured alternately and reported as a ratio. Empty means
	// the scenario is its own reference (only "floor.select1" should be).
	Floor string
	// Setup, if set, runs once per Run before any measurement, with a pool whose
	// search_path is the migrated bench schema. It creates what the scenario needs beyond
	// pgcoord's own tables.
	Setup func(ctx context.Context, pool *pgxpool.Pool) error
	// NewWorker creates the state of one worker and returns the operation the worker runs
	// repeatedly. It is called once per worker per measurement (one scenario at one
	// concurrency), before the first round; the worker's state lives across the rounds.
	NewWorker func(ctx context.Context, w Worker) (Op, error)
}

// Worker is one of the concurrent clients of a measurement.
type Worker struct {
	// ID is the worker's number, from 0 to Concurrency-1. Workers of one measurement have
	// distinct IDs; derive per-worker keys from it (and from the scenario's name if
	// another scenario might use the same table).
	ID int
	// Concurrency is the number of workers in the measurement.
	Concurrency int
	// Conn is the worker's own connection, held for the whole measurement (the scenario's
	// floor runs on the same connections). Its search_path is the bench schema. It
	// satisfies pgcoord.DBTX. An Op must leave it idle (no open transaction) on return.
	Conn *pgxpool.Conn
}

// Op performs one operation of a scenario. An error fails the whole bench: an op that
// cannot do its work (a lease refused that should have been granted, a release that changed
// nothing) must say so rather than return nil.
type Op func(ctx context.Context) error

var registry struct {
	sync.Mutex
	scenarios []Scenario
}

// Register adds s to the scenarios Run and `pgcoord bench` know. Call it from an init
// function. It panics (a programming error) if s has no Name or NewWorker, or if a
// scenario of that name is already registered. Floors are resolved when Run starts, so
// registration order does not matter.
func Register(s Scenario) {
	if s.Name == "" || s.NewWorker == nil {
		panic("bench: Register: scenario needs a Name and a NewWorker")
	}
	registry.Lock()
	defer registry.Unlock()
	for _, r := range registry.scenarios {
		if r.Name == s.Name {
			panic("bench: Register: duplicate scenario " + s.Name)
		}
	}
	registry.scenarios = append(registry.scenarios, s)
}

// Scenarios returns the registered scenarios grouped by feature (the part of the name
// before the first dot) in name order; within a feature, floors come before the scenarios
// measured against them, then by name ("floor.select1" before "floor.lease").
func Scenarios() []Scenario {
	registry.Lock()
	defer registry.Unlock()
	byName := make(map[string]Scenario, len(registry.scenarios))
	for _, s := range registry.scenarios {
		byName[s.Name] = s
	}
	// depth counts the floors below s: 0 for its own reference.
	depth := func(s Scenario) int {
		d := 0
		for ; d < len(byName) && s.Floor != "" && s.Floor != s.Name; d++ {
			f, ok := byName[s.Floor]
			if !ok {
				break
			}
			s = f
		}
		return d
	}
	feature := func(s Scenario) string { f, _, _ := strings.Cut(s.Name, "."); return f }
	out := slices.Clone(registry.scenarios)
	slices.SortFunc(out, func(a, b Scenario) int {
		return cmp.Or(cmp.Compare(feature(a), feature(b)), cmp.Compare(depth(a), depth(b)), cmp.Compare(a.Name, b.Name))
	})
	return out
}

// Select returns the registered scenarios whose name starts with prefix, in the order of
// Scenarios; every scenario when prefix is empty.
func Select(prefix string) []Scenario {
	var out []Scenario
	for _, s := range Scenarios() {
		if strings.HasPrefix(s.Name, prefix) {
			out = append(out, s)
		}
	}
	return out
}

// Lookup returns the registered scenario called name.
func Lookup(name string) (Scenario, bool) {
	for _, s := range Scenarios() {
		if s.Name == name {
			return s, true
		}
	}
	return Scenario{}, false
}

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
	// Ops is the number of operations the scenario completed over all its rounds.
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
	schema, err := newSchemaName()
	if err != nil {
		return nil, err
	}
	cfg = cfg.Copy()
	cfg.ConnConfig.RuntimeParams["search_path"] = pgconfig.QuoteIdent(schema)
	cfg.MaxConns = max(cfg.MaxConns, int32(slices.Max(o.Concurrency)+1))
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	created := false
	defer func() {
		// A fresh context: the schema must go also when ctx was cancelled (Ctrl-C).
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		_, derr := pool.Exec(cctx, "DROP SCHEMA IF EXISTS "+pgconfig.QuoteIdent(schema)+" CASCADE")
		pool.Close()
		if err != nil && ctx.Err() != nil {
			err = fmt.Errorf("bench: interrupted: %w", ctx.Err()) // the op's error is a consequence
		}
		if derr != nil && created { // if CREATE failed, it already said why
			err = errors.Join(err, fmt.Errorf("bench: drop schema %s (drop it by hand): %w", schema, derr))
		}
	}()
	if _, err := pool.Exec(ctx, "CREATE SCHEMA "+pgconfig.QuoteIdent(schema)); err != nil {
		return nil, fmt.Errorf("bench: create schema %s on %s: %w", schema, pgconfig.Describe(cfg), err)
	}
	created = true
	if _, err := pgcoord.Migrate(ctx, pool, nil); err != nil {
		return nil, fmt.Errorf("bench: migrate schema %s: %w", schema, err)
	}
	for _, s := range needed {
		if s.Setup == nil {
			continue
		}
		if err := s.Setup(ctx, pool); err != nil {
			return nil, fmt.Errorf("bench: %s: setup: %w", s.Name, err)
		}
	}
	for _, p := range pairs {
		for _, c := range o.Concurrency {
			r, err := measure(ctx, pool, p, c, o)
			if err != nil {
				return results, err
			}
			results = append(results, r)
			if o.OnResult != nil {
				o.OnResult(r)
			}
		}
	}
	if o.AfterRun != nil {
		if err := o.AfterRun(ctx, pool); err != nil {
			return results, fmt.Errorf("bench: after run: %w", err)
		}
	}
	return results, nil
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

func newSchemaName() (string, error) {
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("bench: %w", err)
	}
	return SchemaPrefix + hex.EncodeToString(b[:]), nil
}

// rounds splits d into rounds of about round each: at least one, and at least 3 when that
// leaves rounds of 50ms or more.
func rounds(d, round time.Duration) int {
	n := int(d / round)
	n = max(n, min(3, int(d/(50*time.Millisecond))), 1)
	return n
}

// measure runs p's scenario (and its floor, alternating) at concurrency c.
func measure(ctx context.Context, pool *pgxpool.Pool, p pair, c int, o Options) (Result, error) {
	n := rounds(o.Duration, o.Round)
	per := o.Duration / time.Duration(n)
	res := Result{Scenario: p.a.Name, Concurrency: c, Floor: p.a.Name, Rounds: n}
	if p.floor != nil {
		res.Floor = p.floor.Name
	}
	if o.Progress != nil {
		o.Progress(Progress{Scenario: res.Scenario, Floor: res.Floor, Concurrency: c, Rounds: n, RoundLength: per})
	}
	where := fmt.Sprintf("bench: %s c=%d", p.a.Name, c)

	conns := make([]*pgxpool.Conn, 0, c)
	defer func() {
		for _, conn := range conns {
			conn.Release()
		}
	}()
	for range c {
		conn, err := pool.Acquire(ctx)
		if err != nil {
			return res, fmt.Errorf("%s: acquire connection: %w", where, err)
		}
		conns = append(conns, conn)
	}
	aOps, err := newWorkers(ctx, p.a, conns)
	if err != nil {
		return res, fmt.Errorf("%s: %w", where, err)
	}
	var fOps []Op
	if p.floor != nil {
		if fOps, err = newWorkers(ctx, *p.floor, conns); err != nil {
			return res, fmt.Errorf("%s: floor %w", where, err)
		}
	}

	hists := make([]histogram, c)
	aRates := make([]float64, 0, n)
	fRates := make([]float64, 0, n)
	for range n {
		ops, rate, err := runRound(ctx, aOps, per, hists)
		if err != nil {
			return res, fmt.Errorf("%s: %w", where, err)
		}
		res.Ops += ops
		aRates = append(aRates, rate)
		if p.floor != nil {
			_, rate, err := runRound(ctx, fOps, per, nil)
			if err != nil {
				return res, fmt.Errorf("%s: floor %s: %w", where, p.floor.Name, err)
			}
			fRates = append(fRates, rate)
		}
	}
	if p.floor == nil {
		fRates = aRates
	}
	res.OpsPerSec, res.FloorOpsPerSec, res.Ratio = ratioOfMedians(aRates, fRates)
	var all histogram
	for i := range hists {
		all.merge(&hists[i])
	}
	res.P50, res.P99 = all.quantile(0.50), all.quantile(0.99)
	return res, nil
}

func newWorkers(ctx context.Context, s Scenario, conns []*pgxpool.Conn) ([]Op, error) {
	ops := make([]Op, len(conns))
	for i, conn := range conns {
		op, err := s.NewWorker(ctx, Worker{ID: i, Concurrency: len(conns), Conn: conn})
		if err != nil {
			return nil, fmt.Errorf("%s: worker %d: %w", s.Name, i, err)
		}
		if op == nil {
			return nil, fmt.Errorf("%s: worker %d: NewWorker returned a nil Op", s.Name, i)
		}
		ops[i] = op
	}
	return ops, nil
}

// runRound runs every op in its own goroutine, again and again, until d has passed (an op
// started before then completes and counts). It returns the number of ops completed and
// their rate over the round's wall time. It records each op's latency in hists[worker]
// when hists is not nil. The first error stops the round and is returned.
func runRound(ctx context.Context, ops []Op, d time.Duration, hists []histogram) (int64, float64, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		firstErr error
	)
	counts := make([]int64, len(ops))
	start := time.Now()
	end := start.Add(d)
	for i, op := range ops {
		var h *histogram
		if hists != nil {
			h = &hists[i]
		}
		wg.Go(func() {
			var n int64
			for {
				t0 := time.Now()
				if !t0.Before(end) {
					break
				}
				if err := op(ctx); err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = fmt.Errorf("worker %d: %w", i, err)
						cancel() // the other workers' errors are consequences
					}
					mu.Unlock()
					break
				}
				if h != nil {
					h.record(time.Since(t0))
				}
				n++
			}
			counts[i] = n
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	if firstErr != nil {
		return 0, 0, firstErr
	}
	var total int64
	for _, n := range counts {
		total += n
	}
	return total, float64(total) / elapsed.Seconds(), nil
}

// median returns the median of xs (the mean of the middle two for an even count), 0 for
// none. It does not modify xs.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	m := len(s) / 2
	if len(s)%2 == 1 {
		return s[m]
	}
	return (s[m-1] + s[m]) / 2
}

// ratioOfMedians returns the medians of a and of floor and their ratio (0 when the floor's
// median is 0).
func ratioOfMedians(a, floor []float64) (ma, mf, ratio float64) {
	ma, mf = median(a), median(floor)
	if mf > 0 {
		ratio = ma / mf
	}
	return ma, mf, ratio
}
