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

// The scale scenarios are left out of the default selection; each size loads its rows (a
// thousandth of them in tests) into a schema of its own, measured against the smallest
// size; every op does its work; Run drops every schema it made.
func TestRunScale(t *testing.T) {
	t.Parallel()
	for _, s := range bench.Select("") {
		if strings.HasPrefix(s.Name, bench.ScalePrefix) {
			t.Errorf("the default selection has the scale scenario %s", s.Name)
		}
	}
	// Per scenario: its floor, and the rows its schema holds (its size / 1000, at least 1).
	want := map[string]struct {
		floor string
		rows  int64
	}{
		"scale.next.10": {"floor.select1", 1}, "scale.next.1k": {"scale.next.10", 1}, "scale.next.10k": {"scale.next.10", 10},
		"scale.add_demand.10": {"floor.select1", 1}, "scale.add_demand.1k": {"scale.add_demand.10", 1},
		"scale.add_demand.10k": {"scale.add_demand.10", 10},
		"scale.leases.1k":      {"floor.select1", 1}, "scale.leases.100k": {"scale.leases.1k", 100},
		"scale.leases.1m":     {"scale.leases.1k", 1000},
		"scale.idempotency.0": {"floor.select1", 0}, "scale.idempotency.1m": {"scale.idempotency.0", 1000},
		// scale.relays: the standing backlog stands at its size (200) after every op.
		"scale.relays.1": {"floor.select1", 200}, "scale.relays.2": {"scale.relays.1", 200},
		"scale.relays.4": {"scale.relays.1", 200}, "scale.relays.8": {"scale.relays.1", 200},
		"scale.outbox_drain.0": {"floor.select1", 0}, "scale.outbox_drain.1m": {"scale.outbox_drain.0", 1000},
		"scale.outbox_parked.0": {"floor.select1", 0}, "scale.outbox_parked.1k": {"scale.outbox_parked.0", 1},
		"scale.outbox_parked.10k": {"scale.outbox_parked.0", 10},
		"scale.ratelimit.1k":      {"floor.select1", 1}, "scale.ratelimit.1m": {"scale.ratelimit.1k", 1000},
		"scale.schedules_due_scan.100": {"floor.select1", 1}, "scale.schedules_due_scan.1k": {"scale.schedules_due_scan.100", 1},
		"scale.schedules_due_scan.10k": {"scale.schedules_due_scan.100", 10},
		"scale.schedules_pass.100":     {"floor.select1", 1}, "scale.schedules_pass.1k": {"scale.schedules_pass.100", 1},
		"scale.schedules_pass.10k": {"scale.schedules_pass.100", 10},
		// Shaped for tests: 8 partitions over 2 members, 100 over 10; granted as loaded after every op.
		"scale.partition_rebalance.64": {"floor.select1", 8}, "scale.partition_rebalance.10k": {"scale.partition_rebalance.64", 100},
	}
	scenarios := bench.Select(bench.ScalePrefix)
	if len(scenarios) != len(want) {
		t.Fatalf("Select(%q) = %d scenarios, want %d", bench.ScalePrefix, len(scenarios), len(want))
	}
	for _, s := range scenarios {
		if w, ok := want[s.Name]; !ok || s.Floor != w.floor || s.Setup == nil {
			t.Fatalf("%s: floor %q, want %q, with a Setup", s.Name, s.Floor, w.floor)
		}
	}
	// The loaded rows of each size's schema, read before Run drops them.
	rows := map[string]int64{}
	var benchSchema string
	cfg := poolConfig(t)
	results, err := bench.Run(t.Context(), cfg, scenarios, &bench.Options{
		Concurrency: []int{1, 2},
		Duration:    200 * time.Millisecond,
		AfterRun: func(ctx context.Context, pool *pgxpool.Pool) error {
			if err := pool.QueryRow(ctx, `SELECT current_schema()`).Scan(&benchSchema); err != nil {
				return err
			}
			for name := range want {
				family, _, _ := strings.Cut(strings.TrimPrefix(name, bench.ScalePrefix), ".")
				schema := pgconfig.QuoteIdent(benchSchema + "_" + strings.ReplaceAll(strings.TrimPrefix(name, bench.ScalePrefix), ".", "_"))
				count := map[string]string{
					"next":        `SELECT count(*) FROM %s.pgcoord_semaphores WHERE key LIKE 'tenant-%%'`,
					"add_demand":  `SELECT count(*) FROM %s.pgcoord_semaphores WHERE key LIKE 'tenant-%%' AND key NOT LIKE 'tenant-w%%'`,
					"leases":      `SELECT count(*) FROM %s.pgcoord_leases WHERE name LIKE 'job/%%'`,
					"idempotency": `SELECT count(*) FROM %s.pgcoord_idempotency_keys WHERE key LIKE 'stored-%%'`,
					"relays":      `SELECT count(*) FROM %s.pgcoord_outbox WHERE state = 'pending'`,
					// Loaded delivered, never claimed; what the ops wrote was claimed.
					"outbox_drain": `SELECT count(*) FROM %s.pgcoord_outbox WHERE state = 'delivered' AND claim_token IS NULL`,
					// Loaded parked, passed over since: still pending, never claimed.
					"outbox_parked": `SELECT count(*) FROM %s.pgcoord_outbox WHERE state = 'pending' AND key LIKE 'parked-%%' AND claim_token IS NULL`,
					// Loaded live (a day ahead), charged since: still live.
					"ratelimit": `SELECT count(*) FROM %s.pgcoord_ratelimit_state WHERE policy = 'bench_scale' AND key LIKE 'k%%' AND tat > pgcoord_clock()`,
					// Loaded armed, looked at since, never claimed.
					"schedules_due_scan":  `SELECT count(*) FROM %s.pgcoord_schedules WHERE name LIKE 'due/%%' AND due_at IS NOT NULL`,
					"schedules_pass":      `SELECT count(*) FROM %s.pgcoord_schedules WHERE name LIKE 'due/%%' AND due_at IS NOT NULL`,
					"partition_rebalance": `SELECT count(*) FROM %s.pgcoord_partitions WHERE holder = target AND holder LIKE 'member-%%'`,
				}[family]
				var n int64
				if err := pool.QueryRow(ctx, fmt.Sprintf(count, schema)).Scan(&n); err != nil {
					return fmt.Errorf("%s: %w", name, err)
				}
				rows[name] = n
			}
			return nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	measured := map[string]int{}
	for _, r := range results {
		if r.Floor != want[r.Scenario].floor || r.Ops <= 0 || r.Ratio <= 0 || r.P50 <= 0 {
			t.Errorf("%s c=%d: implausible %+v", r.Scenario, r.Concurrency, r)
		}
		measured[r.Scenario]++
	}
	for name, w := range want {
		// A relays op runs its relays side by side, and a partition group rebalances one
		// change at a time: measured with one worker only.
		one := strings.HasPrefix(name, "scale.relays.") || strings.HasPrefix(name, "scale.partition_rebalance.")
		if c := map[bool]int{true: 1, false: 2}[one]; measured[name] != c {
			t.Errorf("%s: measured at %d concurrencies, want %d", name, measured[name], c)
		}
		if rows[name] != w.rows {
			t.Errorf("%s: its schema holds %d loaded rows, want %d", name, rows[name], w.rows)
		}
	}
	if benchSchema == "" {
		t.Fatal("AfterRun did not run")
	}
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	var left []string
	if err := pool.QueryRow(t.Context(), `SELECT coalesce(array_agg(nspname), '{}') FROM pg_namespace WHERE starts_with(nspname, $1)`,
		benchSchema).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if len(left) > 0 {
		t.Errorf("schemas left after Run: %v", left)
	}
}
