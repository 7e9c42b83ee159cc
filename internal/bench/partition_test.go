package bench_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/internal/bench"
	"github.com/pgcoord/pgcoord/internal/pgconfig"
)

// TestRunPartitionHandoff runs both handoff scenarios briefly and checks that they
// measured what they claim: against leases.handoff, at concurrency 1 only; every op one
// handoff, whose new owner's first write was accepted by the partition's fence (the ledger
// counts one write per op, each under a higher token, of the partition that moved); and
// every member gone when the measurement ended.
func TestRunPartitionHandoff(t *testing.T) {
	t.Parallel()
	scenarios := bench.Select("partition.")
	if len(scenarios) != 2 || scenarios[0].Name != "partition.handoff" || scenarios[1].Name != "partition.handoff_expired" {
		t.Fatalf("Select(partition.) = %v, want partition.handoff and partition.handoff_expired", scenarios)
	}
	type ledger struct {
		rows, writes int64
		partition    int
	}
	got := map[string]ledger{}
	var members int64
	results, err := bench.Run(t.Context(), poolConfig(t), scenarios, &bench.Options{
		Concurrency: []int{1, 2},
		Duration:    300 * time.Millisecond,
		AfterRun: func(ctx context.Context, pool *pgxpool.Pool) error {
			for _, s := range scenarios {
				var l ledger
				if err := pool.QueryRow(ctx, `SELECT count(*), coalesce(sum(writes), 0)::bigint, coalesce(min(partition), -1)
					FROM bench_partition_writes WHERE grp LIKE $1 || '/%'`, s.Name).Scan(&l.rows, &l.writes, &l.partition); err != nil {
					return err
				}
				got[s.Name] = l
			}
			return pool.QueryRow(ctx, `SELECT count(*) FROM pgcoord_partition_members`).Scan(&members)
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(results) != 2 {
		t.Fatalf("%d results, want one per scenario (concurrency 1 only): %+v", len(results), results)
	}
	// The partition that moves at each death: the dying member's.
	moves := map[string]int{"partition.handoff": 0, "partition.handoff_expired": 1}
	for _, r := range results {
		t.Logf("%-26s c=%d %6.1f handoffs/s p50 %-10v p99 %-10v floor %s %.1f ops/s", r.Scenario, r.Concurrency, r.OpsPerSec,
			r.P50, r.P99, r.Floor, r.FloorOpsPerSec)
		if r.Concurrency != 1 || r.Floor != "leases.handoff" || r.Ops <= 0 || r.OpsPerSec <= 0 || r.FloorOpsPerSec <= 0 {
			t.Errorf("%s: %+v, want a measurement at c=1 against leases.handoff", r.Scenario, r)
		}
		if r.P50 <= 0 || r.P50 > r.P99 {
			t.Errorf("%s: p50 %v, p99 %v: want 0 < p50 <= p99", r.Scenario, r.P50, r.P99)
		}
		l := got[r.Scenario]
		if l.rows != 1 || l.writes != r.Ops || l.partition != moves[r.Scenario] {
			t.Errorf("%s: the ledger has %d rows (lowest partition %d) with %d writes for %d handoffs: want one row, "+
				"of partition %d, with one write per handoff", r.Scenario, l.rows, l.partition, l.writes, r.Ops, moves[r.Scenario])
		}
	}
	if members != 0 {
		t.Errorf("%d members left in the groups after the measurements", members)
	}
}

// TestRunScalePartitionRebalance runs scale.partition_rebalance on its test shapes (8
// partitions over 2 members, 100 over 10) and checks from the grants made that each op
// was the rebalance it counts: a join that moved the new member's quota (2 and 9
// partitions) and a leave that gave them back, each moved partition granted once each way,
// every op counted as the group's partitions, and the group granted as loaded at the end.
// (The smaller size is the larger's floor: its ops ran in the larger's measurement too.)
func TestRunScalePartitionRebalance(t *testing.T) {
	t.Parallel()
	scenarios := bench.Select(bench.ScalePrefix + "partition_rebalance.")
	if len(scenarios) != 2 || scenarios[0].Name != "scale.partition_rebalance.64" || scenarios[1].Name != "scale.partition_rebalance.10k" ||
		scenarios[1].Floor != scenarios[0].Name || scenarios[0].MaxConcurrency != 1 {
		t.Fatalf("Select(scale.partition_rebalance.) = %+v", scenarios)
	}
	// Per scenario: the group's partitions and members, and how many partitions a join moves.
	shape := map[string]struct{ partitions, members, moved int64 }{
		"scale.partition_rebalance.64": {8, 2, 2}, "scale.partition_rebalance.10k": {100, 10, 9},
	}
	type after struct{ granted, grants, members, joiner int64 }
	got := map[string]after{}
	results, err := bench.Run(t.Context(), poolConfig(t), scenarios, &bench.Options{
		Concurrency: []int{1, 2},
		Duration:    300 * time.Millisecond,
		AfterRun: func(ctx context.Context, pool *pgxpool.Pool) error {
			var benchSchema string
			if err := pool.QueryRow(ctx, `SELECT current_schema()`).Scan(&benchSchema); err != nil {
				return err
			}
			for name := range shape {
				schema := pgconfig.QuoteIdent(benchSchema + "_" + strings.ReplaceAll(strings.TrimPrefix(name, bench.ScalePrefix), ".", "_"))
				var a after
				if err := pool.QueryRow(ctx, fmt.Sprintf(`SELECT
					(SELECT count(*) FROM %[1]s.pgcoord_partitions WHERE holder = target AND holder LIKE 'member-%%'),
					(SELECT sum(grants)::bigint FROM %[1]s.pgcoord_partitions),
					(SELECT count(*) FROM %[1]s.pgcoord_partition_members),
					(SELECT count(*) FROM %[1]s.pgcoord_partition_members WHERE member = 'joiner')`, schema)).
					Scan(&a.granted, &a.grants, &a.members, &a.joiner); err != nil {
					return fmt.Errorf("%s: %w", name, err)
				}
				got[name] = a
			}
			return nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(results) != 2 {
		t.Fatalf("%d results, want one per size (concurrency 1 only)", len(results))
	}
	for _, r := range results {
		s, a := shape[r.Scenario], got[r.Scenario]
		t.Logf("%s: %.0f partitions/s, p50 %v, ratio %.3f to %s", r.Scenario, r.OpsPerSec, r.P50, r.Ratio, r.Floor)
		if r.Concurrency != 1 || r.Ops <= 0 || r.Ops%s.partitions != 0 || r.Ratio <= 0 {
			t.Errorf("%s: %+v: want ops counted %d per op, at c=1", r.Scenario, r, s.partitions)
		}
		// One grant per partition at loading, then each op grants the moved partitions to
		// the new member and back; the smallest size also ran as the other's floor.
		ops, floorOps := r.Ops/s.partitions, (a.grants-s.partitions)/(2*s.moved)-r.Ops/s.partitions
		if (a.grants-s.partitions)%(2*s.moved) != 0 || floorOps < 0 || (floorOps > 0) != (r.Floor == "floor.select1") {
			t.Errorf("%s: %d grants in all for %d ops: want %d and %d for each op it ran as a floor (one per partition "+
				"at loading, then each op granting %d partitions to the new member and back)", r.Scenario, a.grants, ops,
				s.partitions+2*s.moved*ops, 2*s.moved, s.moved)
		}
		if a.granted != s.partitions || a.members != s.members || a.joiner != 0 {
			t.Errorf("%s: %d of %d partitions granted to their planned loaded member, %d members (%d the joiner): "+
				"want the group as loaded, %d members", r.Scenario, a.granted, s.partitions, a.members, a.joiner, s.members)
		}
	}
}
