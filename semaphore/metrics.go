package semaphore

import (
	"math/bits"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"
)

// Metrics counts, in this process and per key, how long admissions took and how many
// attempts were admitted or refused. It is safe for concurrent use, and its zero value is
// ready to use. Create one with NewMetrics, pass it in the options of the calls it should
// count (AcquireOpts.Metrics, NextOpts.Metrics: a call without one is not counted), and
// read it with Snapshot or export it with package metrics (metrics.Opts.Semaphores).
//
// What counts as an admission's time: for TryAcquire and Next, the call (a round trip,
// two if it retried); for Acquire, the whole wait, from the call to the grant. Refusals
// count TryAcquire calls that returned ErrFull and each refused attempt of a waiting
// Acquire (one per wake-up). Next's ErrNoWork names no key and is not counted.
//
// Its memory is bounded whatever the number of keys. It counts at most MaxKeys keys one
// by one, in 4.7 KiB each (a latency histogram of 592 counters), and every other key
// together, under the key "" (no semaphore key is empty): at most MaxKeys + 1 histograms
// and MaxKeys names, about 5 MiB with the default of 1,000 keys, however many keys the
// process sees. A new key is counted one by one while fewer than MaxKeys are; once all
// places are taken, a new key makes room by moving the counts of every key idle for
// IdleAfter (no call counted) to "" — looking for idle keys at most once a minute — and
// is counted under "" if none is idle. So the sums over all keys never go down, and a key
// that comes back after its counts moved starts again from zero (which Prometheus reads
// as a counter reset).
type Metrics struct {
	// MaxKeys caps the keys counted one by one. Default (0) DefaultMaxKeys. Set it before
	// the Metrics is first used.
	MaxKeys int

	mu        sync.RWMutex
	keys      map[string]*keyMetrics
	others    *keyMetrics   // the keys not counted one by one; nil until one is
	sweptAt   time.Duration // when idle keys were last looked for (elapsed), while full
	swept     bool          // whether they ever were
	elapsedFn func() time.Duration
}

// Bounds of a Metrics' memory.
const (
	// DefaultMaxKeys is how many keys a Metrics counts one by one by default.
	DefaultMaxKeys = 1000
	// keyBytes is what the counters of one key take (4,768 bytes), not counting its name.
	keyBytes = int(unsafe.Sizeof(keyMetrics{}))
	// IdleAfter is how long a key counted one by one must go without a call before a new
	// key may take its place (when MaxKeys are counted).
	IdleAfter = 10 * time.Minute
	// sweepEvery is how often, at most, a Metrics with every place taken looks for idle
	// keys: a new key meanwhile is counted under "".
	sweepEvery = time.Minute
)

// NewMetrics returns an empty Metrics with the default MaxKeys.
func NewMetrics() *Metrics { return &Metrics{} }

// KeyMetrics is what a Metrics counted for one key.
type KeyMetrics struct {
	// Key is the semaphore key; "" for the keys not counted one by one (see Metrics).
	Key string
	// Admissions counts permits granted; Refusals counts refused attempts.
	Admissions, Refusals int64
	// AcquireP50 and AcquireP99 are the median and 99th percentile of the time admissions
	// took, within 4%. Zero if there was no admission.
	AcquireP50, AcquireP99 time.Duration
	// AcquireSum is the total time the admissions took. AcquireBuckets[i] counts the
	// admissions that took at most AcquireBounds()[i] (cumulative, as a Prometheus
	// histogram wants them); one within about 3% of a bound may be counted on either side
	// of it.
	AcquireSum     time.Duration
	AcquireBuckets []uint64
}

// AcquireBounds returns the upper bounds of KeyMetrics.AcquireBuckets, in increasing
// order: 1 ms to 5 min. The slice is the caller's.
func AcquireBounds() []time.Duration { return slices.Clone(acquireBounds) }

var acquireBounds = []time.Duration{
	time.Millisecond, 2500 * time.Microsecond, 5 * time.Millisecond, 10 * time.Millisecond,
	25 * time.Millisecond, 50 * time.Millisecond, 100 * time.Millisecond, 250 * time.Millisecond,
	500 * time.Millisecond, time.Second, 2500 * time.Millisecond, 5 * time.Second,
	10 * time.Second, 30 * time.Second, time.Minute, 5 * time.Minute,
}

// Snapshot returns the counts of every key counted one by one, sorted by key, after those
// of the other keys together (Key "", present once a key was counted there). It is a
// consistent view of each key's counters only approximately: calls that finish while it
// runs may be counted in one field and not yet in another.
func (m *Metrics) Snapshot() []KeyMetrics {
	m.mu.RLock()
	out := make([]KeyMetrics, 0, len(m.keys)+1)
	if m.others != nil {
		out = append(out, m.others.snapshot(""))
	}
	for k, km := range m.keys {
		out = append(out, km.snapshot(k))
	}
	m.mu.RUnlock()
	slices.SortFunc(out, func(a, b KeyMetrics) int { return strings.Compare(a.Key, b.Key) })
	return out
}

// admitted counts an admission to key k that took d; a nil m counts nothing.
func (m *Metrics) admitted(k string, d time.Duration) {
	if m == nil {
		return
	}
	m.count(k, func(km *keyMetrics) {
		km.admissions.Add(1)
		km.sumMicros.Add(max(d.Microseconds(), 0))
		km.latency[bucketOf(d)].Add(1)
	})
}

// refused counts a refused attempt for key k; a nil m counts nothing.
func (m *Metrics) refused(k string) {
	if m == nil {
		return
	}
	m.count(k, func(km *keyMetrics) { km.refusals.Add(1) })
}

// count applies add to the counters of key k. It runs under m.mu (read-locked on the
// common path), so the counts of a key cannot be added to after they moved to "".
func (m *Metrics) count(k string, add func(*keyMetrics)) {
	now := m.elapsed()
	m.mu.RLock()
	if km := m.keys[k]; km != nil {
		km.used.Store(int64(now))
		add(km)
		m.mu.RUnlock()
		return
	}
	m.mu.RUnlock()
	m.mu.Lock()
	defer m.mu.Unlock()
	km := m.place(k, now)
	km.used.Store(int64(now))
	add(km)
}

// place returns the counters of a key seen first: its own if there is room, after making
// room from idle keys if it is time to look for them, else those of the other keys. m.mu
// is locked.
func (m *Metrics) place(k string, now time.Duration) *keyMetrics {
	if km := m.keys[k]; km != nil {
		return km // placed since the read-locked look-up
	}
	if m.keys == nil {
		m.keys = map[string]*keyMetrics{}
	}
	maxKeys := m.MaxKeys
	if maxKeys <= 0 {
		maxKeys = DefaultMaxKeys
	}
	if len(m.keys) >= maxKeys && (!m.swept || now-m.sweptAt >= sweepEvery) {
		m.swept, m.sweptAt = true, now
		for key, km := range m.keys {
			if now-time.Duration(km.used.Load()) >= IdleAfter {
				m.othersCounters().add(km)
				delete(m.keys, key)
			}
		}
	}
	if len(m.keys) >= maxKeys {
		return m.othersCounters()
	}
	km := &keyMetrics{}
	m.keys[k] = km
	return km
}

// othersCounters returns the counters of the keys not counted one by one. m.mu is locked.
func (m *Metrics) othersCounters() *keyMetrics {
	if m.others == nil {
		m.others = &keyMetrics{}
	}
	return m.others
}

// elapsed is the time on m's clock: the process's monotonic clock, or a test's.
func (m *Metrics) elapsed() time.Duration {
	if m.elapsedFn != nil {
		return m.elapsedFn()
	}
	return time.Since(processStart)
}

var processStart = time.Now()

// keyMetrics are one key's counters. latency is a log-linear histogram of microseconds:
// exact below subBuckets µs, then subBuckets buckets per power of two, so a bucket is at
// most 1/subBuckets wide relative to its values, and its middle within 1/(2·subBuckets) of
// any of them.
type keyMetrics struct {
	admissions, refusals atomic.Int64
	sumMicros            atomic.Int64
	latency              [numBuckets]atomic.Int64
	used                 atomic.Int64 // when the last call was counted (Metrics.elapsed)
}

// add adds the counts of o to km.
func (km *keyMetrics) add(o *keyMetrics) {
	km.admissions.Add(o.admissions.Load())
	km.refusals.Add(o.refusals.Load())
	km.sumMicros.Add(o.sumMicros.Load())
	for i := range o.latency {
		if c := o.latency[i].Load(); c != 0 {
			km.latency[i].Add(c)
		}
	}
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
	s.AcquireBuckets = make([]uint64, len(acquireBounds))
	for i, c := range counts { // a bucket counts below a bound when its middle does
		for j, b := range acquireBounds {
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
