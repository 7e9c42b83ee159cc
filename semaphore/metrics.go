package semaphore

import (
	"math/bits"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Metrics counts, in this process and per key, how long admissions took and how many
// attempts were admitted or refused. It is safe for concurrent use. Each key seen costs
// about 5 KiB, kept for the life of the Metrics.
//
// What counts as an admission's time: for TryAcquire and Next, the call (a round trip,
// two if TryAcquire retried); for Acquire, the whole wait, from the call to the grant.
// Refusals count TryAcquire calls that returned ErrFull and each refused attempt of a
// waiting Acquire (one per wake-up). Next's ErrNoWork names no key and is not counted.
type Metrics struct {
	mu   sync.RWMutex
	keys map[string]*keyMetrics
}

// NewMetrics returns an empty Metrics.
func NewMetrics() *Metrics { return &Metrics{keys: map[string]*keyMetrics{}} }

// DefaultMetrics is where TryAcquire, Acquire and Next count when their options name no
// Metrics.
var DefaultMetrics = NewMetrics()

// KeyMetrics is what a Metrics counted for one key.
type KeyMetrics struct {
	// Key is the semaphore key.
	Key string
	// Admissions counts permits granted; Refusals counts refused attempts.
	Admissions, Refusals int64
	// AcquireP50 and AcquireP99 are the median and 99th percentile of the time admissions
	// took, within 4%. Zero if there was no admission.
	AcquireP50, AcquireP99 time.Duration
	// AcquireSum is the total time the admissions took. AcquireBuckets[i] counts the
	// admissions that took at most AcquireBounds[i] (cumulative, as a Prometheus histogram
	// wants them); one within about 3% of a bound may be counted on either side of it.
	AcquireSum     time.Duration
	AcquireBuckets []uint64
}

// AcquireBounds are the upper bounds of KeyMetrics.AcquireBuckets.
var AcquireBounds = []time.Duration{
	time.Millisecond, 2500 * time.Microsecond, 5 * time.Millisecond, 10 * time.Millisecond,
	25 * time.Millisecond, 50 * time.Millisecond, 100 * time.Millisecond, 250 * time.Millisecond,
	500 * time.Millisecond, time.Second, 2500 * time.Millisecond, 5 * time.Second,
	10 * time.Second, 30 * time.Second, time.Minute, 5 * time.Minute,
}

// Snapshot returns the counts of every key seen, sorted by key. It is a consistent view of
// each key's counters only approximately: calls that finish while it runs may be counted
// in one field and not yet in another.
func (m *Metrics) Snapshot() []KeyMetrics {
	m.mu.RLock()
	out := make([]KeyMetrics, 0, len(m.keys))
	for k, km := range m.keys {
		out = append(out, km.snapshot(k))
	}
	m.mu.RUnlock()
	slices.SortFunc(out, func(a, b KeyMetrics) int { return strings.Compare(a.Key, b.Key) })
	return out
}

func (m *Metrics) key(k string) *keyMetrics {
	m.mu.RLock()
	km := m.keys[k]
	m.mu.RUnlock()
	if km != nil {
		return km
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if km = m.keys[k]; km == nil {
		if m.keys == nil {
			m.keys = map[string]*keyMetrics{}
		}
		km = &keyMetrics{}
		m.keys[k] = km
	}
	return km
}

func (m *Metrics) admitted(k string, d time.Duration) {
	km := m.key(k)
	km.admissions.Add(1)
	km.sumMicros.Add(max(d.Microseconds(), 0))
	km.latency[bucketOf(d)].Add(1)
}

func (m *Metrics) refused(k string) { m.key(k).refusals.Add(1) }

// keyMetrics are one key's counters. latency is a log-linear histogram of microseconds:
// exact below subBuckets µs, then subBuckets buckets per power of two, so a bucket is at
// most 1/subBuckets wide relative to its values, and its middle within 1/(2·subBuckets) of
// any of them.
type keyMetrics struct {
	admissions, refusals atomic.Int64
	sumMicros            atomic.Int64
	latency              [numBuckets]atomic.Int64
}

const (
	subBits    = 4
	subBuckets = 1 << subBits
	// numBuckets covers up to 2^40 µs (12 days): longer waits land in the last bucket.
	maxBits    = 40
	numBuckets = subBuckets + (maxBits-subBits)*subBuckets
)

// bucketOf returns the bucket of duration d.
func bucketOf(d time.Duration) int {
	v := uint64(max(d.Microseconds(), 0))
	if v < subBuckets {
		return int(v)
	}
	shift := bits.Len64(v) - subBits - 1 // keep the top subBits+1 bits
	i := subBuckets + shift*subBuckets + int(v>>shift) - subBuckets
	return min(i, numBuckets-1)
}

// bucketMid returns the middle of bucket i's values.
func bucketMid(i int) time.Duration {
	if i < subBuckets {
		return time.Duration(i) * time.Microsecond
	}
	shift := (i - subBuckets) / subBuckets
	low := uint64(subBuckets+(i-subBuckets)%subBuckets) << shift
	return time.Duration(low+(uint64(1)<<shift)/2) * time.Microsecond
}

func (km *keyMetrics) snapshot(k string) KeyMetrics {
	s := KeyMetrics{Key: k, Admissions: km.admissions.Load(), Refusals: km.refusals.Load()}
	var counts [numBuckets]int64
	var n int64
	for i := range km.latency {
		counts[i] = km.latency[i].Load()
		n += counts[i]
	}
	s.AcquireP50 = quantile(&counts, n, 0.50)
	s.AcquireP99 = quantile(&counts, n, 0.99)
	s.AcquireSum = time.Duration(km.sumMicros.Load()) * time.Microsecond
	s.AcquireBuckets = make([]uint64, len(AcquireBounds))
	for i, c := range counts { // a bucket counts below a bound when its middle does
		for j, b := range AcquireBounds {
			if bucketMid(i) <= b {
				s.AcquireBuckets[j] += uint64(c)
			}
		}
	}
	return s
}

// quantile returns the smallest bucket middle such that at least q of the n values fall
// in or below its bucket; zero when n is zero.
func quantile(counts *[numBuckets]int64, n int64, q float64) time.Duration {
	if n == 0 {
		return 0
	}
	rank := int64(q * float64(n))
	if float64(rank) < q*float64(n) {
		rank++ // ceil
	}
	rank = min(max(rank, 1), n)
	var seen int64
	for i, c := range counts {
		seen += c
		if seen >= rank {
			return bucketMid(i)
		}
	}
	return bucketMid(numBuckets - 1)
}
