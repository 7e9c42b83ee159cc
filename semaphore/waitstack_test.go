package semaphore_test

import (
	"bytes"
	"context"
	"runtime"
	"runtime/debug"
	"sync"
	"testing"
	"time"

	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/semaphore"
)

// A blocked Acquire keeps little of its stack in use, so the garbage collector halves the
// stack its statements grew (8 KiB to 4 KiB): 1,000 parked waiters hold less than 6 KiB of
// stack each. Not parallel: the stacks of other tests' goroutines would blur the reading.
// Not under -race, whose larger stack guard keeps any stack from shrinking to 4 KiB.
func TestParkedWaitersStacksShrink(t *testing.T) {
	if raceBuild() {
		t.Skip("-race: the stack guard is doubled, so stacks do not shrink to 4 KiB")
	}
	const n, key = 1000, "parked"
	pool := pgtest.Pool(t)
	mustTry(t, pool, key, 1, time.Hour, nil)
	opts := semaphore.AcquireOpts{PollInterval: time.Hour}
	stack0 := stackInuse()
	wctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for range n {
		wg.Go(func() {
			_, err := semaphore.Acquire(wctx, pool, key, 1, time.Minute, &opts)
			if wctx.Err() == nil {
				errs <- err
			}
		})
	}
	defer func() { stop(); wg.Wait() }()
	buf := make([]byte, 16<<20)
	pgtest.UntilProgress(t, "every waiter parked in its wait", func() (bool, int64) {
		select {
		case err := <-errs:
			t.Fatalf("a waiter returned: %v", err)
		default:
		}
		parked := parkedWaiters(buf)
		return parked == n, int64(parked)
	})
	perWaiter := float64(stackInuse()-stack0) / n
	t.Logf("stack per parked waiter: %.0f bytes", perWaiter)
	if perWaiter >= 6<<10 {
		t.Fatalf("parked waiters hold %.0f bytes of stack each, want < 6 KiB (their stacks did not shrink)", perWaiter)
	}
}

// stackInuse returns the goroutine stacks' memory after the collections that shrink the
// stacks of parked goroutines that use less than a quarter of theirs.
func stackInuse() int64 {
	for range 3 {
		runtime.GC()
	}
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.StackInuse)
}

// parkedWaiters counts the goroutines blocked in Acquire's wait, reading all stacks into
// buf.
func parkedWaiters(buf []byte) int {
	buf = buf[:runtime.Stack(buf, true)]
	n := 0
	for g := range bytes.SplitSeq(buf, []byte("\n\n")) {
		if bytes.Contains(g, []byte("[select")) && bytes.Contains(g, []byte("listen.(*Waiter).Wait(")) &&
			bytes.Contains(g, []byte("semaphore.Acquire(")) {
			n++
		}
	}
	return n
}

func raceBuild() bool {
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
