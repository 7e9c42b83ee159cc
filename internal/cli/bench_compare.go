package cli

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	"golang.org/x/perf/benchmath"
)

// Bounds of what `pgcoord bench --compare` reads.
const (
	maxCompareFile = 64 << 20 // bytes per file
	maxCompareLine = 1 << 20  // bytes per line
)

// compareAlpha is the significance level of --compare's tests, as benchstat's.
const compareAlpha = 0.05

// benchKey identifies a result: a scenario at a concurrency.
type benchKey struct {
	bench       string
	concurrency int
}

func (k benchKey) String() string { return fmt.Sprintf("%s c=%d", k.bench, k.concurrency) }

// benchFile is the results of one `pgcoord bench --json` run, in the order written.
type benchFile struct {
	path    string
	keys    []benchKey
	results map[benchKey]benchJSON
}

// readBenchFile reads a file written by `pgcoord bench --json`. It refuses a file over
// maxCompareFile bytes, a line over maxCompareLine, a line that is not a bench result, two
// results of one scenario at one concurrency, and a file with no result.
func readBenchFile(path string) (benchFile, error) {
	bf := benchFile{path: path, results: map[benchKey]benchJSON{}}
	f, err := os.Open(path)
	if err != nil {
		return bf, err
	}
	defer f.Close()
	if st, err := f.Stat(); err == nil && st.Mode().IsRegular() && st.Size() > maxCompareFile {
		return bf, fmt.Errorf("%s: %d bytes; --compare reads files of up to %d MiB", path, st.Size(), maxCompareFile>>20)
	}
	lr := &io.LimitedReader{R: f, N: maxCompareFile + 1} // a pipe has no size to check first
	sc := bufio.NewScanner(lr)
	sc.Buffer(make([]byte, 0, 64<<10), maxCompareLine+1) // the line and its newline
	line := 0
	for sc.Scan() {
		line++
		if lr.N <= 0 {
			break
		}
		text := strings.TrimSpace(sc.Text())
		if text == "" {
			continue
		}
		j, err := parseBenchLine([]byte(text))
		if err != nil {
			return bf, fmt.Errorf("%s:%d: %w", path, line, err)
		}
		k := benchKey{j.Bench, j.Concurrency}
		if _, dup := bf.results[k]; dup {
			return bf, fmt.Errorf("%s:%d: a second result for %s; --compare takes one run per file", path, line, k)
		}
		bf.keys = append(bf.keys, k)
		bf.results[k] = j
	}
	if lr.N <= 0 {
		return bf, fmt.Errorf("%s: more than %d MiB; --compare reads files of up to %d MiB", path, maxCompareFile>>20, maxCompareFile>>20)
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return bf, fmt.Errorf("%s:%d: a line over %d MiB: not a file written by 'pgcoord bench --json'", path, line+1, maxCompareLine>>20)
		}
		return bf, fmt.Errorf("%s: %w", path, err)
	}
	if len(bf.keys) == 0 {
		return bf, fmt.Errorf("%s: no result: want a file written by 'pgcoord bench --json'", path)
	}
	return bf, nil
}

// parseBenchLine parses one result line of `pgcoord bench --json`.
func parseBenchLine(line []byte) (benchJSON, error) {
	var j benchJSON
	if err := json.Unmarshal(line, &j); err != nil {
		return j, fmt.Errorf("not a JSON object written by 'pgcoord bench --json': %v", err)
	}
	if j.Bench == "" || j.Concurrency < 1 || j.OpsPerSec <= 0 || j.Ratio <= 0 {
		return j, errors.New("not a result of 'pgcoord bench --json': want bench, concurrency, a positive ops_per_sec and ratio")
	}
	// Files written before the per-round values have neither; the test then has one sample.
	if len(j.RoundOpsPerSec) != len(j.FloorRoundOpsPerSec) {
		return j, fmt.Errorf("%s: %d round_ops_per_sec but %d floor_round_ops_per_sec: want one of each per round",
			benchKey{j.Bench, j.Concurrency}, len(j.RoundOpsPerSec), len(j.FloorRoundOpsPerSec))
	}
	for i := range j.RoundOpsPerSec {
		if j.RoundOpsPerSec[i] <= 0 || j.FloorRoundOpsPerSec[i] <= 0 {
			return j, fmt.Errorf("%s: round %d: want positive throughputs", benchKey{j.Bench, j.Concurrency}, i+1)
		}
	}
	return j, nil
}

// roundRatios returns the per-round ratios of j (each round of the scenario over the floor's
// round beside it), or its ratio alone when j has no per-round values.
func roundRatios(j benchJSON) []float64 {
	if len(j.RoundOpsPerSec) == 0 {
		return []float64{j.Ratio}
	}
	out := make([]float64, len(j.RoundOpsPerSec))
	for i, a := range j.RoundOpsPerSec {
		out[i] = a / j.FloorRoundOpsPerSec[i]
	}
	return out
}

// roundOps returns the per-round throughputs of j, or its median alone.
func roundOps(j benchJSON) []float64 {
	if len(j.RoundOpsPerSec) == 0 {
		return []float64{j.OpsPerSec}
	}
	return slices.Clone(j.RoundOpsPerSec)
}

// compareSamples tests whether old and new come from one distribution (Mann-Whitney U).
func compareSamples(old, new []float64) benchmath.Comparison {
	th := benchmath.Thresholds{CompareAlpha: compareAlpha}
	return benchmath.AssumeNothing.Compare(benchmath.NewSample(slices.Clone(old), &th), benchmath.NewSample(slices.Clone(new), &th))
}

// compareBench prints, for each scenario and concurrency in both files, the old and new
// ratio to the floor and ops/s, the change and its significance; then the results in only
// one file. It fails when the files have no result in common.
func (a *app) compareBench(oldPath, newPath string) error {
	old, err := readBenchFile(oldPath)
	if err != nil {
		return err
	}
	cur, err := readBenchFile(newPath)
	if err != nil {
		return err
	}
	var notes []string // footnotes: the tests' warnings, each once
	note := func(c benchmath.Comparison) string {
		s := c.String()
		for _, w := range c.Warnings {
			i := slices.Index(notes, w.Error())
			if i < 0 {
				notes = append(notes, w.Error())
				i = len(notes) - 1
			}
			s += fmt.Sprintf(" (%d)", i+1)
		}
		return s
	}
	tw := a.table()
	fmt.Fprintln(tw, "SCENARIO\tWORKERS\tOLD RATIO\tNEW RATIO\tCHANGE\tTEST\tOLD OPS/S\tNEW OPS/S\tCHANGE\tTEST")
	common := 0
	for _, k := range old.keys {
		n, ok := cur.results[k]
		if !ok {
			continue
		}
		common++
		o := old.results[k]
		rc := compareSamples(roundRatios(o), roundRatios(n))
		oc := compareSamples(roundOps(o), roundOps(n))
		fmt.Fprintf(tw, "%s\t%d\t%.3f\t%.3f\t%s\t%s\t%.1f\t%.1f\t%s\t%s\n", k.bench, k.concurrency,
			o.Ratio, n.Ratio, rc.FormatDelta(o.Ratio, n.Ratio), note(rc),
			o.OpsPerSec, n.OpsPerSec, oc.FormatDelta(o.OpsPerSec, n.OpsPerSec), note(oc))
	}
	if common > 0 {
		tw.Flush()
	}
	for i, n := range notes {
		fmt.Fprintf(a.out, "(%d) %s\n", i+1, n)
	}
	for _, only := range [][2]benchFile{{old, cur}, {cur, old}} {
		var missing []string
		for _, k := range only[0].keys {
			if _, ok := only[1].results[k]; !ok {
				missing = append(missing, k.String())
			}
		}
		if len(missing) > 0 {
			fmt.Fprintf(a.out, "only in %s: %s\n", only[0].path, strings.Join(missing, ", "))
		}
	}
	if common == 0 {
		return fmt.Errorf("%s and %s have no scenario at a concurrency in common", oldPath, newPath)
	}
	return nil
}
