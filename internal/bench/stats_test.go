package bench

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestBucketsCoverEveryValueWithinPrecision(t *testing.T) {
	t.Parallel()
	check := func(v uint64) {
		t.Helper()
		i := bucketOf(v)
		if i < 0 || i >= numBuckets {
			t.Fatalf("bucketOf(%d) = %d, outside [0, %d)", v, i, numBuckets)
		}
		mid := bucketMid(i)
		if rel := math.Abs(float64(mid)-float64(v)) / math.Max(float64(v), 1); rel > 1.0/subBuckets {
			t.Fatalf("value %d: bucket %d middle %d is off by %.4f", v, i, mid, rel)
		}
	}
	for v := range uint64(4096) {
		check(v)
	}
	for shift := range 64 {
		v := uint64(1) << shift
		check(v)
		check(v - 1)
		check(v + v/3)
	}
	check(math.MaxUint64)
	// Buckets are monotonic: a larger value never lands in a smaller bucket.
	prev := 0
	for v := uint64(1); v < 1<<40; v = v*21/20 + 1 {
		i := bucketOf(v)
		if i < prev {
			t.Fatalf("bucketOf(%d) = %d < %d", v, i, prev)
		}
		prev = i
	}
}

func TestQuantilesOfKnownInputs(t *testing.T) {
	t.Parallel()
	near := func(t *testing.T, name string, got, want time.Duration) {
		t.Helper()
		if rel := math.Abs(float64(got-want)) / float64(want); rel > 0.01 {
			t.Errorf("%s = %v, want %v within 1%% (off by %.2f%%)", name, got, want, rel*100)
		}
	}

	t.Run("uniform 1..1000us", func(t *testing.T) {
		t.Parallel()
		var h histogram
		vs := make([]time.Duration, 0, 1000)
		for i := 1; i <= 1000; i++ {
			vs = append(vs, time.Duration(i)*time.Microsecond)
		}
		rand.Shuffle(len(vs), func(i, j int) { vs[i], vs[j] = vs[j], vs[i] })
		for _, v := range vs {
			h.record(v)
		}
		near(t, "p50", h.quantile(0.50), 500*time.Microsecond)
		near(t, "p99", h.quantile(0.99), 990*time.Microsecond)
		near(t, "p100", h.quantile(1), 1000*time.Microsecond)
	})

	t.Run("constant", func(t *testing.T) {
		t.Parallel()
		var h histogram
		for range 100 {
			h.record(1700 * time.Microsecond)
		}
		near(t, "p50", h.quantile(0.5), 1700*time.Microsecond)
		near(t, "p99", h.quantile(0.99), 1700*time.Microsecond)
	})

	t.Run("tail", func(t *testing.T) {
		t.Parallel()
		// 98 fast ops and 2 slow ones: p50 is fast, p99 is slow.
		var h histogram
		for range 98 {
			h.record(200 * time.Microsecond)
		}
		h.record(40 * time.Millisecond)
		h.record(40 * time.Millisecond)
		near(t, "p50", h.quantile(0.5), 200*time.Microsecond)
		near(t, "p98", h.quantile(0.98), 200*time.Microsecond)
		near(t, "p99", h.quantile(0.99), 40*time.Millisecond)
	})

	t.Run("merge equals recording all", func(t *testing.T) {
		t.Parallel()
		var a, b, all histogram
		r := rand.New(rand.NewPCG(1, 2))
		var vs []time.Duration
		for i := range 10000 {
			v := time.Duration(r.ExpFloat64() * float64(time.Millisecond))
			vs = append(vs, v)
			all.record(v)
			if i%3 == 0 {
				a.record(v)
			} else {
				b.record(v)
			}
		}
		a.merge(&b)
		if a != all {
			t.Fatal("merged histogram differs from the one that recorded everything")
		}
		slices.Sort(vs)
		near(t, "p50", a.quantile(0.5), vs[len(vs)/2-1])
		near(t, "p99", a.quantile(0.99), vs[len(vs)*99/100-1])
	})

	t.Run("empty and negative", func(t *testing.T) {
		t.Parallel()
		var h histogram
		if q := h.quantile(0.5); q != 0 {
			t.Errorf("empty p50 = %v, want 0", q)
		}
		h.record(-time.Second)
		if q := h.quantile(0.5); q != 0 {
			t.Errorf("p50 of a negative duration = %v, want 0", q)
		}
	})
}

func TestRatioOfMedians(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name          string
		a, floor      []float64
		ma, mf, ratio float64
	}{
		{"odd", []float64{100, 300, 200}, []float64{50, 1000, 100}, 200, 100, 2},
		// The medians of the rounds, not the ratio of the means (which a drift of the
		// commit cost in one round would skew) nor the median of per-round ratios.
		{"even", []float64{10, 40, 20, 30}, []float64{100, 1, 60, 40}, 25, 50, 0.5},
		{"one round", []float64{7}, []float64{14}, 7, 14, 0.5},
		{"own reference", []float64{5, 9, 1}, []float64{5, 9, 1}, 5, 5, 1},
		{"zero floor", []float64{5}, []float64{0}, 5, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := slices.Clone(tc.a)
			ma, mf, ratio := ratioOfMedians(tc.a, tc.floor)
			if ma != tc.ma || mf != tc.mf || ratio != tc.ratio {
				t.Errorf("ratioOfMedians(%v, %v) = %v, %v, %v; want %v, %v, %v",
					tc.a, tc.floor, ma, mf, ratio, tc.ma, tc.mf, tc.ratio)
			}
			if !slices.Equal(in, tc.a) {
				t.Errorf("ratioOfMedians reordered its input: %v", tc.a)
			}
		})
	}
}

func TestRounds(t *testing.T) {
	t.Parallel()
	ms := time.Millisecond
	for _, tc := range []struct {
		d, round time.Duration
		want     int
	}{
		{5 * time.Second, 250 * ms, 20},
		{time.Second, 250 * ms, 4},
		{300 * ms, 250 * ms, 3}, // at least 3 rounds when each can last 50ms
		{100 * ms, 250 * ms, 2},
		{10 * ms, 250 * ms, 1},
		{time.Second, 2 * time.Second, 3},
	} {
		if got := rounds(tc.d, tc.round); got != tc.want {
			t.Errorf("rounds(%v, %v) = %d, want %d", tc.d, tc.round, got, tc.want)
		}
	}
}

func TestRunRoundCountsAndStopsOnError(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	ops := []Op{
		func(context.Context) error { return nil },
		func(context.Context) error { return nil },
	}
	hists := make([]histogram, 2)
	n, rate, err := runRound(ctx, ops, 20*time.Millisecond, hists)
	if err != nil || n <= 0 || rate <= 0 {
		t.Fatalf("runRound = %d ops, %v/s, %v", n, rate, err)
	}
	if got := hists[0].n + hists[1].n; got != uint64(n) {
		t.Errorf("histograms hold %d ops, runRound counted %d", got, n)
	}

	boom := errors.New("boom")
	calls := 0
	ops[1] = func(context.Context) error {
		if calls++; calls == 3 {
			return boom
		}
		return nil
	}
	// The failing worker stops the others by cancelling their context: a long round ends
	// at once.
	ops[0] = func(ctx context.Context) error { return ctx.Err() }
	_, _, err = runRound(ctx, ops, time.Hour, nil)
	if !errors.Is(err, boom) || !strings.Contains(err.Error(), "worker 1") {
		t.Fatalf("runRound error = %v, want worker 1's boom", err)
	}
}

// An op that says it did several operations (setUnits) counts as that many, each call as
// it said; the others count as one; the histogram holds one latency per op either way.
func TestRunRoundCountsUnits(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		units func(call int64) int64 // what the op says on its call-th call, 0: nothing
		want  func(calls int64) int64
	}{
		{"always 7", func(int64) int64 { return 7 }, func(c int64) int64 { return 7 * c }},
		{"never", func(int64) int64 { return 0 }, func(c int64) int64 { return c }},
		{"7 on odd calls", func(i int64) int64 { return 7 * (i % 2) }, func(c int64) int64 { return 7*((c+1)/2) + c/2 }},
	} {
		// Rounds until the op ran at least twice (a busy machine may start it late).
		var calls, n int64
		var hist [1]histogram
		for round := 0; calls < 2; round++ {
			if round == 100 {
				t.Fatalf("%s: the op ran %d times in 100 rounds", tc.name, calls)
			}
			op := func(ctx context.Context) error {
				calls++
				if u := tc.units(calls); u > 0 {
					setUnits(ctx, u)
				}
				return nil
			}
			got, _, err := runRound(t.Context(), []Op{op}, 5*time.Millisecond, hist[:])
			if err != nil {
				t.Fatal(err)
			}
			n += got
		}
		if want := tc.want(calls); n != want {
			t.Errorf("%s: runRound counted %d over %d calls, want %d", tc.name, n, calls, want)
		}
		if hist[0].n != uint64(calls) {
			t.Errorf("%s: histogram holds %d latencies, want one per call (%d)", tc.name, hist[0].n, calls)
		}
	}
}

// An op that records latencies itself (recordLatency) adds those to the histogram in place
// of its duration, however many; an op that does not adds its duration.
func TestRunRoundRecordsOwnLatencies(t *testing.T) {
	t.Parallel()
	var hist [1]histogram
	var calls int
	op := func(ctx context.Context) error {
		if calls++; calls%2 == 1 {
			for range 3 {
				recordLatency(ctx, time.Hour)
			}
		}
		return nil
	}
	for round := 0; calls < 2; round++ {
		if round == 100 {
			t.Fatalf("the op ran %d times in 100 rounds", calls)
		}
		if _, _, err := runRound(t.Context(), []Op{op}, 5*time.Millisecond, hist[:]); err != nil {
			t.Fatal(err)
		}
	}
	recorded, own := uint64(3*((calls+1)/2)), uint64(calls/2)
	if hist[0].n != recorded+own {
		t.Fatalf("histogram holds %d latencies after %d calls, want %d recorded and %d durations", hist[0].n, calls, recorded, own)
	}
	// The hours are those recorded; the ops' own durations are far below.
	var hours uint64
	for i, c := range hist[0].counts {
		if i >= bucketOf(uint64(59*time.Minute)) {
			hours += c
		}
	}
	if hours != recorded {
		t.Errorf("%d latencies of about an hour, want the %d recorded", hours, recorded)
	}
	// Rounds without a histogram (the floor's) ignore what the op records.
	if _, _, err := runRound(t.Context(), []Op{op}, time.Millisecond, nil); err != nil {
		t.Fatal(err)
	}
}

// A scenario with a MaxConcurrency is measured at each concurrency asked for, lowered to it,
// once each; one without is measured at each.
func TestScenarioConcurrencies(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		max      int
		ask, got []int
	}{
		{0, []int{1, 8, 32}, []int{1, 8, 32}},
		{1, []int{1, 8, 32}, []int{1}},
		{1, []int{8}, []int{1}},
		{4, []int{2, 8, 4, 1}, []int{2, 4, 1}},
	} {
		if got := (Scenario{MaxConcurrency: tc.max}).concurrencies(tc.ask); !slices.Equal(got, tc.got) {
			t.Errorf("MaxConcurrency %d, asked %v: measured at %v, want %v", tc.max, tc.ask, got, tc.got)
		}
	}
}
