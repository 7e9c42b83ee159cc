//go:build unix

package workerproc

import (
	"fmt"
	"strings"
	"testing"
)

// A lineWriter hands out every line in order but keeps only the tail of the output for
// error messages, however much a long-running worker writes.
func TestLineWriterKeepsEveryLineButOnlyTheTail(t *testing.T) {
	w := newLineWriter()
	const n = 5000 // about 50 KB, many times tailSize
	for i := range n {
		fmt.Fprintf(w, "line %d\n", i)
	}
	if _, err := w.Write([]byte("last, unterminated")); err != nil {
		t.Fatal(err)
	}
	if len(w.tail) > 2*tailSize {
		t.Errorf("kept %d bytes, want at most %d", len(w.tail), 2*tailSize)
	}
	all := w.all()
	if !strings.HasPrefix(all, "...") || len(all) != tailSize+3 || !strings.HasSuffix(all, "line 4999\nlast, unterminated") {
		t.Errorf("all() = %d bytes %q...%q", len(all), all[:min(20, len(all))], all[max(0, len(all)-30):])
	}
	if got := w.lastLine(); got != "last, unterminated" {
		t.Errorf("lastLine() = %q", got)
	}
	w.close()
	i := 0
	for l := range w.lines {
		want := fmt.Sprintf("line %d", i)
		if i == n {
			want = "last, unterminated"
		}
		if l != want {
			t.Fatalf("line %d is %q, want %q", i, l, want)
		}
		i++
	}
	if i != n+1 {
		t.Errorf("%d lines, want %d", i, n+1)
	}
}
