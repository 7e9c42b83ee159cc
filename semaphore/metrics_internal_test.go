package semaphore

import (
	"fmt"
	"math"
	"runtime"
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
	bounds := AcquireBounds()
	if len(k.AcquireBuckets) != len(bounds) {
		t.Fatalf("%d buckets for %d bounds", len(k.AcquireBuckets), len(bounds))
	}
	for i, b := range bounds {
		below := min(int64(b/time.Millisecond), 1000) // admissions of at most b
		lo, hi := float64(below)*0.97-1, float64(below)*1.03+1
		if got := float64(k.AcquireBuckets[i]); got < lo || got > hi {
			t.Errorf("bucket <= %v counts %v admissions, want %d within 3%%", b, got, below)
		}
		if i > 0 && k.AcquireBuckets[i] < k.AcquireBuckets[i-1] {
			t.Errorf("buckets not cumulative at %v", b)
		}
	}
	// The bounds are the caller's copy: changing them changes no Metrics.
	bounds[0] = time.Hour
	if AcquireBounds()[0] != time.Millisecond {
		t.Fatal("AcquireBounds returned the package's own slice")
	}
	// A call whose options name no Metrics counts nothing, and does not fail.
	var none *Metrics
	none.admitted("k", time.Second)
	none.refused("k")
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

// A Metrics' memory stays bounded whatever the number of keys (the heap grew by 95 MiB for
// 20,000 keys when every key was kept): 20,000 distinct keys grow the heap by no more than
// the documented bound of DefaultMaxKeys + 1 histograms and DefaultMaxKeys names, and every
// call is still counted, in the sums over all keys. Not parallel: it measures the heap.
func TestMetricsMemoryIsBounded(t *testing.T) {
	const keys = 20_000
	heap := func() int64 {
		runtime.GC()
		var s runtime.MemStats
		runtime.ReadMemStats(&s)
		return int64(s.HeapAlloc)
	}
	before := heap()
	m := NewMetrics()
	for i := range keys {
		key := fmt.Sprintf("tenant:%08d", i)
		m.admitted(key, time.Duration(i)*time.Microsecond)
		m.refused(key)
	}
	grown := heap() - before
	// Per key counted one by one: its counters, its name (a string header and bytes) and
	// its map entry, given generous room; and a MiB for whatever else the process
	// allocated meanwhile. Keeping every key would take 20 times more.
	bound := int64(DefaultMaxKeys+1)*int64(keyBytes) + int64(DefaultMaxKeys)*512 + 1<<20
	t.Logf("%d keys grew the heap by %.2f MiB (bound %.2f MiB)", keys, float64(grown)/(1<<20), float64(bound)/(1<<20))
	if grown > bound {
		t.Errorf("%d keys grew the heap by %d bytes, more than the bound of %d", keys, grown, bound)
	}
	snap := m.Snapshot()
	if len(snap) != DefaultMaxKeys+1 || snap[0].Key != "" {
		t.Fatalf("%d keys in the snapshot, the first %q; want %d keys one by one after the others (\"\")", len(snap), snap[0].Key, DefaultMaxKeys)
	}
	var adm, ref int64
	for _, k := range snap {
		adm += k.Admissions
		ref += k.Refusals
	}
	if adm != keys || ref != keys {
		t.Fatalf("counted %d admissions and %d refusals in all, want %d each", adm, ref, keys)
	}
	runtime.KeepAlive(m)
}

// When every place is taken, a new key takes the place of keys idle for IdleAfter, whose
// counts move to "" (the sums never go down); looking for idle keys happens at most once a
// minute, and a new key that finds none is counted under "".
func TestMetricsMakeRoomFromIdleKeys(t *testing.T) {
	t.Parallel()
	var now time.Duration
	m := &Metrics{MaxKeys: 3, elapsedFn: func() time.Duration { return now }}
	counts := func() map[string]int64 {
		out := map[string]int64{}
		for _, k := range m.Snapshot() {
			out[k.Key] = k.Admissions
		}
		return out
	}
	check := func(what string, want map[string]int64) {
		t.Helper()
		if got := counts(); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("%s: %v, want %v", what, got, want)
		}
	}
	for _, k := range []string{"a", "b", "c"} {
		m.admitted(k, time.Millisecond)
	}
	m.admitted("d", time.Millisecond) // no room, and nothing idle
	check("full", map[string]int64{"": 1, "a": 1, "b": 1, "c": 1})

	now = 5 * time.Minute
	m.admitted("a", time.Millisecond)
	now = IdleAfter + time.Second // b and c idle; a is not; the last look was at 0
	m.admitted("e", time.Millisecond)
	check("after b and c made room", map[string]int64{"": 3, "a": 2, "e": 1})
	m.admitted("b", time.Millisecond) // back: a place was free, and it starts from zero
	check("b back", map[string]int64{"": 3, "a": 2, "b": 1, "e": 1})

	// Full again: a looks idle a minute later, but the next look must wait for that minute.
	now += 30 * time.Second
	m.refused("f")
	if got := counts(); got["f"] != 0 {
		t.Fatalf("f got a place without a look for idle keys: %v", got)
	}
	now = 5*time.Minute + IdleAfter + time.Minute + time.Second
	m.admitted("g", time.Millisecond) // a is idle now, and a minute passed since the last look
	check("a made room for g", map[string]int64{"": 5, "b": 1, "e": 1, "g": 1})
}
