package ratelimit_test

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/pgcoord"
	"github.com/pgcoord/pgcoord/ratelimit"
)

var t0 = time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)

func mustSet(t *testing.T, pool *pgxpool.Pool, p ratelimit.Policy) ratelimit.Policy {
	t.Helper()
	got, err := ratelimit.Set(ctx, pool, p)
	if err != nil {
		t.Fatalf("Set(%+v): %v", p, err)
	}
	return got
}

func allow(t *testing.T, db pgcoord.DBTX, cost int64, limits ...ratelimit.Limit) ratelimit.Decision {
	t.Helper()
	d, err := ratelimit.Allow(ctx, db, cost, limits, nil)
	if err != nil {
		t.Fatalf("Allow(%d, %v): %v", cost, limits, err)
	}
	return d
}

func lim(policy, key string) ratelimit.Limit { return ratelimit.Limit{Policy: policy, Key: key} }

// GCRA on a frozen clock: a burst, then one unit per emission interval, with the retry
// time and the remaining units exact.
func TestGCRAArithmetic(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	clock := pgtest.NewClock(t, pool)
	clock.Freeze(t0)
	p := mustSet(t, pool, ratelimit.Policy{Name: "api", Rate: 10, Period: time.Second, Burst: 3})
	if p.Interval != 100*time.Millisecond {
		t.Fatalf("interval = %v, want 100ms", p.Interval)
	}
	k := lim("api", "key:1")
	for i := range 3 {
		d := allow(t, pool, 1, k)
		if !d.Allowed || d.Remaining != int64(2-i) || d.Policy != "api" {
			t.Fatalf("call %d of the burst: %+v", i, d)
		}
	}
	d := allow(t, pool, 1, k)
	if d.Allowed || d.Granted != 0 || d.RetryAfter != 100*time.Millisecond || d.Policy != "api" {
		t.Fatalf("past the burst: %+v, want refused with retry 100ms", d)
	}
	if d.ResetAfter != 300*time.Millisecond {
		t.Fatalf("reset after = %v, want 300ms", d.ResetAfter)
	}
	clock.Advance(99 * time.Millisecond)
	if d := allow(t, pool, 1, k); d.Allowed || d.RetryAfter != time.Millisecond {
		t.Fatalf("1 ms early: %+v", d)
	}
	clock.Advance(time.Millisecond)
	if d := allow(t, pool, 1, k); !d.Allowed || d.Remaining != 0 {
		t.Fatalf("on time: %+v", d)
	}
	// A cost of 2 needs two intervals.
	clock.Advance(100 * time.Millisecond)
	if d := allow(t, pool, 2, k); d.Allowed || d.RetryAfter != 100*time.Millisecond {
		t.Fatalf("cost 2 with one unit free: %+v", d)
	}
	// A cost above the burst could never pass: an error, not a refusal.
	if _, err := ratelimit.Allow(ctx, pool, 4, []ratelimit.Limit{k}, nil); !errors.Is(err, pgcoord.ErrInvalidArgument) {
		t.Fatalf("cost above the burst: %v, want ErrInvalidArgument", err)
	}
	// At rest again after the whole burst's time: state reads a full burst.
	clock.Advance(time.Second)
	st, err := ratelimit.State(ctx, pool, k)
	if err != nil || st.Remaining != 3 || st.ResetAfter != 0 {
		t.Fatalf("State at rest = %+v, %v", st, err)
	}
}

// Several limits are all or nothing: a refusal by one charges none, and names it.
func TestNestedAllOrNothing(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	clock := pgtest.NewClock(t, pool)
	clock.Freeze(t0)
	mustSet(t, pool, ratelimit.Policy{Name: "per_key", Rate: 100, Period: time.Second, Burst: 5})
	mustSet(t, pool, ratelimit.Policy{Name: "per_tenant", Rate: 10, Period: time.Second, Burst: 2})
	a := []ratelimit.Limit{lim("per_key", "k1"), lim("per_tenant", "t1")}
	b := []ratelimit.Limit{lim("per_key", "k2"), lim("per_tenant", "t1")}
	if d := allow(t, pool, 1, a...); !d.Allowed || d.Policy != "per_tenant" || d.Remaining != 1 {
		t.Fatalf("first: %+v", d)
	}
	if d := allow(t, pool, 1, b...); !d.Allowed || d.Remaining != 0 {
		t.Fatalf("second: %+v", d)
	}
	d := allow(t, pool, 1, a...)
	if d.Allowed || d.Policy != "per_tenant" || d.RetryAfter != 100*time.Millisecond {
		t.Fatalf("third: %+v, want refused by per_tenant", d)
	}
	// The refused call charged per_key nothing: k1 has 4 of 5 left.
	if st, err := ratelimit.State(ctx, pool, lim("per_key", "k1")); err != nil || st.Remaining != 4 {
		t.Fatalf("per_key k1 after a refusal = %+v, %v; want 4 left", st, err)
	}
	// A rolled-back transaction leaves no charge either.
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	clock.Advance(time.Second)
	if d := allow(t, tx, 2, a...); !d.Allowed {
		t.Fatalf("in a transaction: %+v", d)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if st, err := ratelimit.State(ctx, pool, lim("per_tenant", "t1")); err != nil || st.Remaining != 2 {
		t.Fatalf("per_tenant after a rolled-back charge = %+v, %v; want 2", st, err)
	}
}

func TestAllowAtMost(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	clock := pgtest.NewClock(t, pool)
	clock.Freeze(t0)
	mustSet(t, pool, ratelimit.Policy{Name: "batch", Rate: 10, Period: time.Second, Burst: 10})
	mustSet(t, pool, ratelimit.Policy{Name: "global", Rate: 1000, Period: time.Second, Burst: 7})
	k := []ratelimit.Limit{lim("batch", "c1"), lim("global", "all")}
	d, err := ratelimit.AllowAtMost(ctx, pool, 50, k, nil)
	if err != nil || !d.Allowed || d.Granted != 7 {
		t.Fatalf("AllowAtMost(50) = %+v, %v; want 7 granted (global's burst)", d, err)
	}
	d, err = ratelimit.AllowAtMost(ctx, pool, 50, k, nil)
	if err != nil || d.Allowed || d.Policy != "global" || d.RetryAfter != time.Millisecond {
		t.Fatalf("AllowAtMost when nothing fits = %+v, %v", d, err)
	}
	clock.Advance(5 * time.Millisecond)
	d, err = ratelimit.AllowAtMost(ctx, pool, 50, k, nil)
	if err != nil || d.Granted != 3 || d.Policy != "batch" || d.Remaining != 0 {
		t.Fatalf("AllowAtMost after 5 ms = %+v, %v; want 3 (batch has 10-7 left)", d, err)
	}
}

// A shadow policy refuses nothing, counts what it would refuse, and charges only what it
// would admit: its count is what enforcing it would have refused.
func TestShadowCountsWithoutRefusing(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	clock := pgtest.NewClock(t, pool)
	clock.Freeze(t0)
	mustSet(t, pool, ratelimit.Policy{Name: "new", Rate: 1, Period: time.Second, Burst: 2, Shadow: true})
	for i := range 5 {
		if d := allow(t, pool, 1, lim("new", "k")); !d.Allowed {
			t.Fatalf("shadow call %d refused: %+v", i, d)
		}
	}
	p, err := ratelimit.Get(ctx, pool, "new")
	if err != nil || p.ShadowRefused != 3 {
		t.Fatalf("shadow policy = %+v, %v; want 3 counted", p, err)
	}
	// Enforced from the next call, with the state the shadow charges left.
	mustSet(t, pool, ratelimit.Policy{Name: "new", Rate: 1, Period: time.Second, Burst: 2})
	if d := allow(t, pool, 1, lim("new", "k")); d.Allowed || d.RetryAfter != time.Second {
		t.Fatalf("enforced: %+v, want refused for 1s", d)
	}
	clock.Advance(time.Second)
	if d := allow(t, pool, 1, lim("new", "k")); !d.Allowed {
		t.Fatalf("enforced after 1s: %+v", d)
	}
}

func TestBadInput(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	mustSet(t, pool, ratelimit.Policy{Name: "p", Rate: 1, Period: time.Second, Burst: 1})
	many := make([]ratelimit.Limit, ratelimit.MaxLimits+1)
	for i := range many {
		many[i] = lim("p", string(rune('a'+i)))
	}
	for _, tc := range []struct {
		name   string
		cost   int64
		limits []ratelimit.Limit
		want   error
	}{
		{"no limit", 1, nil, pgcoord.ErrInvalidArgument},
		{"too many", 1, many, pgcoord.ErrInvalidArgument},
		{"zero cost", 0, []ratelimit.Limit{lim("p", "k")}, pgcoord.ErrInvalidArgument},
		{"twice", 1, []ratelimit.Limit{lim("p", "k"), lim("p", "k")}, pgcoord.ErrInvalidArgument},
		{"empty key", 1, []ratelimit.Limit{lim("p", "")}, pgcoord.ErrInvalidName},
		{"control char", 1, []ratelimit.Limit{lim("p", "a\x1bb")}, pgcoord.ErrInvalidName},
		{"unknown policy", 1, []ratelimit.Limit{lim("nope", "k")}, ratelimit.ErrUnknownPolicy},
	} {
		if _, err := ratelimit.Allow(ctx, pool, tc.cost, tc.limits, nil); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
	for _, p := range []ratelimit.Policy{
		{Name: "x", Rate: 0, Period: time.Second, Burst: 1},
		{Name: "x", Rate: 1, Period: 0, Burst: 1},
		{Name: "x", Rate: 1, Period: -time.Second, Burst: 1},
		{Name: "x", Rate: 1, Period: time.Second, Burst: 0},
		{Name: "x", Rate: 1, Period: 367 * 24 * time.Hour, Burst: 1},
		{Name: "x", Rate: 1, Period: 1500 * time.Nanosecond, Burst: 1},
		{Name: "", Rate: 1, Period: time.Second, Burst: 1},
	} {
		if _, err := ratelimit.Set(ctx, pool, p); !errors.Is(err, pgcoord.ErrInvalidArgument) && !errors.Is(err, pgcoord.ErrInvalidName) {
			t.Errorf("Set(%+v) = %v, want an argument error", p, err)
		}
	}
	if _, err := ratelimit.Get(ctx, pool, "nope"); !errors.Is(err, ratelimit.ErrUnknownPolicy) {
		t.Errorf("Get(nope) = %v", err)
	}
}

// Exactness under concurrency on the real clock: goroutines on many connections hammer one
// key; over the stretch from the first admission to the last, admitted units never exceed
// stretch × rate + burst.
func TestConcurrentCallsNeverExceed(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	mustSet(t, pool, ratelimit.Policy{Name: "hot", Rate: 200, Period: time.Second, Burst: 5})
	var admitted atomic.Int64
	var wg sync.WaitGroup
	stop := make(chan struct{})
	// Database-clock instants (µs) around the admissions: the earliest read before one and
	// the latest read after one bracket every charge.
	var first, last atomic.Int64
	for range 8 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				var ok bool
				var before, after time.Time
				err := pool.QueryRow(ctx, `SELECT b, pgcoord_ratelimit_allow('hot', 'k'), clock_timestamp()
					FROM (SELECT clock_timestamp() AS b OFFSET 0) s`).Scan(&before, &ok, &after)
				if err != nil {
					t.Error(err)
					return
				}
				if ok {
					admitted.Add(1)
					for b, cur := before.UnixMicro(), first.Load(); cur == 0 || b < cur; cur = first.Load() {
						if first.CompareAndSwap(cur, b) {
							break
						}
					}
					for a, cur := after.UnixMicro(), last.Load(); a > cur; cur = last.Load() {
						if last.CompareAndSwap(cur, a) {
							break
						}
					}
				}
			}
		})
	}
	// Stop once 300 units were admitted: progress, not a wall-clock wait.
	for admitted.Load() < 300 {
		time.Sleep(10 * time.Millisecond)
	}
	close(stop)
	wg.Wait()
	stretch := time.Duration(last.Load()-first.Load()) * time.Microsecond
	// Every charge happened within the stretch, so GCRA admits at most stretch × rate + burst.
	bound := int64(stretch.Seconds()*200) + 5
	if n := admitted.Load(); n > bound {
		t.Fatalf("admitted %d units in %v, more than %d (200/s, burst 5)", n, stretch, bound)
	}
	t.Logf("admitted %d units in %v (bound %d)", admitted.Load(), stretch, bound)
}

// Each call is one round trip, whatever the number of limits: Allow, AllowAtMost and
// Reserve each send one statement; a refusal too; and one limit's call whether its key is
// at rest, charged, or refused.
func TestOneRoundTripPerCall(t *testing.T) {
	t.Parallel()
	rt := &pgtest.RoundTrips{}
	pool, other := pgtest.TracedPool(t, 1, rt) // one connection, set up before the count (its setup is not a call's)
	if err := pool.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	mustSet(t, other, ratelimit.Policy{Name: "a", Rate: 1, Period: time.Hour, Burst: 2})
	mustSet(t, other, ratelimit.Policy{Name: "b", Rate: 1, Period: time.Hour, Burst: 2})
	three := []ratelimit.Limit{lim("a", "k"), lim("b", "k"), lim("b", "t")}
	one := []ratelimit.Limit{lim("a", "one")}
	for _, name := range []string{"one at rest", "one charged", "one refused"} {
		before := rt.N()
		if _, err := ratelimit.Allow(ctx, pool, 1, one, nil); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if n := rt.N() - before; n != 1 {
			t.Errorf("%s sent %d statements, want 1", name, n)
		}
	}
	for name, call := range map[string]func() error{
		"Allow":       func() error { _, err := ratelimit.Allow(ctx, pool, 1, three, nil); return err },
		"AllowAtMost": func() error { _, err := ratelimit.AllowAtMost(ctx, pool, 5, three, nil); return err },
		"Reserve":     func() error { _, err := ratelimit.Reserve(ctx, pool, 1, three, time.Hour, nil); return err },
		"refused":     func() error { _, err := ratelimit.Allow(ctx, pool, 2, three, nil); return err },
	} {
		before := rt.N()
		if err := call(); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if n := rt.N() - before; n != 1 {
			t.Errorf("%s sent %d statements, want 1", name, n)
		}
	}
}
