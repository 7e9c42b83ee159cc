package pgtest

import (
	"bytes"
	"context"
	"runtime"
	"runtime/debug"
	"sync"
	"testing"
)

// ParkedStacks starts n calls of wait, each in a goroutine of its own, waits until every
// one is parked — blocked in a select in listen's Waiter.Wait, with frame (such as
// "leases.(*acquisition).run(") on its stack — and fails t unless the goroutines' stacks,
// after the collections that shrink the stacks of parked goroutines using less than a
// quarter of theirs, hold less than limit bytes each. The calls are cancelled when it
// returns; one that returns before that fails t. Call it from a test that is not parallel
// (the stacks of other tests' goroutines would blur the reading), and not under -race
// (RaceBuild), whose doubled stack guard keeps any stack from shrinking to 4 KiB.
func ParkedStacks(t testing.TB, n int, frame string, limit int64, wait func(ctx context.Context) error) {
	t.Helper()
	stack0 := stackInuse()
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for range n {
		wg.Go(func() {
			err := wait(ctx)
			if ctx.Err() == nil {
				errs <- err
			}
		})
	}
	defer func() { stop(); wg.Wait() }()
	buf := make([]byte, 16<<20)
	UntilProgress(t, "every waiter parked in its wait", func() (bool, int64) {
		select {
		case err := <-errs:
			t.Fatalf("a waiter returned: %v", err)
		default:
		}
		parked := parkedIn(buf, frame)
		return parked == n, int64(parked)
	})
	perWaiter := float64(stackInuse()-stack0) / float64(n)
	t.Logf("stack per parked waiter: %.0f bytes", perWaiter)
	if perWaiter >= float64(limit) {
		t.Fatalf("parked waiters hold %.0f bytes of stack each, want < %d (their stacks did not shrink)", perWaiter, limit)
	}
}

// RaceBuild says whether the test binary was built with -race.
func RaceBuild() bool {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return false
	}
	for _, s := range bi.Settings {
		if s.Key == "-race" {
			return s.Value == "true"
		}
	}
	return false
}

// stackInuse returns the goroutine stacks' memory after three collections.
func stackInuse() int64 {
	for range 3 {
		runtime.GC()
	}
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.StackInuse)
}

// parkedIn counts the goroutines blocked in listen's Waiter.Wait under frame, reading all
// stacks into buf.
func parkedIn(buf []byte, frame string) int {
	buf = buf[:runtime.Stack(buf, true)]
	n := 0
	for g := range bytes.SplitSeq(buf, []byte("\n\n")) {
		if bytes.Contains(g, []byte("[select")) && bytes.Contains(g, []byte("listen.(*Waiter).Wait(")) &&
			bytes.Contains(g, []byte(frame)) {
			n++
		}
	}
	return n
}
