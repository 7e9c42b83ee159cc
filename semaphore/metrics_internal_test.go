package semaphore

import (
	"math"
	"sync"
	"testing"
	"time"
)

// Quantiles are within 4% of the true value, from a microsecond to hours.
func TestMetricsQuantiles(t *testing.T) {
	t.Parallel()
	for _, d := range []time.Duration{0, time.Microsecond, 7 * time.Microsecond, 333 * time.Microsecond, 1234567 * time.Microsecond, 3 * time.Hour} {
		i := bucketOf(d)
		mid := bucketMid(i)
		if d >= time.Microsecond && math.Abs(float64(mid-d))/float64(d) > 0.04 {
			t.Errorf("%v lands in bucket %d, middle %v: more than 4%% off", d, i, mid)
		}
	}
	m := NewMetrics()
	for i := 1; i <= 1000; i++ {
		m.admitted("k", time.Duration(i)*time.Millisecond)
	}
	m.refused("k")
	m.refused("a")
	s := m.Snapshot()
	if len(s) != 2 || s[0].Key != "a" || s[1].Key != "k" {
		t.Fatalf("snapshot not sorted by key: %+v", s)
	}
	k := s[1]
	if k.Admissions != 1000 || k.Refusals != 1 || s[0].Admissions != 0 || s[0].AcquireP50 != 0 {
		t.Fatalf("counts: %+v", s)
	}
	near := func(got, want time.Duration) bool { return math.Abs(float64(got-want))/float64(want) <= 0.04 }
	if !near(k.AcquireP50, 500*time.Millisecond) || !near(k.AcquireP99, 990*time.Millisecond) {
		t.Fatalf("p50 %v, p99 %v; want 500ms and 990ms within 4%%", k.AcquireP50, k.AcquireP99)
	}
	// The histogram's buckets: cumulative, each bound's count within the 3% around it.
	if k.AcquireSum != 500500*time.Millisecond {
		t.Fatalf("sum %v, want 500.5s (1ms + 2ms + ... + 1000ms)", k.AcquireSum)
	}
	if len(k.AcquireBuckets) != len(AcquireBounds) {
		t.Fatalf("%d buckets for %d bounds", len(k.AcquireBuckets), len(AcquireBounds))
	}
	for i, b := range AcquireBounds {
		below := min(int64(b/time.Millisecond), 1000) // admissions of at most b
		lo, hi := float64(below)*0.97-1, float64(below)*1.03+1
		if got := float64(k.AcquireBuckets[i]); got < lo || got > hi {
			t.Errorf("bucket <= %v counts %v admissions, want %d within 3%%", b, got, below)
		}
		if i > 0 && k.AcquireBuckets[i] < k.AcquireBuckets[i-1] {
			t.Errorf("buckets not cumulative at %v", b)
		}
	}
	// A wait longer than the histogram covers counts in its last bucket.
	if bucketOf(1<<62) != numBuckets-1 {
		t.Fatal("a huge duration is not in the last bucket")
	}
}

// Metrics is safe for concurrent use, including its zero value.
func TestMetricsConcurrent(t *testing.T) {
	t.Parallel()
	var m Metrics
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 1000 {
				key := string(rune('a' + (g+i)%4))
				m.admitted(key, time.Duration(i)*time.Microsecond)
				m.refused(key)
				if i%100 == 0 {
					m.Snapshot()
				}
			}
		}()
	}
	wg.Wait()
	var adm, ref int64
	for _, k := range m.Snapshot() {
		adm += k.Admissions
		ref += k.Refusals
	}
	if adm != 8000 || ref != 8000 {
		t.Fatalf("counted %d admissions and %d refusals, want 8000 each", adm, ref)
	}
}
