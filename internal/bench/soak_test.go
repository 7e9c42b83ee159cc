package bench_test

import (
	"testing"
	"time"

	"github.com/pgcoord/pgcoord/internal/bench"
)

// A soak runs its scenarios side by side and reports each interval: every scenario did
// work in every interval; with the xmin pinned, the oldest snapshot ages as the scenarios
// write, and the row versions they leave behind show as dead tuples; the steady ratio is
// the last interval's throughput over the first's.
func TestSoakWithThePinnedXmin(t *testing.T) {
	t.Parallel()
	scenarios, err := bench.SoakNames([]string{"leases.acquire_release", "ratelimit.allow"})
	if err != nil {
		t.Fatal(err)
	}
	var seen []bench.SoakInterval
	res, err := bench.Soak(t.Context(), poolConfig(t), scenarios, &bench.SoakOptions{
		Duration: 3 * time.Second, Interval: time.Second, Workers: 2, PinXmin: true,
		OnInterval: func(iv bench.SoakInterval) { seen = append(seen, iv) },
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Intervals) != 3 || len(seen) != 3 {
		t.Fatalf("%d intervals (%d reported), want 3", len(res.Intervals), len(seen))
	}
	for _, iv := range res.Intervals {
		t.Logf("interval %d at %v: %v ops/s; %d dead, %d live tuples; oldest snapshot %d transactions old",
			iv.N, iv.End.Round(time.Millisecond), iv.OpsPerSec, iv.DeadTuples, iv.LiveTuples, iv.XminAge)
		for _, s := range scenarios {
			if iv.OpsPerSec[s.Name] <= 0 {
				t.Errorf("interval %d: %s did nothing", iv.N, s.Name)
			}
		}
	}
	first, last := res.Intervals[0], res.Intervals[2]
	if last.XminAge <= first.XminAge {
		t.Errorf("the pinned snapshot did not age: %d transactions old, then %d", first.XminAge, last.XminAge)
	}
	if last.DeadTuples == 0 {
		t.Error("no dead tuples after 3 s of leases acquired and released beside a pinned snapshot")
	}
	for _, s := range scenarios {
		if want := last.OpsPerSec[s.Name] / first.OpsPerSec[s.Name]; res.Steady[s.Name] != want {
			t.Errorf("%s: steady %v, want the last interval over the first, %v", s.Name, res.Steady[s.Name], want)
		}
	}
}

// Bad soak options and unknown or repeated scenarios are refused.
func TestSoakRefusesBadInput(t *testing.T) {
	t.Parallel()
	if _, err := bench.SoakNames([]string{"no.such"}); err == nil {
		t.Error("an unknown scenario was accepted")
	}
	if _, err := bench.SoakNames([]string{"leases.acquire_release", "leases.acquire_release"}); err == nil {
		t.Error("a repeated scenario was accepted")
	}
	scenarios, err := bench.SoakNames([]string{"leases.acquire_release"})
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range []bench.SoakOptions{
		{Duration: -time.Second},
		{Duration: 25 * time.Hour},
		{Duration: time.Second, Interval: time.Millisecond},
		{Duration: time.Second, Interval: 2 * time.Second},
		{Duration: time.Second, Workers: 65},
	} {
		if _, err := bench.Soak(t.Context(), poolConfig(t), scenarios, &o); err == nil {
			t.Errorf("%+v accepted", o)
		}
	}
	if _, err := bench.Soak(t.Context(), poolConfig(t), nil, nil); err == nil {
		t.Error("a soak of nothing was accepted")
	}
}

// Memory measures blocked waiters and renewals: every waiter was waiting (the measurement
// ends only once each sent its first attempt and none holds a connection), each adds to
// the live heap, and the renewals cost CPU.
func TestMemoryOfWaitersAndRenewals(t *testing.T) {
	t.Parallel()
	res, err := bench.Memory(t.Context(), poolConfig(t), &bench.MemoryOptions{Waiters: 500, Leases: 300, Workers: 4})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%+v", res)
	if res.Waiters != 500 || res.Leases != 300 {
		t.Errorf("measured %d waiters and %d leases, want 500 and 300", res.Waiters, res.Leases)
	}
	if res.HeapPerWaiter <= 0 || res.CPUPerRenewal <= 0 || res.RenewalsPerSec <= 0 {
		t.Errorf("%+v: a waiter holds memory, a renewal costs CPU", res)
	}
	for _, o := range []bench.MemoryOptions{{Waiters: -1}, {Leases: -1}, {Waiters: bench.MaxMemoryWaiters + 1}, {Workers: 1001}} {
		if _, err := bench.Memory(t.Context(), poolConfig(t), &o); err == nil {
			t.Errorf("%+v accepted", o)
		}
	}
}
