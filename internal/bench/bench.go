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
// from a histogram of every operation of the scenario (about 1% precision), or of the
// latencies its ops record themselves (schedules.lateness: each tick's lateness). Allocations and
// bytes per operation are the whole process's (runtime.ReadMemStats before and after each of
// the scenario's rounds, outside the timed part), which during a round are its workers'
// client-side cost.
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
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
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
	// the scenario is its own reference: "floor.select1", and a scenario whose rate is set
	// by a clock rather than by its cost ("schedules.lateness", which reports latencies).
	Floor string
	// Setup, if set, runs once per Run before any measurement, with a pool whose
	// search_path is the migrated bench schema. It creates what the scenario needs beyond
	// pgcoord's own tables.
	Setup func(ctx context.Context, pool *pgxpool.Pool) error
	// NewWorker creates the state of one worker and returns the operation the worker runs
	// repeatedly. It is called once per worker per measurement (one scenario at one
	// concurrency), before the first round; the worker's state lives across the rounds.
	NewWorker func(ctx context.Context, w Worker) (Op, error)
	// MaxConcurrency, if set, is the highest concurrency the scenario is measured at: Run
	// measures it at MaxConcurrency instead of any higher one asked for (once). A scenario
	// whose op runs concurrent work of its own (several relays) sets it to 1.
	MaxConcurrency int
	// Round, if set, is the length of the scenario's rounds (and its floor's), instead of
	// Options.Round: for a scenario whose ops follow a clock, such as one op per second of
	// cron ticks, whose rounds cannot be shorter than an op.
	Round time.Duration
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

	cleanups *cleanups
}

// Cleanup registers f to be called when the measurement ends, after its last round and
// before the next measurement starts (also when it failed), like testing.T's Cleanup: the
// functions registered last are called first. A worker that starts work of its own beside
// its ops (Schedulers running ticks) stops it there.
func (w Worker) Cleanup(f func()) {
	w.cleanups.mu.Lock()
	defer w.cleanups.mu.Unlock()
	w.cleanups.fs = append(w.cleanups.fs, f)
}

// cleanups are the functions the workers of a measurement registered with Cleanup.
type cleanups struct {
	mu sync.Mutex
	fs []func()
}

// run calls the functions registered, the last first, and forgets them.
func (c *cleanups) run() {
	c.mu.Lock()
	fs := c.fs
	c.fs = nil
	c.mu.Unlock()
	for i := len(fs) - 1; i >= 0; i-- {
		fs[i]()
	}
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
// Scenarios; every scenario when prefix is empty. The scale scenarios (ScalePrefix) are
// selected only by a prefix that starts with ScalePrefix.
func Select(prefix string) []Scenario {
	var out []Scenario
	for _, s := range Scenarios() {
		if strings.HasPrefix(s.Name, prefix) && strings.HasPrefix(s.Name, ScalePrefix) == strings.HasPrefix(prefix, ScalePrefix) {
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
