package semaphore

import (
	"math"
	"testing"
	"time"
)

// Every bucket between the first and the last reports a value within 20% of both of its
// bounds, [2^((j-1)/2), 2^(j/2)) ms, as KeyStatus documents.
func TestWaitBucketValueIsWithinTwentyPercent(t *testing.T) {
	t.Parallel()
	if v := waitBucketValue(0); v != 0 {
		t.Errorf("bucket 0 (under 1 ms) reports %v, want 0", v)
	}
	for j := 1; j < waitBuckets-1; j++ {
		lo := math.Exp2(float64(j-1)/2) * float64(time.Millisecond)
		hi := math.Exp2(float64(j)/2) * float64(time.Millisecond)
		v := float64(waitBucketValue(j))
		if v < lo || v >= hi || (v-lo)/lo > 0.2 || (hi-v)/hi > 0.2 {
			t.Errorf("bucket %d [%v, %v) reports %v", j, time.Duration(lo), time.Duration(hi), time.Duration(v))
		}
	}
	if v, want := waitBucketValue(waitBuckets-1), time.Duration(1<<24)*time.Millisecond; v != want {
		t.Errorf("last bucket reports %v, want its lower bound %v", v, want)
	}
}

func TestWaitStats(t *testing.T) {
	t.Parallel()
	hist := func(counts map[int]int32) []int32 {
		h := make([]int32, waitBuckets)
		for j, c := range counts {
			h[j] = c
		}
		return h
	}
	for _, tc := range []struct {
		name     string
		hist     []int32
		n        int64
		p50, p99 time.Duration
	}{
		{"none recorded", hist(nil), 0, 0, 0},
		{"no array", nil, 0, 0, 0},
		{"one wait", hist(map[int]int32{10: 1}), 1, waitBucketValue(10), waitBucketValue(10)},
		{"half immediate", hist(map[int]int32{0: 2, 20: 2}), 4, 0, waitBucketValue(20)},
		{"median past the middle", hist(map[int]int32{0: 25, 5: 26}), 51, waitBucketValue(5), waitBucketValue(5)},
		{"a tail of 1%", hist(map[int]int32{3: 990, 30: 10}), 1000, waitBucketValue(3), waitBucketValue(3)},
		{"a tail over 1%", hist(map[int]int32{3: 989, 30: 11}), 1000, waitBucketValue(3), waitBucketValue(30)},
		{"the last bucket", hist(map[int]int32{waitBuckets - 1: 1}), 1, time.Duration(1<<24) * time.Millisecond, time.Duration(1<<24) * time.Millisecond},
	} {
		n, p50, p99 := waitStats(tc.hist)
		if n != tc.n || p50 != tc.p50 || p99 != tc.p99 {
			t.Errorf("%s: got n=%d p50=%v p99=%v, want n=%d p50=%v p99=%v", tc.name, n, p50, p99, tc.n, tc.p50, tc.p99)
		}
	}
}
