package pgtest

import (
	"testing"
	"time"
)

// Until waits, at most WaitLimit, until cond holds, checking every 5 ms; past the limit it
// fails t, naming what it waited for. Tests wait for observed progress with it, never for
// a fixed time.
func Until(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(WaitLimit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %s", WaitLimit, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// UntilProgress waits until cond reports done, checking every 5 ms, for a workload whose
// speed depends on the machine: it fails t only when WaitLimit passes without the progress
// cond reports (a count of work done) changing. A busy machine slows the work down, which
// is no failure; work that stopped is.
func UntilProgress(t testing.TB, what string, cond func() (done bool, progress int64)) {
	t.Helper()
	done, last := cond()
	deadline := time.Now().Add(WaitLimit)
	for !done {
		if time.Now().After(deadline) {
			t.Fatalf("no progress within %v (at %d): %s", WaitLimit, last, what)
		}
		time.Sleep(5 * time.Millisecond)
		var p int64
		done, p = cond()
		if p != last {
			last, deadline = p, time.Now().Add(WaitLimit)
		}
	}
}
