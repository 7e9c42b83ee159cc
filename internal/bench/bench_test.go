package bench_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/internal/bench"
	"github.com/pgcoord/pgcoord/internal/pgconfig"
	"github.com/pgcoord/pgcoord/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func poolConfig(t *testing.T) *pgxpool.Config {
	t.Helper()
	cfg, err := pgconfig.Pool(pgtest.URL(t), pgconfig.Options{AppName: "pgcoord-test", StatementTimeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// schemaExists reports whether the schema called name exists.
func schemaExists(t *testing.T, cfg *pgxpool.Config, name string) bool {
	t.Helper()
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	var exists bool
	if err := pool.QueryRow(t.Context(), `SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)`, name).Scan(&exists); err != nil {
		t.Fatal(err)
	}
	return exists
}

func TestRegisteredFloorsResolve(t *testing.T) {
	t.Parallel()
	all := bench.Scenarios()
	if len(all) < 2 {
		t.Fatalf("want at least the two floors registered, got %d scenarios", len(all))
	}
	for _, s := range all {
		if !strings.Contains(s.Name, ".") || s.Description == "" || strings.Contains(s.Description, "\n") {
			t.Errorf("%q: want a dotted name and a one-line description, got %q", s.Name, s.Description)
		}
		if s.Floor == "" {
			continue
		}
		if _, ok := bench.Lookup(s.Floor); !ok {
			t.Errorf("%s: floor %q is not registered", s.Name, s.Floor)
		}
	}
	if got := bench.Select("floor."); len(got) != 2 || got[0].Name != "floor.select1" || got[1].Name != "floor.lease" {
		t.Errorf("Select(floor.) = %v, want floor.select1, then floor.lease measured against it", got)
	}
}

func TestRunFloors(t *testing.T) {
	t.Parallel()
	cfg := poolConfig(t)
	var (
		schema string
		tokens int64 // sum of floor.lease's fence tokens: one per successful acquire
	)
	var progress []bench.Progress
	var streamed int
	results, err := bench.Run(t.Context(), cfg, bench.Select("floor"), &bench.Options{
		Concurrency: []int{1, 2},
		Duration:    300 * time.Millisecond,
		Progress:    func(p bench.Progress) { progress = append(progress, p) },
		OnResult:    func(bench.Result) { streamed++ },
		AfterRun: func(ctx context.Context, pool *pgxpool.Pool) error {
			return pool.QueryRow(ctx, `SELECT current_schema(), (SELECT coalesce(sum(token), 0) FROM bench_floor_lease)`).
				Scan(&schema, &tokens)
		},
	})
	if err != nil {
		t.Fatal(err)
	}

	if !strings.HasPrefix(schema, bench.SchemaPrefix) {
		t.Errorf("the scenarios ran in schema %q, want one named %s*", schema, bench.SchemaPrefix)
	}
	if schemaExists(t, cfg, schema) {
		t.Errorf("schema %s survived the bench", schema)
	}
	if streamed != len(results) || len(progress) != len(results) {
		t.Errorf("%d results, %d streamed, %d progress calls: want all equal", len(results), streamed, len(progress))
	}

	type key struct {
		name string
		c    int
	}
	want := map[key]string{
		{"floor.select1", 1}: "floor.select1", {"floor.select1", 2}: "floor.select1",
		{"floor.lease", 1}: "floor.select1", {"floor.lease", 2}: "floor.select1",
	}
	var leaseOps int64
	for _, r := range results {
		k := key{r.Scenario, r.Concurrency}
		floor, ok := want[k]
		if !ok {
			t.Errorf("unexpected or repeated result %+v", r)
			continue
		}
		delete(want, k)
		if r.Floor != floor {
			t.Errorf("%s c=%d: floor %q, want %q", r.Scenario, r.Concurrency, r.Floor, floor)
		}
		if r.Rounds < 1 || r.Ops <= 0 || r.OpsPerSec <= 0 || r.FloorOpsPerSec <= 0 {
			t.Errorf("%s c=%d: empty measurement %+v", r.Scenario, r.Concurrency, r)
		}
		if r.P50 <= 0 || r.P50 > r.P99 {
			t.Errorf("%s c=%d: p50 %v, p99 %v: want 0 < p50 <= p99", r.Scenario, r.Concurrency, r.P50, r.P99)
		}
		if math.Abs(r.Ratio-r.OpsPerSec/r.FloorOpsPerSec) > 1e-9 {
			t.Errorf("%s c=%d: ratio %v != %v / %v", r.Scenario, r.Concurrency, r.Ratio, r.OpsPerSec, r.FloorOpsPerSec)
		}
		if r.Scenario == "floor.select1" && (r.Ratio != 1 || r.FloorOpsPerSec != r.OpsPerSec) {
			t.Errorf("floor.select1 c=%d: ratio %v, floor %v ops/s, ops %v/s: its own reference must give 1",
				r.Concurrency, r.Ratio, r.FloorOpsPerSec, r.OpsPerSec)
		}
		if len(r.RoundOpsPerSec) != r.Rounds || len(r.FloorRoundOpsPerSec) != r.Rounds ||
			slices.Min(r.RoundOpsPerSec) > r.OpsPerSec || slices.Max(r.RoundOpsPerSec) < r.OpsPerSec ||
			slices.Min(r.FloorRoundOpsPerSec) > r.FloorOpsPerSec || slices.Max(r.FloorRoundOpsPerSec) < r.FloorOpsPerSec {
			t.Errorf("%s c=%d: per-round throughputs %v and floor's %v over %d rounds do not bracket the medians %v and %v",
				r.Scenario, r.Concurrency, r.RoundOpsPerSec, r.FloorRoundOpsPerSec, r.Rounds, r.OpsPerSec, r.FloorOpsPerSec)
		}
		if r.AllocsPerOp <= 0 || r.BytesPerOp <= 0 {
			t.Errorf("%s c=%d: %v allocs/op, %v B/op: a pgx round trip allocates", r.Scenario, r.Concurrency, r.AllocsPerOp, r.BytesPerOp)
		}
		if r.Scenario == "floor.lease" {
			leaseOps += r.Ops
		}
	}
	for k := range want {
		t.Errorf("no result for %s c=%d", k.name, k.c)
	}
	// Every counted floor.lease op acquired (bumping the token) and released its lease.
	if tokens != leaseOps || tokens == 0 {
		t.Errorf("floor.lease tokens sum to %d, want one per counted op (%d)", tokens, leaseOps)
	}
}

// allocSink keeps allocating's buffers on the heap.
var allocSink []byte

// allocating returns a scenario whose op allocates size bytes in one allocation, then runs
// SELECT 1.
func allocating(name, floor string, size int) bench.Scenario {
	return bench.Scenario{
		Name: name, Description: "allocates", Floor: floor,
		NewWorker: func(_ context.Context, w bench.Worker) (bench.Op, error) {
			return func(ctx context.Context) error {
				allocSink = make([]byte, size)
				_, err := w.Conn.Exec(ctx, "SELECT 1")
				return err
			}, nil
		},
	}
}

// TestRunMeasuresAllocations checks that allocations are counted per operation of the
// scenario and leave out its floor's. Not parallel: Run counts the whole process's
// allocations, and the package's parallel tests, which run only after the sequential ones,
// would add theirs (CI's PG17 leg once measured 105,647 B/op of the 65,536 allocated).
func TestRunMeasuresAllocations(t *testing.T) {
	const size, floorSize = 64 << 10, 1 << 20
	s := allocating("test.alloc", "test.alloc_floor", size)
	results, err := bench.Run(t.Context(), poolConfig(t), []bench.Scenario{s, allocating("test.alloc_floor", "", floorSize)},
		&bench.Options{Concurrency: []int{1}, Duration: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if len(results) != 2 || results[0].Scenario != s.Name {
		t.Fatalf("results %+v, want test.alloc and its floor", results)
	}
	// The op's buffer, plus what a pgx round trip and the bench's rounds allocate (a few KiB
	// at most), but not the floor's megabyte.
	if r := results[0]; r.AllocsPerOp < 1 || r.BytesPerOp < size || r.BytesPerOp > size+32<<10 {
		t.Errorf("test.alloc: %v allocs/op, %v B/op; want at least 1 and %d to %d", r.AllocsPerOp, r.BytesPerOp, size, size+32<<10)
	}
	if r := results[1]; r.BytesPerOp < floorSize {
		t.Errorf("test.alloc_floor: %v B/op, want at least %d", r.BytesPerOp, floorSize)
	}
}

// failing returns a scenario measured against floor.select1 whose op fails with err after a
// few calls, and which records the bench schema's name during Setup.
func failing(schema *string, fail func(calls int64) error) bench.Scenario {
	var calls atomic.Int64
	return bench.Scenario{
		Name:        "test.failing",
		Description: "fails",
		Floor:       "floor.select1",
		Setup: func(ctx context.Context, pool *pgxpool.Pool) error {
			return pool.QueryRow(ctx, "SELECT current_schema()").Scan(schema)
		},
		NewWorker: func(_ context.Context, w bench.Worker) (bench.Op, error) {
			return func(ctx context.Context) error {
				if err := fail(calls.Add(1)); err != nil {
					return err
				}
				_, err := w.Conn.Exec(ctx, "SELECT 1")
				return err
			}, nil
		},
	}
}

func TestRunFailsOnOpErrorAndDropsSchema(t *testing.T) {
	t.Parallel()
	cfg := poolConfig(t)
	boom := errors.New("boom")
	var schema string
	s := failing(&schema, func(calls int64) error {
		if calls >= 5 {
			return boom
		}
		return nil
	})
	_, err := bench.Run(t.Context(), cfg, []bench.Scenario{s}, &bench.Options{Concurrency: []int{2}, Duration: time.Second})
	if !errors.Is(err, boom) || !strings.Contains(err.Error(), "bench: test.failing c=2: worker ") {
		t.Fatalf("Run error = %v, want boom naming the scenario, concurrency and worker", err)
	}
	if schema == "" || schemaExists(t, cfg, schema) {
		t.Errorf("schema %q survived a failed bench", schema)
	}
}

func TestRunCancelledDropsSchema(t *testing.T) {
	t.Parallel()
	cfg := poolConfig(t)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var schema string
	s := failing(&schema, func(calls int64) error {
		if calls == 20 {
			cancel() // Ctrl-C in the middle of a round
		}
		return nil
	})
	_, err := bench.Run(ctx, cfg, []bench.Scenario{s}, &bench.Options{Concurrency: []int{2}, Duration: time.Minute})
	if !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "interrupted") {
		t.Fatalf("Run error = %v, want an interruption", err)
	}
	if schema == "" || schemaExists(t, cfg, schema) {
		t.Errorf("schema %q survived a cancelled bench", schema)
	}
}

func TestRunRejectsBadInput(t *testing.T) {
	t.Parallel()
	cfg := poolConfig(t)
	for name, tc := range map[string]struct {
		scenarios []bench.Scenario
		opts      *bench.Options
		want      string
	}{
		"no scenario":     {nil, nil, "no scenario"},
		"zero workers":    {bench.Select("floor.select1"), &bench.Options{Concurrency: []int{0}}, "concurrency 0"},
		"unknown floor":   {[]bench.Scenario{{Name: "x.y", Floor: "floor.nope", NewWorker: func(context.Context, bench.Worker) (bench.Op, error) { return nil, nil }}}, nil, `floor "floor.nope"`},
		"negative length": {bench.Select("floor.select1"), &bench.Options{Duration: -time.Second}, "negative"},
	} {
		_, err := bench.Run(t.Context(), cfg, tc.scenarios, tc.opts)
		if err == nil || !strings.HasPrefix(err.Error(), "bench: ") || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: Run error = %v, want one mentioning %q", name, err, tc.want)
		}
	}
}

// A scenario's Round sets the length of its rounds; what its workers register with Cleanup
// runs once per measurement, after its last round and before the next measurement starts,
// the last registered first.
func TestRunRoundAndCleanup(t *testing.T) {
	t.Parallel()
	var (
		events []string // appended by ops and cleanups alike, which never run at once
		ops    atomic.Int64
	)
	s := bench.Scenario{
		Name:        "test.cleanup",
		Description: "registers cleanups",
		Floor:       "floor.select1",
		Round:       100 * time.Millisecond,
		NewWorker: func(_ context.Context, w bench.Worker) (bench.Op, error) {
			events = append(events, fmt.Sprintf("new %d/%d", w.ID, w.Concurrency))
			for _, name := range []string{"first", "second"} {
				w.Cleanup(func() {
					events = append(events, fmt.Sprintf("%s cleanup %d/%d ops %d", name, w.ID, w.Concurrency, ops.Load()))
				})
			}
			return func(ctx context.Context) error {
				ops.Add(1)
				_, err := w.Conn.Exec(ctx, "SELECT 1")
				return err
			}, nil
		},
	}
	var seen []int64 // ops when each measurement's result came
	results, err := bench.Run(t.Context(), poolConfig(t), []bench.Scenario{s}, &bench.Options{
		Concurrency: []int{1, 2},
		Duration:    time.Second,
		OnResult:    func(bench.Result) { seen = append(seen, ops.Load()) },
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range results {
		if r.Rounds != 10 {
			t.Errorf("c=%d: %d rounds of %s, want 10 (a second in rounds of 100ms, not the default 250ms)", r.Concurrency, r.Rounds, r.Scenario)
		}
	}
	if len(seen) != 2 {
		t.Fatalf("%d results, want 2", len(seen))
	}
	want := []string{
		"new 0/1",
		fmt.Sprintf("second cleanup 0/1 ops %d", seen[0]), fmt.Sprintf("first cleanup 0/1 ops %d", seen[0]),
		"new 0/2", "new 1/2",
		fmt.Sprintf("second cleanup 1/2 ops %d", seen[1]), fmt.Sprintf("first cleanup 1/2 ops %d", seen[1]),
		fmt.Sprintf("second cleanup 0/2 ops %d", seen[1]), fmt.Sprintf("first cleanup 0/2 ops %d", seen[1]),
	}
	if !slices.Equal(events, want) {
		t.Errorf("events\n%s\nwant\n%s", strings.Join(events, "\n"), strings.Join(want, "\n"))
	}
}
