// Command testreport reads `go test -json` on stdin and prints a short report: one line per
// package, the full output of every failed test, the reason of every skipped one, and a
// closing line "tests: N passed, N failed, N skipped". It exits non-zero when a test or a
// build failed, or when a package that has tests ran none of them (a suite that silently
// runs nothing must not look green).
//
//	go test -json ./... | go run ./internal/tools/testreport
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"
)

// event is one line of `go test -json` (see `go doc test2json`).
type event struct {
	Action     string
	Package    string
	Test       string
	Output     string
	Elapsed    float64
	ImportPath string
}

type pkgState struct {
	passed, failed, skipped int
	output                  strings.Builder             // package-level output
	tests                   map[string]*strings.Builder // per-test output, until the test ends
	done                    bool
	result                  string
	elapsed                 float64
}

func main() {
	os.Exit(report(os.Stdin, os.Stdout))
}

func report(in io.Reader, out io.Writer) int {
	pkgs := map[string]*pkgState{}
	var order []string
	get := func(name string) *pkgState {
		p, ok := pkgs[name]
		if !ok {
			p = &pkgState{tests: map[string]*strings.Builder{}}
			pkgs[name] = p
			order = append(order, name)
		}
		return p
	}
	var buildOutput strings.Builder
	bad := false
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 1<<20), 1<<26)
	for sc.Scan() {
		line := sc.Bytes()
		var e event
		if err := json.Unmarshal(line, &e); err != nil || e.Action == "" {
			fmt.Fprintln(out, string(line)) // not a test event: pass it through
			continue
		}
		if e.Action == "build-output" || e.Action == "build-fail" {
			buildOutput.WriteString(e.Output)
			if e.Action == "build-fail" {
				bad = true
			}
			continue
		}
		p := get(e.Package)
		if e.Test == "" {
			switch e.Action {
			case "output":
				p.output.WriteString(e.Output)
			case "pass", "fail", "skip":
				p.done, p.result, p.elapsed = true, e.Action, e.Elapsed
				printPackage(out, e.Package, p)
				if e.Action == "fail" {
					bad = true
				}
			}
			continue
		}
		buf, ok := p.tests[e.Test]
		if !ok {
			buf = &strings.Builder{}
			p.tests[e.Test] = buf
		}
		switch e.Action {
		case "output":
			buf.WriteString(e.Output)
		case "pass":
			p.passed++
			delete(p.tests, e.Test)
		case "skip":
			p.skipped++
			fmt.Fprintf(out, "    skip %s: %s\n", e.Test, skipReason(buf.String()))
			delete(p.tests, e.Test)
		case "fail":
			p.failed++
			fmt.Fprintf(out, "--- FAIL %s %s (%.2fs)\n%s", e.Package, e.Test, e.Elapsed, indent(buf.String()))
			delete(p.tests, e.Test)
		}
	}
	if buildOutput.Len() > 0 {
		fmt.Fprintf(out, "build output:\n%s", indent(buildOutput.String()))
	}
	var passed, failed, skipped int
	for _, name := range order {
		p := pkgs[name]
		passed, failed, skipped = passed+p.passed, failed+p.failed, skipped+p.skipped
		if !p.done {
			fmt.Fprintf(out, "FAIL %s: no result (the test binary crashed or was killed)\n%s", name, indent(p.output.String()))
			bad = true
		}
		if p.done && p.result != "fail" && ranNothing(p) {
			fmt.Fprintf(out, "FAIL %s: has tests but ran none of them\n", name)
			bad = true
		}
	}
	if err := sc.Err(); err != nil {
		fmt.Fprintf(out, "testreport: reading go test output: %v\n", err)
		bad = true
	}
	fmt.Fprintf(out, "tests: %d passed, %d failed, %d skipped\n", passed, failed, skipped)
	if bad || failed > 0 {
		return 1
	}
	return 0
}

// ranNothing reports a package whose binary ran but executed no test at all.
func ranNothing(p *pkgState) bool {
	o := p.output.String()
	if strings.Contains(o, "[no test files]") {
		return false
	}
	return p.passed+p.failed+p.skipped == 0
}

func printPackage(out io.Writer, name string, p *pkgState) {
	o := p.output.String()
	switch {
	case strings.Contains(o, "[no test files]"):
		return
	case p.result == "fail":
		fmt.Fprintf(out, "FAIL %s (%s)\n", name, elapsed(p.elapsed))
		// Output not attributed to a test: a panic in TestMain, a race report, ...
		var extra []string
		for _, l := range strings.Split(o, "\n") {
			if l != "" && !slices.Contains([]string{"FAIL", "PASS"}, strings.TrimSpace(l)) && !strings.HasPrefix(l, "FAIL\t") {
				extra = append(extra, l)
			}
		}
		if len(extra) > 0 {
			fmt.Fprint(out, indent(strings.Join(extra, "\n")+"\n"))
		}
		for name, buf := range p.tests { // tests still running when the binary failed
			fmt.Fprintf(out, "--- UNFINISHED %s\n%s", name, indent(buf.String()))
		}
	default:
		fmt.Fprintf(out, "ok   %s %d passed", name, p.passed)
		if p.skipped > 0 {
			fmt.Fprintf(out, ", %d skipped", p.skipped)
		}
		fmt.Fprintf(out, " (%s)\n", elapsed(p.elapsed))
	}
}

func skipReason(output string) string {
	for _, l := range strings.Split(output, "\n") {
		l = strings.TrimSpace(l)
		if l != "" && !strings.HasPrefix(l, "=== ") && !strings.HasPrefix(l, "--- SKIP") {
			return l
		}
	}
	return "(no reason given)"
}

func indent(s string) string {
	if s == "" {
		return ""
	}
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	for i, l := range lines {
		lines[i] = "    " + l
	}
	return strings.Join(lines, "\n") + "\n"
}

func elapsed(sec float64) string {
	return (time.Duration(sec * float64(time.Second))).Round(10 * time.Millisecond).String()
}
