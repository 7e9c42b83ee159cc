package leases_test

import (
	"bytes"
	"context"
	"runtime"
	"runtime/debug"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/leases"
)

// A blocked Acquire, or Do, keeps little of its stack in use, so the garbage collector
// halves the stack its statement grew (8 KiB to 4 KiB): 1,000 parked waiters hold less than
// 6 KiB of stack each. Not parallel: the stacks of other tests' goroutines would blur the
// reading. Not under -race, whose larger stack guard keeps any stack from shrinking to 4 KiB.
func TestParkedWaitersStacksShrink(t *testing.T) {
	if raceBuild() {
		t.Skip("-race: the stack guard is doubled, so stacks do not shrink to 4 KiB")
	}
	opts := leases.AcquireOpts{PollInterval: time.Hour}
	t.Run("Acquire", func(t *testing.T) {
		parkedStacks(t, func(ctx context.Context, pool *pgxpool.Pool, name string) error {
			_, err := leases.Acquire(ctx, pool, name, time.Minute, &opts)
			return err
		})
	})
	t.Run("Do", func(t *testing.T) {
		parkedStacks(t, func(ctx context.Context, pool *pgxpool.Pool, name string) error {
			return leases.Do(ctx, pool, name, time.Minute, func(context.Context, leases.Lease) error { return nil },
				&leases.DoOpts{AcquireOpts: opts})
		})
	})
}

// parkedStacks holds 1,000 calls of wait blocked on a held lease, and fails t unless their
// stacks shrank to less than 6 KiB each.
func parkedStacks(t *testing.T, wait func(ctx context.Context, pool *pgxpool.Pool, name string) error) {
	const n, name = 1000, "parked"
	pool := pgtest.Pool(t)
	mustAcquire(t, pool, name, time.Hour, nil)
	stack0 := stackInuse()
	wctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for range n {
		wg.Go(func() {
			err := wait(wctx, pool, name)
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

// parkedWaiters counts the goroutines blocked in a lease's wait (Acquire's or Do's),
// reading all stacks into buf.
func parkedWaiters(buf []byte) int {
	buf = buf[:runtime.Stack(buf, true)]
	n := 0
	for g := range bytes.SplitSeq(buf, []byte("\n\n")) {
		if bytes.Contains(g, []byte("[select")) && bytes.Contains(g, []byte("listen.(*Waiter).Wait(")) &&
			bytes.Contains(g, []byte("leases.(*acquisition).run(")) {
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
