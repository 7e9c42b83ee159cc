package cli

import (
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/pgcoord/pgcoord/internal/bench"
)

// benchJSON is one result line of `pgcoord bench --json`.
type benchJSON struct {
	Bench          string  `json:"bench"`
	Concurrency    int     `json:"concurrency"`
	OpsPerSec      float64 `json:"ops_per_sec"`
	P50MS          float64 `json:"p50_ms"`
	P99MS          float64 `json:"p99_ms"`
	Floor          string  `json:"floor"`
	FloorOpsPerSec float64 `json:"floor_ops_per_sec"`
	Ratio          float64 `json:"ratio"`
	Rounds         int     `json:"rounds"`
	AllocsPerOp    float64 `json:"allocs_per_op"`
	BytesPerOp     float64 `json:"bytes_per_op"`
	// RoundOpsPerSec and FloorRoundOpsPerSec are the per-round throughputs behind
	// OpsPerSec and FloorOpsPerSec, for --compare's significance test.
	RoundOpsPerSec      []float64 `json:"round_ops_per_sec"`
	FloorRoundOpsPerSec []float64 `json:"floor_round_ops_per_sec"`
}

// scenarioJSON is one line of `pgcoord bench --list --json`.
type scenarioJSON struct {
	Bench       string `json:"bench"`
	Floor       string `json:"floor"`
	Description string `json:"description"`
}

func (a *app) benchCommand() *cobra.Command {
	var (
		only        string
		duration    time.Duration
		concurrency []int
		list        bool
		scale       bool
		compare     bool
		soak        time.Duration
		interval    time.Duration
		pinXmin     bool
		soakFloors  bool
		memory      bool
		waiters     int
		leaseCount  int
	)
	cmd := &cobra.Command{
		Use:   "bench [--compare OLD.jsonl NEW.jsonl]",
		Short: "Measure coordination operations against this database, each beside its raw-SQL floor",
		Long: `Measure pgcoord's coordination operations against this database, like pgbench.

Each scenario runs at each --concurrency (one connection per worker) for --duration,
alternating in short rounds with its floor: the same work done with the fewest plain SQL
statements (floor.select1, SELECT 1, is the round-trip floor and its own reference). The
cost of a commit drifts a lot over time, so the result is the median of the per-round
throughputs and the ratio of the two medians (1 = as fast as the floor). Latency
percentiles are of the scenario's operations.

--only selects the scenarios whose name starts with a prefix. A floor needed by a selected
scenario is measured beside it but reported only when it is selected itself.

--scale runs the scale scenarios instead (scale.*; --only then selects among them): one
operation at several sizes of the data beside it — tenants with demand for Next and
AddDemand, rows of the leases and idempotency tables, delivered outbox messages not yet
pruned, outbox keys parked behind a delayed message, relays sharing one backlog, live rate
limit keys, stored schedules for a Scheduler's look for due ticks and its whole pass, the
partitions and members of a partition group for a member's join and leave (counted per
partition) — each size in a schema of its own, measured against the smallest size. They
load up to a million rows per size (about a minute), and hold one more connection per
worker and size (per relay for the relays, which run with one worker only; a partition
group rebalances with one worker too): the default --concurrency is then 1,8.

The bench never touches pgcoord's tables: it creates a schema named pgcoord_bench_<hex>,
migrates pgcoord into it, and drops it at the end, also on error or Ctrl-C (--schema is
ignored). It needs the CREATE privilege on the database. A bench killed outright leaves
its schema behind; any pgcoord_bench_* schema can be dropped.

ALLOCS/OP and B/OP are the heap allocations and bytes per operation of the scenario: the
whole bench process's during the scenario's rounds, which are its workers' client-side cost.

With --json each result is one JSON object per line: bench, concurrency, ops_per_sec,
p50_ms, p99_ms, floor, floor_ops_per_sec, ratio, rounds, allocs_per_op, bytes_per_op,
round_ops_per_sec and floor_round_ops_per_sec (the per-round throughputs).

--compare OLD NEW reads two files written by --json and prints, for each scenario and
concurrency in both, the old and new ratio to the floor and ops/s, the change in percent
and a Mann-Whitney U test (benchstat's) over the per-round values: the per-round ratios
(each scenario round over the floor round beside it) and the per-round ops/s. The change
is "~" when the test finds no difference at alpha 0.05; TEST shows p and the number of
rounds (n), and numbered notes say when there were too few rounds to tell. Results in
only one file are listed. It runs no benchmark and needs no database; files over 64 MiB
and lines over 1 MiB are refused.

--soak DURATION runs one scenario of each primitive (` + "`" + `--only` + "`" + ` selects among them) side by side
for DURATION, each with --concurrency workers (one number; default 2), and every --interval
prints each one's throughput, the bench schema's dead and live tuples, and the age of the
oldest snapshot; at the end, each one's last interval against its first (goal: 0.8).
--pin-xmin holds a transaction open beside them the whole time, as a forgotten session or
a long report would: vacuum then removes nothing they leave behind. --floors runs each
one's raw-SQL floor beside it, with as many workers, and reports its steadiness too: a fall
the floor shares is the database's, not pgcoord's. With --json, one object per interval
(interval, end_s, ops_per_sec, dead_tuples, live_tuples, xmin_age), then one with steady
(and with --floors, floors: each scenario's floor).

--memory measures the client instead: the growth of this process's resident memory and
live heap, per waiter, while --waiters (10,000) leases.Acquire calls wait at once for one
held lease, and the CPU time per renewal of --leases (100,000) held leases renewed once each
from --concurrency (one number; default 64) goroutines through one pool of as many
connections. With --json: one object (waiters, rss_per_waiter_bytes,
heap_per_waiter_bytes, leases, renewals_per_sec, cpu_per_renewal_us).`,
		Example: `  pgcoord bench --list
  pgcoord bench --only floor --duration 2s --concurrency 1,8
  pgcoord bench --json > bench.jsonl
  pgcoord bench --compare old.jsonl new.jsonl
  pgcoord bench --soak 10m --pin-xmin
  pgcoord bench --memory
  pgcoord bench --scale --only scale.next`,
		Args: func(cmd *cobra.Command, args []string) error {
			if compare {
				if len(args) != 2 {
					return usagef("bench --compare takes two files written by 'pgcoord bench --json', OLD and NEW; got %d argument(s)", len(args))
				}
				return nil
			}
			return exactArgs(0)(cmd, args)
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if compare {
				for _, name := range []string{"only", "duration", "concurrency", "list", "scale"} {
					if cmd.Flags().Changed(name) {
						return usagef("--%s does not apply to --compare, which reads two runs and measures nothing", name)
					}
				}
				if a.json {
					return usagef("--compare prints a table; --json does not apply")
				}
				return a.compareBench(args[0], args[1])
			}
			if memory {
				workers, err := modeFlags("memory", cmd.Flags().Changed,
					[]string{"only", "duration", "list", "scale", "soak", "interval", "pin-xmin", "floors"},
					concurrency, 64, 1000, "the number of goroutines that renew")
				if err != nil {
					return err
				}
				return a.runMemory(cmd.Context(), waiters, leaseCount, workers)
			}
			for _, name := range []string{"waiters", "leases"} {
				if cmd.Flags().Changed(name) {
					return usagef("--%s applies to --memory only", name)
				}
			}
			if cmd.Flags().Changed("soak") {
				workers, err := modeFlags("soak", cmd.Flags().Changed, []string{"scale", "list", "compare", "duration"},
					concurrency, 2, 64, "each scenario's number of workers")
				if err != nil {
					return err
				}
				if soak <= 0 || soak > bench.MaxSoakDuration {
					return usagef("--soak %v: want a positive duration, at most %v", soak, bench.MaxSoakDuration)
				}
				if interval < 100*time.Millisecond || interval > soak {
					interval = min(max(interval, 100*time.Millisecond), soak)
					if cmd.Flags().Changed("interval") {
						return usagef("--interval: want 100ms to the soak's length %v", soak)
					}
				}
				return a.runSoak(cmd.Context(), only, soak, interval, workers, pinXmin, soakFloors)
			}
			for _, name := range []string{"pin-xmin", "interval", "floors"} {
				if cmd.Flags().Changed(name) {
					return usagef("--%s applies to --soak only", name)
				}
			}
			if duration <= 0 {
				return usagef("--duration %v: want a positive duration", duration)
			}
			if len(concurrency) == 0 {
				return usagef("--concurrency: want at least one number of workers")
			}
			for _, c := range concurrency {
				if c < 1 || c > bench.MaxConcurrency {
					return usagef("--concurrency %d: want 1 to %d workers", c, bench.MaxConcurrency)
				}
			}
			if scale {
				only = bench.ScalePrefix + strings.TrimPrefix(only, bench.ScalePrefix)
				if !cmd.Flags().Changed("concurrency") {
					concurrency = []int{1, 8}
				}
			}
			scenarios := bench.Select(only)
			if len(scenarios) == 0 {
				return usagef("--only %q matches no scenario; 'pgcoord bench --list' shows them", only)
			}
			if list {
				return a.listScenarios(scenarios)
			}

			cfg, err := a.poolConfig(int32(slices.Max(concurrency) + 1))
			if err != nil {
				return err
			}
			opts := &bench.Options{Concurrency: concurrency, Duration: duration}
			if isTerminal(a.errOut) {
				opts.Progress = func(p bench.Progress) {
					against := "its own reference"
					if p.Floor != p.Scenario {
						against = "alternating with " + p.Floor
					}
					fmt.Fprintf(a.errOut, "%s c=%d: %d rounds of %v, %s\n", p.Scenario, p.Concurrency, p.Rounds, p.RoundLength.Round(time.Millisecond), against)
				}
			}
			enc := json.NewEncoder(a.out) // one object per line
			var encErr error
			if a.json {
				opts.OnResult = func(r bench.Result) {
					if encErr == nil {
						encErr = enc.Encode(toBenchJSON(r))
					}
				}
			}
			results, err := bench.Run(cmd.Context(), cfg, scenarios, opts)
			if !a.json {
				a.printBenchTable(results) // what was measured, also when a later scenario failed
			}
			if err != nil {
				return err
			}
			return encErr
		},
	}
	f := cmd.Flags()
	f.StringVar(&only, "only", "", "run only the scenarios whose name starts with this prefix")
	f.DurationVar(&duration, "duration", bench.DefaultDuration, "measuring time per scenario per concurrency (its floor runs as long again, interleaved)")
	f.IntSliceVar(&concurrency, "concurrency", slices.Clone(bench.DefaultConcurrency), "comma-separated numbers of concurrent workers")
	f.BoolVar(&scale, "scale", false, "run the scale scenarios: each operation at several data sizes, against the smallest")
	f.BoolVar(&list, "list", false, "list the scenarios (with --only, the matching ones) and exit; needs no database")
	f.BoolVar(&compare, "compare", false, "compare two files written by --json, OLD and NEW (arguments), with a significance test; needs no database")
	f.DurationVar(&soak, "soak", 0, "run the soak for this long instead: one scenario of each primitive side by side, reported every --interval")
	f.DurationVar(&interval, "interval", bench.DefaultSoakInterval, "with --soak: how often to report throughput and dead tuples")
	f.BoolVar(&pinXmin, "pin-xmin", false, "with --soak: hold a transaction open beside the scenarios, so vacuum removes nothing they leave behind")
	f.BoolVar(&soakFloors, "floors", false, "with --soak: run each scenario's raw-SQL floor beside it and report its steadiness too")
	f.BoolVar(&memory, "memory", false, "measure the client's memory per blocked waiter and CPU per lease renewal instead")
	f.IntVar(&waiters, "waiters", bench.DefaultMemoryWaiters, "with --memory: how many leases.Acquire calls wait at once")
	f.IntVar(&leaseCount, "leases", bench.DefaultMemoryLeases, "with --memory: how many held leases are renewed once each")
	return cmd
}

func (a *app) listScenarios(scenarios []bench.Scenario) error {
	if a.json {
		enc := json.NewEncoder(a.out)
		for _, s := range scenarios {
			if err := enc.Encode(scenarioJSON{Bench: s.Name, Floor: floorOf(s), Description: s.Description}); err != nil {
				return err
			}
		}
		return nil
	}
	tw := a.table()
	fmt.Fprintln(tw, "SCENARIO\tFLOOR\tDESCRIPTION")
	for _, s := range scenarios {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", s.Name, floorOf(s), s.Description)
	}
	return tw.Flush()
}

// floorOf names s's reference: its floor, or itself.
func floorOf(s bench.Scenario) string {
	if s.Floor == "" {
		return s.Name
	}
	return s.Floor
}

func (a *app) printBenchTable(results []bench.Result) {
	if len(results) == 0 {
		return
	}
	tw := a.table()
	fmt.Fprintln(tw, "SCENARIO\tWORKERS\tOPS/S\tP50 MS\tP99 MS\tALLOCS/OP\tB/OP\tFLOOR\tFLOOR OPS/S\tRATIO")
	for _, r := range results {
		j := toBenchJSON(r)
		fmt.Fprintf(tw, "%s\t%d\t%.1f\t%.3f\t%.3f\t%.1f\t%.0f\t%s\t%.1f\t%.3f\n",
			j.Bench, j.Concurrency, j.OpsPerSec, j.P50MS, j.P99MS, j.AllocsPerOp, j.BytesPerOp, j.Floor, j.FloorOpsPerSec, j.Ratio)
	}
	tw.Flush()
}

func toBenchJSON(r bench.Result) benchJSON {
	return benchJSON{
		Bench:          r.Scenario,
		Concurrency:    r.Concurrency,
		OpsPerSec:      benchRound(r.OpsPerSec, 1),
		P50MS:          benchRound(float64(r.P50)/float64(time.Millisecond), 4),
		P99MS:          benchRound(float64(r.P99)/float64(time.Millisecond), 4),
		Floor:          r.Floor,
		FloorOpsPerSec: benchRound(r.FloorOpsPerSec, 1),
		Ratio:          benchRound(r.Ratio, 4),
		Rounds:         r.Rounds,
		AllocsPerOp:    benchRound(r.AllocsPerOp, 1),
		BytesPerOp:     benchRound(r.BytesPerOp, 0),
		// [] rather than null when a result has no rounds
		RoundOpsPerSec:      roundAll(r.RoundOpsPerSec, 1),
		FloorRoundOpsPerSec: roundAll(r.FloorRoundOpsPerSec, 1),
	}
}

// roundAll returns xs, each rounded to the given number of decimals, never nil.
func roundAll(xs []float64, decimals int) []float64 {
	out := make([]float64, len(xs))
	for i, x := range xs {
		out[i] = benchRound(x, decimals)
	}
	return out
}

// benchRound rounds x to the given number of decimals.
func benchRound(x float64, decimals int) float64 {
	p := math.Pow10(decimals)
	return math.Round(x*p) / p
}
