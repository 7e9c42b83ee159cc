package cli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/pgcoord/pgcoord/internal/bench"
	"github.com/pgcoord/pgcoord/internal/cli"
	"github.com/pgcoord/pgcoord/internal/pgtest"
)

func runBench(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = cli.Run(context.Background(), args, &out, &errOut)
	return code, out.String(), errOut.String()
}

func TestBenchJSONLines(t *testing.T) {
	t.Parallel()
	code, out, errOut := runBench(t, "--database-url-file", urlFile(t, pgtest.URL(t)),
		"bench", "--json", "--only", "floor", "--duration", "300ms", "--concurrency", "1,2")
	if code != cli.ExitOK {
		t.Fatalf("bench = %d, stdout %q, stderr %q", code, out, errOut)
	}
	if errOut != "" {
		t.Errorf("bench wrote %q to stderr, which is not a terminal", errOut)
	}
	wantKeys := []string{"allocs_per_op", "bench", "bytes_per_op", "concurrency", "floor", "floor_ops_per_sec", "floor_round_ops_per_sec",
		"ops_per_sec", "p50_ms", "p99_ms", "ratio", "round_ops_per_sec", "rounds"}
	seen := map[string]bool{}
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	for _, line := range lines {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("line %q is not one JSON object: %v", line, err)
		}
		if keys := slices.Sorted(maps.Keys(m)); !slices.Equal(keys, wantKeys) {
			t.Fatalf("line %q has keys %v, want %v", line, keys, wantKeys)
		}
		var r struct {
			Bench          string    `json:"bench"`
			Concurrency    int       `json:"concurrency"`
			OpsPerSec      float64   `json:"ops_per_sec"`
			P50MS          float64   `json:"p50_ms"`
			P99MS          float64   `json:"p99_ms"`
			Floor          string    `json:"floor"`
			FloorOpsPerSec float64   `json:"floor_ops_per_sec"`
			Ratio          float64   `json:"ratio"`
			Rounds         int       `json:"rounds"`
			AllocsPerOp    float64   `json:"allocs_per_op"`
			BytesPerOp     float64   `json:"bytes_per_op"`
			RoundOps       []float64 `json:"round_ops_per_sec"`
			FloorRoundOps  []float64 `json:"floor_round_ops_per_sec"`
		}
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatal(err)
		}
		if r.AllocsPerOp <= 0 || r.BytesPerOp <= 0 {
			t.Errorf("%s: want positive allocs_per_op and bytes_per_op", line)
		}
		if r.Rounds < 1 || len(r.RoundOps) != r.Rounds || len(r.FloorRoundOps) != r.Rounds {
			t.Errorf("%s: want one per-round throughput of the scenario and of the floor per round", line)
		}
		seen[fmt.Sprintf("%s/%d", r.Bench, r.Concurrency)] = true
		if r.OpsPerSec <= 0 || r.FloorOpsPerSec <= 0 || r.P50MS <= 0 || r.P50MS > r.P99MS {
			t.Errorf("implausible result %s", line)
		}
		if want := r.OpsPerSec / r.FloorOpsPerSec; math.Abs(r.Ratio-want) > 0.001*want+0.0001 {
			t.Errorf("%s: ratio %v, want ops/floor = %v", line, r.Ratio, want)
		}
		if r.Bench == "floor.select1" && (r.Floor != "floor.select1" || r.Ratio != 1) {
			t.Errorf("%s: floor.select1 is its own reference, want floor floor.select1 and ratio 1", line)
		}
		if r.Bench == "floor.lease" && r.Floor != "floor.select1" {
			t.Errorf("%s: want floor.lease measured against floor.select1", line)
		}
	}
	for _, k := range []string{"floor.select1/1", "floor.select1/2", "floor.lease/1", "floor.lease/2"} {
		if !seen[k] {
			t.Errorf("no result line for %s in %q", k, out)
		}
	}
	if len(lines) != 4 {
		t.Errorf("%d lines, want 4: %q", len(lines), out)
	}
}

func TestBenchTable(t *testing.T) {
	t.Parallel()
	code, out, errOut := runBench(t, "--database-url-file", urlFile(t, pgtest.URL(t)),
		"bench", "--only", "floor.select1", "--duration", "100ms", "--concurrency", "1")
	if code != cli.ExitOK {
		t.Fatalf("bench = %d, stdout %q, stderr %q", code, out, errOut)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2 || !strings.HasPrefix(lines[0], "SCENARIO") || !strings.HasPrefix(lines[1], "floor.select1 ") ||
		!strings.HasSuffix(lines[1], " 1.000") {
		t.Errorf("bench printed %q, want a header and one floor.select1 row with ratio 1.000", out)
	}
}

func TestBenchList(t *testing.T) {
	t.Parallel()
	// --list needs no database: the URL points nowhere.
	code, out, errOut := runBench(t, "--database-url", "postgres://nobody@127.0.0.1:1/none", "bench", "--list")
	if code != cli.ExitOK || !strings.Contains(out, "floor.select1") || !strings.Contains(out, "floor.lease") {
		t.Fatalf("bench --list = %d, stdout %q, stderr %q", code, out, errOut)
	}
	if strings.Contains(out, "scale.") {
		t.Errorf("bench --list shows scale scenarios, which only --scale runs: %q", out)
	}
	// --scale lists the scale scenarios and nothing else; --only narrows among them.
	code, out, errOut = runBench(t, "--database-url", "postgres://nobody@127.0.0.1:1/none", "bench", "--list", "--scale", "--only", "next")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if code != cli.ExitOK || len(lines) != 4 || !strings.Contains(out, "scale.next.10k ") {
		t.Fatalf("bench --list --scale --only next = %d, stdout %q, stderr %q; want a header and the three sizes", code, out, errOut)
	}
	for _, l := range lines[1:] {
		if !strings.HasPrefix(l, "scale.next.") {
			t.Errorf("bench --list --scale --only next listed %q", l)
		}
	}
	code, out, errOut = runBench(t, "--json", "bench", "--list", "--only", "floor.lease")
	var s struct{ Bench, Floor, Description string }
	if code != cli.ExitOK || json.Unmarshal([]byte(out), &s) != nil || s.Bench != "floor.lease" || s.Floor != "floor.select1" || s.Description == "" {
		t.Fatalf("bench --list --json --only floor.lease = %d, stdout %q, stderr %q", code, out, errOut)
	}
}

func TestBenchUsageErrors(t *testing.T) {
	t.Parallel()
	// Usage is checked before connecting: the URL points nowhere.
	for _, args := range [][]string{
		{"--duration", "0"},
		{"--duration", "-1s"},
		{"--only", "nomatch"},
		{"--concurrency", "0"},
		{"--concurrency", "1,x"},
		{"--concurrency", ""},
		{"extra"},
		{"--soak", "0"},
		{"--soak", "25h"},
		{"--soak", "1s", "--interval", "2s"},
		{"--soak", "1s", "--concurrency", "1,2"},
		{"--soak", "1s", "--concurrency", "65"},
		{"--soak", "1s", "--duration", "1s"},
		{"--soak", "1s", "--scale"},
		{"--soak", "1s", "--only", "floor"},
		{"--pin-xmin"},
		{"--interval", "1s"},
		{"--floors"},
		{"--memory", "--floors"},
		{"--memory", "--waiters", "0"},
		{"--memory", "--leases", "-1"},
		{"--memory", "--only", "leases"},
		{"--memory", "--soak", "1s"},
		{"--memory", "--concurrency", "1,2"},
		{"--memory", "--concurrency", "1001"},
		{"--waiters", "10"},
		{"--leases", "10"},
	} {
		all := append([]string{"--database-url", "postgres://nobody@127.0.0.1:1/none", "bench"}, args...)
		code, out, errOut := runBench(t, all...)
		if code != cli.ExitUsage || out != "" || !strings.Contains(errOut, "pgcoord: ") {
			t.Errorf("bench %v = %d, stdout %q, stderr %q; want exit %d and a message", args, code, out, errOut, cli.ExitUsage)
		}
	}
}

// --soak runs the soak scenarios that --only selects side by side, with the xmin pinned,
// one JSON object per interval, then the steady ratios.
func TestBenchSoakJSON(t *testing.T) {
	t.Parallel()
	lines := soakJSONLines(t, "--only", "leases", "--pin-xmin")
	for i, line := range lines[:2] {
		var iv struct {
			Interval   int                `json:"interval"`
			OpsPerSec  map[string]float64 `json:"ops_per_sec"`
			DeadTuples *int64             `json:"dead_tuples"`
			XminAge    *int64             `json:"xmin_age"`
		}
		if err := json.Unmarshal([]byte(line), &iv); err != nil {
			t.Fatal(err)
		}
		if iv.Interval != i+1 || iv.OpsPerSec["leases.acquire_release"] <= 0 || len(iv.OpsPerSec) != 1 ||
			iv.DeadTuples == nil || iv.XminAge == nil || *iv.XminAge <= 0 {
			t.Errorf("interval line %q: want interval %d, leases.acquire_release's ops/s alone, dead tuples and a pinned snapshot's age", line, i+1)
		}
	}
	var steady struct {
		Steady map[string]float64 `json:"steady"`
	}
	if err := json.Unmarshal([]byte(lines[2]), &steady); err != nil || steady.Steady["leases.acquire_release"] <= 0 {
		t.Errorf("last line %q: want the steady ratio of leases.acquire_release (%v)", lines[2], err)
	}
}

// --soak --floors runs each selected scenario's raw-SQL floor beside it, reports both
// every interval and both steady ratios, and names each scenario's floor.
func TestBenchSoakFloors(t *testing.T) {
	t.Parallel()
	lines := soakJSONLines(t, "--only", "fenced", "--floors")
	both := []string{"fenced.check", bench.FloorFencedWrite}
	for _, line := range lines[:2] {
		var iv struct {
			OpsPerSec map[string]float64 `json:"ops_per_sec"`
		}
		if err := json.Unmarshal([]byte(line), &iv); err != nil {
			t.Fatal(err)
		}
		if len(iv.OpsPerSec) != 2 || iv.OpsPerSec[both[0]] <= 0 || iv.OpsPerSec[both[1]] <= 0 {
			t.Errorf("interval line %q: want the ops/s of %v", line, both)
		}
	}
	var last struct {
		Steady map[string]float64 `json:"steady"`
		Floors map[string]string  `json:"floors"`
	}
	if err := json.Unmarshal([]byte(lines[2]), &last); err != nil {
		t.Fatal(err)
	}
	if last.Steady[both[0]] <= 0 || last.Steady[both[1]] <= 0 || len(last.Floors) != 1 || last.Floors[both[0]] != both[1] {
		t.Errorf("last line %q: want the steady ratios of %v and fenced.check's floor named", lines[2], both)
	}
}

// soakJSONLines runs a 2-second soak with one worker a scenario and args, reported every
// second in JSON, and returns its three lines: two intervals, then the steady ratios.
func soakJSONLines(t *testing.T, args ...string) []string {
	t.Helper()
	all := append([]string{"--database-url-file", urlFile(t, pgtest.URL(t)),
		"bench", "--json", "--soak", "2s", "--interval", "1s", "--concurrency", "1"}, args...)
	code, out, errOut := runBench(t, all...)
	if code != cli.ExitOK {
		t.Fatalf("bench --soak %v = %d, stdout %q, stderr %q", args, code, out, errOut)
	}
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if len(lines) != 3 {
		t.Fatalf("bench --soak %v printed %d lines, want two intervals and the steady ratios: %q", args, len(lines), out)
	}
	return lines
}

// --memory measures the waiters' memory and the renewals' CPU, as one JSON object. It runs
// in the test process, whose heap the other tests share: not in parallel with them, which
// could free more than its 200 waiters take between its two readings.
func TestBenchMemoryJSON(t *testing.T) {
	code, out, errOut := runBench(t, "--database-url-file", urlFile(t, pgtest.URL(t)),
		"bench", "--json", "--memory", "--waiters", "200", "--leases", "100", "--concurrency", "4")
	if code != cli.ExitOK {
		t.Fatalf("bench --memory = %d, stdout %q, stderr %q", code, out, errOut)
	}
	var m map[string]float64
	if err := json.Unmarshal([]byte(out), &m); err != nil {
		t.Fatalf("%q: %v", out, err)
	}
	if m["waiters"] != 200 || m["leases"] != 100 || m["heap_per_waiter_bytes"] <= 0 || m["cpu_per_renewal_us"] <= 0 ||
		m["renewals_per_sec"] <= 0 {
		t.Errorf("bench --memory printed %q", out)
	}
	if _, ok := m["rss_per_waiter_bytes"]; !ok {
		t.Errorf("no rss_per_waiter_bytes in %q", out)
	}
}
