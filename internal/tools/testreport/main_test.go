package main

import (
	"bytes"
	"strings"
	"testing"
)

func TestReport(t *testing.T) {
	cases := []struct {
		name     string
		in       string
		wantCode int
		want     []string
	}{
		{
			name: "all pass",
			in: `{"Action":"run","Package":"p","Test":"TestA"}
{"Action":"pass","Package":"p","Test":"TestA","Elapsed":0.1}
{"Action":"run","Package":"p","Test":"TestB"}
{"Action":"output","Package":"p","Test":"TestB","Output":"    b_test.go:9: no chromium\n"}
{"Action":"skip","Package":"p","Test":"TestB"}
{"Action":"pass","Package":"p","Elapsed":0.3}
{"Action":"output","Package":"q","Output":"?   \tq\t[no test files]\n"}
{"Action":"skip","Package":"q"}
`,
			wantCode: 0,
			want:     []string{"ok   p 1 passed, 1 skipped", "skip TestB: b_test.go:9: no chromium", "tests: 1 passed, 0 failed, 1 skipped"},
		},
		{
			name: "a failure shows its output",
			in: `{"Action":"run","Package":"p","Test":"TestA"}
{"Action":"output","Package":"p","Test":"TestA","Output":"    a_test.go:5: got 2, want 1\n"}
{"Action":"fail","Package":"p","Test":"TestA","Elapsed":0.1}
{"Action":"fail","Package":"p","Elapsed":0.2}
`,
			wantCode: 1,
			want:     []string{"--- FAIL p TestA", "got 2, want 1", "tests: 0 passed, 1 failed, 0 skipped"},
		},
		{
			name: "a package with tests that ran none fails",
			in: `{"Action":"output","Package":"p","Output":"testing: warning: no tests to run\n"}
{"Action":"pass","Package":"p","Elapsed":0.01}
`,
			wantCode: 1,
			want:     []string{"FAIL p: has tests but ran none of them"},
		},
		{
			name: "a crashed binary fails",
			in: `{"Action":"run","Package":"p","Test":"TestA"}
{"Action":"output","Package":"p","Test":"TestA","Output":"panic: boom\n"}
`,
			wantCode: 1,
			want:     []string{"FAIL p: no result"},
		},
		{
			name: "a build failure fails",
			in: `{"ImportPath":"p","Action":"build-output","Output":"p/x.go:3: undefined: y\n"}
{"ImportPath":"p","Action":"build-fail"}
{"Action":"fail","Package":"p","Elapsed":0}
`,
			wantCode: 1,
			want:     []string{"undefined: y", "FAIL p"},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var out bytes.Buffer
			code := report(strings.NewReader(c.in), &out)
			if code != c.wantCode {
				t.Errorf("exit %d, want %d\n%s", code, c.wantCode, out.String())
			}
			for _, w := range c.want {
				if !strings.Contains(out.String(), w) {
					t.Errorf("report lacks %q:\n%s", w, out.String())
				}
			}
		})
	}
}
