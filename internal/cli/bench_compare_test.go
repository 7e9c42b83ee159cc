package cli_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/pgcoord/pgcoord/internal/cli"
)

// nowhere is a database URL that connects nowhere: --compare must not need one.
const nowhere = "postgres://nobody@127.0.0.1:1/none"

// benchLine is one line of `pgcoord bench --json` with the given per-round throughputs of
// the scenario and of its floor (medians as the bench computes them).
func benchLine(t *testing.T, name string, c int, rounds, floorRounds []float64) string {
	t.Helper()
	med := func(xs []float64) float64 {
		s := append([]float64(nil), xs...)
		for i := range s { // insertion sort: a few values
			for j := i; j > 0 && s[j] < s[j-1]; j-- {
				s[j], s[j-1] = s[j-1], s[j]
			}
		}
		if len(s)%2 == 1 {
			return s[len(s)/2]
		}
		return (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	ops, floor := med(rounds), med(floorRounds)
	b, err := json.Marshal(map[string]any{
		"bench": name, "concurrency": c, "ops_per_sec": ops, "p50_ms": 0.5, "p99_ms": 1.5,
		"floor": "floor.select1", "floor_ops_per_sec": floor, "ratio": ops / floor, "rounds": len(rounds),
		"allocs_per_op": 40, "bytes_per_op": 2600, "round_ops_per_sec": rounds, "floor_round_ops_per_sec": floorRounds,
	})
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// writeFile writes lines to a file of the test's temporary directory and returns its path.
func writeFile(t *testing.T, name string, lines ...string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// compareRow returns the table row of scenario name at c workers, split into its columns.
func compareRow(t *testing.T, out, name, c string) []string {
	t.Helper()
	for _, l := range strings.Split(out, "\n") {
		f := regexp.MustCompile(`\s{2,}`).Split(strings.TrimSpace(l), -1)
		if len(f) >= 2 && f[0] == name && f[1] == c {
			return f
		}
	}
	t.Fatalf("no row for %s c=%s in %q", name, c, out)
	return nil
}

func TestBenchCompare(t *testing.T) {
	t.Parallel()
	floor := []float64{1000, 1100, 900, 1050, 950, 1000, 1020, 980}
	slow := []float64{500, 550, 450, 525, 475, 500, 510, 490}   // ratio 0.5 each round
	fast := []float64{800, 880, 720, 840, 760, 800, 816, 784}   // ratio 0.8 each round
	noisy := []float64{520, 540, 470, 515, 480, 505, 500, 495}  // ratio about 0.5
	few, fewFloor := []float64{500, 510}, []float64{1000, 1000} // two rounds
	old := writeFile(t, "old.jsonl",
		benchLine(t, "leases.acquire_release", 1, slow, floor),
		benchLine(t, "fenced.check", 8, slow, floor),
		benchLine(t, "idempotency.first", 1, few, fewFloor),
		benchLine(t, "outbox.enqueue", 1, slow, floor),
	)
	cur := writeFile(t, "new.jsonl",
		benchLine(t, "leases.acquire_release", 1, fast, floor),
		benchLine(t, "fenced.check", 8, noisy, floor),
		benchLine(t, "idempotency.first", 1, []float64{800, 820}, fewFloor),
		benchLine(t, "semaphore.acquire_release", 32, fast, floor),
	)
	code, out, errOut := run(t, "--database-url", nowhere, "bench", "--compare", old, cur)
	if code != cli.ExitOK || errOut != "" {
		t.Fatalf("bench --compare = %d, stdout %q, stderr %q", code, out, errOut)
	}
	if !strings.HasPrefix(out, "SCENARIO ") {
		t.Errorf("want a table header first, got %q", out)
	}
	// A clear improvement: every round's ratio went from 0.5 to 0.8.
	row := compareRow(t, out, "leases.acquire_release", "1")
	if want := []string{"leases.acquire_release", "1", "0.500", "0.800", "+60.00%", "p=0.000 n=8"}; !equalPrefix(row, want) {
		t.Errorf("improved row %q, want it to start with %q", row, want)
	}
	if len(row) != 10 || !strings.HasPrefix(row[8], "+60.00%") || !strings.HasPrefix(row[9], "p=0.000 n=8") {
		t.Errorf("improved row %q: want ops/s +60.00%% with p=0.000 n=8", row)
	}
	// Noise: not significant, "~" as benchstat prints it.
	row = compareRow(t, out, "fenced.check", "8")
	if len(row) != 10 || row[4] != "~" || !strings.HasPrefix(row[5], "p=") || !strings.HasSuffix(row[5], "n=8") {
		t.Errorf("noisy row %q: want ratio change ~ with its p and n=8", row)
	}
	// Two rounds cannot show anything, and a note says so.
	row = compareRow(t, out, "idempotency.first", "1")
	if len(row) != 10 || row[4] != "~" || !strings.Contains(row[5], "n=2 (") {
		t.Errorf("few-rounds row %q: want ~ with n=2 and a note", row)
	}
	if !strings.Contains(out, "need >= 4 samples to detect a difference at alpha level 0.05") {
		t.Errorf("no note about too few rounds in %q", out)
	}
	// A scenario in one file only is listed, not fatal.
	if !strings.Contains(out, "only in "+old+": outbox.enqueue c=1\n") || !strings.Contains(out, "only in "+cur+": semaphore.acquire_release c=32\n") {
		t.Errorf("want the scenarios of one file only listed, got %q", out)
	}

	// A run against itself: identical samples are not a change.
	code, out, errOut = run(t, "--database-url", nowhere, "bench", "--compare", old, old)
	if code != cli.ExitOK {
		t.Fatalf("bench --compare old old = %d, stdout %q, stderr %q", code, out, errOut)
	}
	for _, name := range []string{"leases.acquire_release", "fenced.check", "idempotency.first", "outbox.enqueue"} {
		if row := compareRow(t, out, name, map[bool]string{true: "8", false: "1"}[name == "fenced.check"]); row[4] != "~" || row[8] != "~" {
			t.Errorf("identical runs: row %q, want ~ for both changes", row)
		}
	}
	if strings.Contains(out, "only in") {
		t.Errorf("identical runs: %q lists a scenario in one file only", out)
	}
}

func equalPrefix(got, want []string) bool {
	if len(got) < len(want) {
		return false
	}
	for i := range want {
		if got[i] != want[i] {
			return false
		}
	}
	return true
}

// TestBenchCompareOldFile compares a file written before the per-round values: its one
// median is a sample of one, which cannot show a difference.
func TestBenchCompareOldFile(t *testing.T) {
	t.Parallel()
	old := writeFile(t, "old.jsonl", `{"bench":"floor.lease","concurrency":1,"ops_per_sec":2500,"p50_ms":0.4,"p99_ms":1.3,"floor":"floor.select1","floor_ops_per_sec":25000,"ratio":0.1,"rounds":4}`)
	cur := writeFile(t, "new.jsonl", benchLine(t, "floor.lease", 1, []float64{5000, 5000, 5000, 5000}, []float64{25000, 25000, 25000, 25000}))
	code, out, errOut := run(t, "--database-url", nowhere, "bench", "--compare", old, cur)
	if code != cli.ExitOK {
		t.Fatalf("bench --compare = %d, stdout %q, stderr %q", code, out, errOut)
	}
	if row := compareRow(t, out, "floor.lease", "1"); row[2] != "0.100" || row[3] != "0.200" || row[4] != "~" || !strings.Contains(row[5], "n=1+4") {
		t.Errorf("row %q: want 0.100 to 0.200, ~, n=1+4", row)
	}
}

func TestBenchCompareRefusesBadInput(t *testing.T) {
	t.Parallel()
	good := writeFile(t, "good.jsonl", benchLine(t, "floor.lease", 1, []float64{500, 510, 490}, []float64{1000, 1000, 1000}))
	huge := filepath.Join(t.TempDir(), "huge.jsonl")
	if err := os.WriteFile(huge, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(huge, 64<<20+1); err != nil { // sparse: nothing written
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		file string
		want string
	}{
		"text":         {writeFile(t, "text.txt", "SCENARIO WORKERS OPS/S"), ":1: not a JSON object written by 'pgcoord bench --json'"},
		"list":         {writeFile(t, "list.jsonl", `{"bench":"floor.lease","floor":"floor.select1","description":"x"}`), ":1: not a result of 'pgcoord bench --json'"},
		"broken line":  {writeFile(t, "broken.jsonl", benchLine(t, "floor.lease", 1, []float64{1}, []float64{2}), `{"bench":`), ":2: not a JSON object"},
		"long line":    {writeFile(t, "long.jsonl", `{"bench":"`+strings.Repeat("x", 1<<20)+`"}`), ":1: a line over 1 MiB"},
		"huge file":    {huge, "--compare reads files of up to 64 MiB"},
		"empty":        {writeFile(t, "empty.jsonl", ""), "no result"},
		"duplicate":    {writeFile(t, "dup.jsonl", benchLine(t, "floor.lease", 1, []float64{1}, []float64{2}), benchLine(t, "floor.lease", 1, []float64{1}, []float64{2})), ":2: a second result for floor.lease c=1"},
		"rounds apart": {writeFile(t, "apart.jsonl", `{"bench":"floor.lease","concurrency":1,"ops_per_sec":1,"ratio":0.5,"round_ops_per_sec":[1,1],"floor_round_ops_per_sec":[2]}`), "2 round_ops_per_sec but 1 floor_round_ops_per_sec"},
		"missing":      {filepath.Join(t.TempDir(), "none.jsonl"), "no such file"},
	} {
		for _, args := range [][]string{{tc.file, good}, {good, tc.file}} {
			code, out, errOut := run(t, "--database-url", nowhere, "bench", "--compare", args[0], args[1])
			if code != cli.ExitFailure || out != "" || !strings.Contains(errOut, tc.file) || !strings.Contains(errOut, tc.want) {
				t.Errorf("%s: bench --compare %v = %d, stdout %q, stderr %q; want exit 1 naming the file and %q", name, args, code, out, errOut, tc.want)
			}
		}
	}
	// Nothing in common: the lists, then a failure.
	other := writeFile(t, "other.jsonl", benchLine(t, "fenced.check", 1, []float64{1}, []float64{2}))
	code, out, errOut := run(t, "--database-url", nowhere, "bench", "--compare", good, other)
	if code != cli.ExitFailure || !strings.Contains(out, "only in "+good+": floor.lease c=1") || !strings.Contains(errOut, "no scenario at a concurrency in common") {
		t.Errorf("bench --compare with nothing in common = %d, stdout %q, stderr %q", code, out, errOut)
	}
	// Usage: two files, and no flag of a measurement.
	for _, args := range [][]string{{good}, {good, good, good}, {"--duration", "1s", good, good}, {"--only", "floor", good, good}, {"--json", good, good}} {
		all := append([]string{"--database-url", nowhere, "bench", "--compare"}, args...)
		if args[0] == "--json" {
			all = append([]string{"--json", "--database-url", nowhere, "bench", "--compare"}, args[1:]...)
		}
		code, out, errOut := run(t, all...)
		if code != cli.ExitUsage || out != "" || !strings.Contains(errOut, "pgcoord: ") {
			t.Errorf("bench --compare %v = %d, stdout %q, stderr %q; want a usage error", args, code, out, errOut)
		}
	}
}
