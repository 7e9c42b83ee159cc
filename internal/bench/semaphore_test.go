package bench_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/internal/bench"
	"github.com/pgcoord/pgcoord/semaphore"
)

// TestRunSemaphore runs the semaphore scenarios and their floors briefly at concurrency 1
// and 8 and checks that each was measured against the floor it names and did the work it
// claims: every counted op of acquire_release and contended is one admission (the keys'
// counters say so), nothing is left held, and the contended scenarios never held more than
// the limit at once — while holding more than one, so the check is not vacuous.
func TestRunSemaphore(t *testing.T) {
	t.Parallel()
	wantFloor := map[string]string{
		"semaphore.acquire_release":   bench.FloorSemaphoreAdmission,
		"semaphore.contended":         bench.FloorSemaphoreContended,
		bench.FloorSemaphoreAdmission: "floor.select1",
		bench.FloorSemaphoreContended: "floor.select1",
	}
	scenarios := bench.Select("semaphore.")
	if len(scenarios) != len(wantFloor) {
		t.Fatalf("Select(semaphore.) = %d scenarios, want %d", len(scenarios), len(wantFloor))
	}
	type after struct {
		admittedAR, admittedContended int64
		held, floorHeld               int64
		maxHeld, maxFloorHeld         int64
	}
	var got after
	results, err := bench.Run(t.Context(), poolConfig(t), scenarios, &bench.Options{
		Concurrency: []int{1, 8},
		Duration:    300 * time.Millisecond,
		AfterRun: func(ctx context.Context, pool *pgxpool.Pool) error {
			got.maxHeld = bench.SemaphoreMaxHeld(pool, "semaphore.contended")
			got.maxFloorHeld = bench.SemaphoreMaxHeld(pool, bench.FloorSemaphoreContended)
			s, err := semaphore.Get(ctx, pool, bench.SemaphoreContendedKey)
			if err != nil {
				return err
			}
			if s.Limit != bench.SemaphoreLimit || s.Held != 0 || s.Expired != 0 {
				return fmt.Errorf("contended key after the bench: %+v, want limit %d and nothing held", s, bench.SemaphoreLimit)
			}
			got.admittedContended = s.Admitted
			return pool.QueryRow(ctx, `SELECT
				(SELECT coalesce(sum(admitted), 0) FROM pgcoord_semaphores WHERE key LIKE 'semaphore.acquire\_release/%'),
				(SELECT count(*) FROM pgcoord_semaphore_permits),
				(SELECT coalesce(sum(held), 0) + (SELECT count(*) FROM bench_semaphore_permits)
					+ (SELECT count(*) FROM bench_semaphore_slots WHERE holder IS NOT NULL) FROM bench_semaphore_keys)`).
				Scan(&got.admittedAR, &got.held, &got.floorHeld)
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	var opsAR, opsContended int64
	seen := map[string]int{}
	for _, r := range results {
		seen[r.Scenario]++
		if want, ok := wantFloor[r.Scenario]; !ok || r.Floor != want {
			t.Errorf("%s c=%d: measured against %q, want %q", r.Scenario, r.Concurrency, r.Floor, want)
		}
		if r.Ops <= 0 || r.OpsPerSec <= 0 || r.FloorOpsPerSec <= 0 || r.Ratio <= 0 {
			t.Errorf("%s c=%d: empty measurement %+v", r.Scenario, r.Concurrency, r)
		}
		switch r.Scenario {
		case "semaphore.acquire_release":
			opsAR += r.Ops
		case "semaphore.contended":
			opsContended += r.Ops
		}
		t.Logf("%-28s c=%d %9.1f ops/s p50 %-10v p99 %-10v floor %-28s %9.1f ops/s ratio %.3f",
			r.Scenario, r.Concurrency, r.OpsPerSec, r.P50, r.P99, r.Floor, r.FloorOpsPerSec, r.Ratio)
	}
	for name := range wantFloor {
		if seen[name] != 2 {
			t.Errorf("%s: %d results, want one per concurrency (2)", name, seen[name])
		}
	}
	if got.admittedAR != opsAR || got.admittedContended != opsContended {
		t.Errorf("admissions: acquire_release %d, contended %d; want one per counted op: %d, %d",
			got.admittedAR, got.admittedContended, opsAR, opsContended)
	}
	if got.held != 0 || got.floorHeld != 0 {
		t.Errorf("after the bench: %d pgcoord permits and %d floor permits or slots still held, want none", got.held, got.floorHeld)
	}
	t.Logf("most permits held at once: semaphore.contended %d, %s %d (limit %d)",
		got.maxHeld, bench.FloorSemaphoreContended, got.maxFloorHeld, bench.SemaphoreLimit)
	for name, m := range map[string]int64{"semaphore.contended": got.maxHeld, bench.FloorSemaphoreContended: got.maxFloorHeld} {
		if m > bench.SemaphoreLimit {
			t.Errorf("%s held %d permits at once, more than the limit of %d (and its ops did not fail)", name, m, bench.SemaphoreLimit)
		}
		if m < 2 {
			t.Errorf("%s held at most %d permit at once with 8 workers: the limit was never exercised", name, m)
		}
	}
}

// TestSemaphoreBenchesListed checks the registrations: one-line descriptions, floors that
// exist and are named under the feature, and the contended scenario saying what its ops
// count.
func TestSemaphoreBenchesListed(t *testing.T) {
	t.Parallel()
	for _, s := range bench.Select("semaphore.") {
		if _, ok := bench.Lookup(s.Floor); !ok {
			t.Errorf("%s: floor %q is not registered", s.Name, s.Floor)
		}
		if s.Description == "" || strings.Contains(s.Description, "\n") {
			t.Errorf("%s: description %q, want one line", s.Name, s.Description)
		}
	}
	if s, _ := bench.Lookup("semaphore.contended"); !strings.Contains(s.Description, "permits granted/s") {
		t.Errorf("semaphore.contended must say that its ops are permits granted: %q", s.Description)
	}
}
