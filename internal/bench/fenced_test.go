package bench_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/fenced"
	"github.com/pgcoord/pgcoord/internal/bench"
)

func TestFencedCheckScenario(t *testing.T) {
	t.Parallel()
	s, ok := bench.Lookup("fenced.check")
	if !ok || s.Floor != bench.FloorFencedWrite {
		t.Fatalf("fenced.check: registered %v, floor %q; want it measured against %s", ok, s.Floor, bench.FloorFencedWrite)
	}
	if f, ok := bench.Lookup(bench.FloorFencedWrite); !ok || f.Setup == nil || f.Floor != "floor.select1" {
		t.Fatalf("%s: registered %v, %+v; want it registered with a Setup, against floor.select1", bench.FloorFencedWrite, ok, f)
	}

	var (
		writes, rowTokens, registerTokens int64
		workers, registers                int64
		floorWrites                       int64
	)
	results, err := bench.Run(t.Context(), poolConfig(t), []bench.Scenario{s}, &bench.Options{
		Concurrency: []int{1, 3},
		Duration:    300 * time.Millisecond,
		AfterRun: func(ctx context.Context, pool *pgxpool.Pool) error {
			return pool.QueryRow(ctx, `SELECT
				(SELECT coalesce(sum(writes), 0) FROM bench_fenced_check),
				(SELECT coalesce(sum(fence_token), 0) FROM bench_fenced_check),
				(SELECT coalesce(sum(fence_token), 0) FROM pgcoord_fences),
				(SELECT count(*) FROM bench_fenced_check),
				(SELECT count(*) FROM pgcoord_fences),
				(SELECT coalesce(sum(writes), 0) FROM bench_floor_fenced_write)`).
				Scan(&writes, &rowTokens, &registerTokens, &workers, &registers, &floorWrites)
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(results) != 2 {
		t.Fatalf("got %d results, want fenced.check at concurrency 1 and 3: %+v", len(results), results)
	}
	var ops int64
	for i, r := range results {
		if r.Scenario != "fenced.check" || r.Floor != bench.FloorFencedWrite || r.Concurrency != []int{1, 3}[i] {
			t.Errorf("result %d = %+v", i, r)
		}
		if r.Ops <= 0 || r.OpsPerSec <= 0 || r.FloorOpsPerSec <= 0 || r.Ratio <= 0 || r.P50 <= 0 || r.P50 > r.P99 {
			t.Errorf("c=%d: implausible measurement %+v", r.Concurrency, r)
		}
		ops += r.Ops
	}
	// Every counted op committed one fenced write: the worker's token rose by one and the
	// register accepted it. The floor ran too.
	if writes != ops || rowTokens != ops || registerTokens != ops {
		t.Errorf("%d ops counted, but %d writes, row tokens summing to %d and register tokens to %d: want all equal",
			ops, writes, rowTokens, registerTokens)
	}
	if workers != 3 || registers != 3 {
		t.Errorf("%d worker rows and %d registers, want one per worker (3)", workers, registers)
	}
	if floorWrites == 0 {
		t.Errorf("%s wrote nothing", bench.FloorFencedWrite)
	}
}

// TestFencedCheckFailsWhenRefused has a newer writer raise the register under the bench
// worker's feet: the next op's check is refused, and the bench must fail rather than count
// the refused op.
func TestFencedCheckFailsWhenRefused(t *testing.T) {
	t.Parallel()
	s, _ := bench.Lookup("fenced.check")
	newWorker := s.NewWorker
	s.Name = "test.fenced_check_overtaken"
	s.NewWorker = func(ctx context.Context, w bench.Worker) (bench.Op, error) {
		op, err := newWorker(ctx, w)
		if err != nil {
			return nil, err
		}
		calls := 0
		return func(ctx context.Context) error {
			if calls++; calls == 3 {
				if _, err := w.Conn.Exec(ctx, `UPDATE pgcoord_fences SET fence_token = fence_token + 1000`); err != nil {
					return err
				}
			}
			return op(ctx)
		}, nil
	}
	_, err := bench.Run(t.Context(), poolConfig(t), []bench.Scenario{s}, &bench.Options{
		Concurrency: []int{1},
		Duration:    time.Second,
	})
	if !errors.Is(err, fenced.ErrStale) || !strings.Contains(err.Error(), "refused") {
		t.Fatalf("Run error = %v, want the refused check (ErrStale)", err)
	}
}
