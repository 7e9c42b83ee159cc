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
