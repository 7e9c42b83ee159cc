package semaphore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/semaphore"
)

// Metrics counts what the calls saw, per key: admissions with their latency, and refusals
// (TryAcquire's ErrFull; each refused attempt of a waiting Acquire).
func TestMetricsCountWhatCallsSaw(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	m := semaphore.NewMetrics()
	opts := &semaphore.AcquireOpts{Metrics: m, PollInterval: 20 * time.Millisecond}
	p := mustTry(t, pool, "a", 1, time.Minute, opts)
	if _, err := semaphore.TryAcquire(ctx, pool, "a", 1, time.Minute, opts); !errors.Is(err, semaphore.ErrFull) {
		t.Fatal(err)
	}
	// A waiting Acquire, given up after two refused attempts.
	wctx, giveUp := context.WithCancel(ctx)
	defer giveUp()
	waiting := pgtest.Go(func() (semaphore.Permit, error) { return semaphore.Acquire(wctx, pool, "a", 1, time.Minute, opts) })
	eventually(t, "two refused attempts of the waiting Acquire", func() bool { return refusals(m, "a") >= 3 })
	giveUp()
	if _, err := waiting.Wait(t); !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	if err := semaphore.Release(ctx, pool, p); err != nil {
		t.Fatal(err)
	}
	if _, err := semaphore.Acquire(ctx, pool, "a", 1, time.Minute, opts); err != nil {
		t.Fatal(err)
	}
	if err := semaphore.AddDemand(ctx, pool, "b", 1, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := semaphore.Next(ctx, pool, time.Minute, &semaphore.NextOpts{Metrics: m}); err != nil {
		t.Fatal(err)
	}
	s := m.Snapshot()
	if len(s) != 2 || s[0].Key != "a" || s[1].Key != "b" {
		t.Fatalf("snapshot: %+v", s)
	}
	a, b := s[0], s[1]
	// a: 2 admissions; refusals: 1 TryAcquire + at least 2 attempts of the waiting Acquire
	// that gave up.
	if a.Admissions != 2 || a.Refusals < 3 || a.AcquireP50 <= 0 || a.AcquireP99 < a.AcquireP50 {
		t.Fatalf("a: %+v", a)
	}
	if b.Admissions != 1 || b.Refusals != 0 || b.AcquireP50 <= 0 {
		t.Fatalf("b: %+v", b)
	}
	// Calls without Metrics in their options, admitted or refused, work and are counted
	// nowhere: there is no default Metrics.
	mustTry(t, pool, "c", 1, time.Minute, nil)
	if _, err := semaphore.TryAcquire(ctx, pool, "c", 1, time.Minute, nil); !errors.Is(err, semaphore.ErrFull) {
		t.Fatal(err)
	}
}

func refusals(m *semaphore.Metrics, key string) int64 {
	for _, k := range m.Snapshot() {
		if k.Key == key {
			return k.Refusals
		}
	}
	return 0
}
