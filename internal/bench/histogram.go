package bench

import (
	"math/bits"
	"time"
)

// histogram counts durations in log-linear buckets: exact below subBuckets nanoseconds,
// then subBuckets buckets per power of two, so a bucket's width is at most 1/subBuckets
// (under 0.8%) of its value. It covers every non-negative int64 in a fixed 58 KiB, so a
// worker records every operation without allocating. It is not safe for concurrent use:
// each worker keeps its own and they are merged at the end.
type histogram struct {
	counts [numBuckets]uint64
	n      uint64
}

const (
	subBits    = 7
	subBuckets = 1 << subBits // buckets per power of two
	// numBuckets covers values up to 2^64: the exact ones, then one group per exponent.
	numBuckets = subBuckets + (64-subBits)*subBuckets
)

// bucketOf returns the bucket index of v nanoseconds.
func bucketOf(v uint64) int {
	if v < subBuckets {
		return int(v)
	}
	shift := bits.Len64(v) - subBits - 1 // keep the top subBits+1 bits
	return subBuckets + shift*subBuckets + int(v>>shift) - subBuckets
}

// bucketMid returns the middle of bucket i's range of values.
func bucketMid(i int) uint64 {
	if i < subBuckets {
		return uint64(i)
	}
	shift := (i - subBuckets) / subBuckets
	low := uint64(subBuckets+(i-subBuckets)%subBuckets) << shift
	return low + (uint64(1)<<shift)/2
}

// record counts one duration; negative durations count as zero.
func (h *histogram) record(d time.Duration) {
	h.counts[bucketOf(uint64(max(d, 0)))]++
	h.n++
}

// merge adds o's counts to h.
func (h *histogram) merge(o *histogram) {
	for i, c := range o.counts {
		h.counts[i] += c
	}
	h.n += o.n
}

// quantile returns the duration at quantile q (0 < q <= 1): the smallest recorded value v
// (to the bucket's precision) such that at least q of the values are <= v. It returns 0
// for an empty histogram.
func (h *histogram) quantile(q float64) time.Duration {
	if h.n == 0 {
		return 0
	}
	rank := uint64(q * float64(h.n))
	if float64(rank) < q*float64(h.n) {
		rank++ // ceil
	}
	rank = min(max(rank, 1), h.n)
	var seen uint64
	for i, c := range h.counts {
		seen += c
		if seen >= rank {
			return time.Duration(bucketMid(i))
		}
	}
	return 0 // unreachable: the counts sum to n
}
