package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/pgcoord/pgcoord/internal/bench"
)

// soakJSON is one line of `pgcoord bench --soak --json`: an interval, or (last) the
// steady ratios.
type soakJSON struct {
	Interval   int                `json:"interval,omitempty"`
	EndS       float64            `json:"end_s,omitempty"`
	OpsPerSec  map[string]float64 `json:"ops_per_sec,omitempty"`
	DeadTuples *int64             `json:"dead_tuples,omitempty"`
	LiveTuples *int64             `json:"live_tuples,omitempty"`
	XminAge    *int64             `json:"xmin_age,omitempty"`
	Steady     map[string]float64 `json:"steady,omitempty"`
	Floors     map[string]string  `json:"floors,omitempty"`
}

// soakGoal is what a soak's steady ratio should reach (issue 32): the last interval's
// throughput at least 0.8 of the first's.
const soakGoal = 0.8

// The modes of bench beside its measurement against floors: --soak and --memory.

// runSoak runs `pgcoord bench --soak`: the soak scenarios that match only, each with
// workers workers, for d, reporting every interval; with floors, each one's floor beside it.
func (a *app) runSoak(ctx context.Context, only string, d, interval time.Duration, workers int, pinXmin, floors bool) error {
	var names []string
	for _, n := range bench.SoakScenarios {
		if strings.HasPrefix(n, only) {
			names = append(names, n)
		}
	}
	if len(names) == 0 {
		return usagef("--only %q matches none of the soak's scenarios (%s)", only, strings.Join(bench.SoakScenarios, ", "))
	}
	all := names
	floorOf := map[string]string{}
	if floors {
		all = slices.Clone(names)
		for _, n := range names {
			s, _ := bench.Lookup(n)
			if s.Floor != "" && s.Floor != n {
				floorOf[n] = s.Floor
				if !slices.Contains(all, s.Floor) {
					all = append(all, s.Floor)
				}
			}
		}
	}
	scenarios, err := bench.SoakNames(all)
	if err != nil {
		return err
	}
	cfg, err := a.poolConfig(int32(len(scenarios)*workers + 2))
	if err != nil {
		return err
	}
	width := 0
	for _, n := range all {
		width = max(width, len(n))
	}
	enc := json.NewEncoder(a.out)
	var encErr error
	opts := &bench.SoakOptions{Duration: d, Interval: interval, Workers: workers, PinXmin: pinXmin}
	opts.OnInterval = func(iv bench.SoakInterval) {
		if a.json {
			if encErr == nil {
				encErr = enc.Encode(soakJSON{Interval: iv.N, EndS: iv.End.Seconds(), OpsPerSec: roundMap(iv.OpsPerSec),
					DeadTuples: &iv.DeadTuples, LiveTuples: &iv.LiveTuples, XminAge: &iv.XminAge})
			}
			return
		}
		end := iv.End.Round(time.Second)
		for _, n := range all {
			fmt.Fprintf(a.out, "%-8v %-*s %10.1f ops/s\n", end, width, n, iv.OpsPerSec[n])
		}
		fmt.Fprintf(a.out, "%-8v dead tuples %d, live %d; oldest snapshot %d transactions old\n",
			end, iv.DeadTuples, iv.LiveTuples, iv.XminAge)
	}
	res, err := bench.Soak(ctx, cfg, scenarios, opts)
	if err != nil {
		return err
	}
	if a.json {
		if encErr == nil {
			js := soakJSON{Steady: roundMap(res.Steady)}
			if floors {
				js.Floors = floorOf
			}
			encErr = enc.Encode(js)
		}
		return encErr
	}
	fmt.Fprintf(a.out, "\nlast interval against the first (goal >= %.1f):\n", soakGoal)
	tw := a.table()
	for _, n := range names {
		verdict := "meets the goal"
		if res.Steady[n] < soakGoal {
			verdict = "below the goal"
		}
		fmt.Fprintf(tw, "%s\t%.3f\t%s", n, res.Steady[n], verdict)
		if f, ok := floorOf[n]; ok {
			fmt.Fprintf(tw, "\tits floor %s\t%.3f", f, res.Steady[f])
		}
		fmt.Fprintln(tw)
	}
	return tw.Flush()
}

// roundMap rounds each value of m to 3 decimals, for JSON.
func roundMap(m map[string]float64) map[string]float64 {
	out := make(map[string]float64, len(m))
	for k, v := range m {
		out[k] = benchRound(v, 3)
	}
	return out
}

// modeFlags checks the flags of one of bench's other modes (--soak, --memory): it refuses
// those in apart, and reads --concurrency as one number, 1 to most (def when not given),
// which is the mode's what.
func modeFlags(mode string, changed func(string) bool, apart []string, concurrency []int, def, most int, what string) (int, error) {
	for _, name := range apart {
		if changed(name) {
			return 0, usagef("--%s does not apply to --%s", name, mode)
		}
	}
	if !changed("concurrency") {
		return def, nil
	}
	if len(concurrency) != 1 || concurrency[0] < 1 || concurrency[0] > most {
		return 0, usagef("--concurrency with --%s is %s: one number, 1 to %d", mode, what, most)
	}
	return concurrency[0], nil
}

// memoryJSON is the line of `pgcoord bench --memory --json`.
type memoryJSON struct {
	Waiters            int     `json:"waiters"`
	RSSPerWaiterBytes  float64 `json:"rss_per_waiter_bytes"`
	HeapPerWaiterBytes float64 `json:"heap_per_waiter_bytes"`
	Leases             int     `json:"leases"`
	RenewalsPerSec     float64 `json:"renewals_per_sec"`
	CPUPerRenewalUS    float64 `json:"cpu_per_renewal_us"`
}

// memoryGoal is the bound on a blocked waiter's memory.
const memoryGoal = 8 << 10

// runMemory runs `pgcoord bench --memory`.
func (a *app) runMemory(ctx context.Context, waiters, leaseCount, workers int) error {
	if waiters < 1 || waiters > bench.MaxMemoryWaiters {
		return usagef("--waiters %d: want 1 to %d", waiters, bench.MaxMemoryWaiters)
	}
	if leaseCount < 1 || leaseCount > bench.MaxMemoryLeases {
		return usagef("--leases %d: want 1 to %d", leaseCount, bench.MaxMemoryLeases)
	}
	cfg, err := a.poolConfig(0)
	if err != nil {
		return err
	}
	res, err := bench.Memory(ctx, cfg, &bench.MemoryOptions{Waiters: waiters, Leases: leaseCount, Workers: workers})
	if err != nil {
		return err
	}
	if a.json {
		return json.NewEncoder(a.out).Encode(memoryJSON{
			Waiters: res.Waiters, RSSPerWaiterBytes: benchRound(res.RSSPerWaiter, 0), HeapPerWaiterBytes: benchRound(res.HeapPerWaiter, 0),
			Leases: res.Leases, RenewalsPerSec: benchRound(res.RenewalsPerSec, 1), CPUPerRenewalUS: benchRound(float64(res.CPUPerRenewal)/float64(time.Microsecond), 2),
		})
	}
	verdict := "meets the goal"
	if res.RSSPerWaiter >= memoryGoal {
		verdict = "over the goal"
	}
	fmt.Fprintf(a.out, "%d waiters blocked on one lease: resident memory +%.1f KiB each (goal < %d KiB: %s), live heap +%.1f KiB each\n",
		res.Waiters, res.RSSPerWaiter/1024, memoryGoal>>10, verdict, res.HeapPerWaiter/1024)
	fmt.Fprintf(a.out, "%d leases renewed once each from %d goroutines through one pool: %.0f renewals/s, CPU %.1f µs per renewal\n",
		res.Leases, workers, res.RenewalsPerSec, float64(res.CPUPerRenewal)/float64(time.Microsecond))
	return nil
}
