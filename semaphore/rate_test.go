package semaphore_test

import (
	"errors"
	"testing"
	"time"

	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/ratelimit"
	"github.com/pgcoord/pgcoord/semaphore"
)

// Fair admission that honours a rate per tenant: a key its rate refuses is passed over
// like a key at its limit, keeping its place in the fair order, and is served again when
// its rate allows; each admission is charged to the key's rate.
func TestNextHonoursRates(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	clock := pgtest.NewClock(t, pool)
	clock.Freeze(time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC))
	if _, err := ratelimit.Set(ctx, pool, ratelimit.Policy{Name: "tenant_rate", Rate: 1, Period: time.Hour, Burst: 2}); err != nil {
		t.Fatal(err)
	}
	for k, units := range map[string]int64{"big": 1_000_000, "small": 10} {
		if err := semaphore.SetLimit(ctx, pool, k, 100, nil); err != nil {
			t.Fatal(err)
		}
		if err := semaphore.AddDemand(ctx, pool, k, units, nil); err != nil {
			t.Fatal(err)
		}
	}
	rated := &semaphore.NextOpts{RatePolicy: "tenant_rate"}
	if got, want := nextSeq(t, pool, 5, rated), "big small big small -"; got != want {
		t.Fatalf("two a key, then nothing: %s, want %s", got, want)
	}
	for _, k := range []string{"big", "small"} {
		if s := mustGet(t, pool, k); s.VTime != 2 || s.Admitted != 2 {
			t.Fatalf("%s after its rate refused it: vtime %v, admitted %d; want 2 and 2 (passed over, not charged)", k, s.VTime, s.Admitted)
		}
		if st, err := ratelimit.State(ctx, pool, ratelimit.Limit{Policy: "tenant_rate", Key: k}); err != nil || st.Remaining != 0 {
			t.Fatalf("%s's rate after 2 admissions: %+v, %v", k, st, err)
		}
	}
	// Without the policy, concurrency alone limits.
	if got, want := nextSeq(t, pool, 2, nil), "big small"; got != want {
		t.Fatalf("without a rate policy: %s, want %s", got, want)
	}
	// An hour later each key has one unit of rate again.
	clock.Advance(time.Hour)
	if got, want := nextSeq(t, pool, 3, rated), "big small -"; got != want {
		t.Fatalf("an hour later: %s, want %s", got, want)
	}
	if _, err := semaphore.Next(ctx, pool, time.Minute, &semaphore.NextOpts{RatePolicy: "nope"}); err == nil || errors.Is(err, semaphore.ErrNoWork) {
		t.Fatalf("Next with a policy that does not exist: %v, want an error", err)
	}
	if _, err := semaphore.Next(ctx, pool, time.Minute, &semaphore.NextOpts{RatePolicy: "a\x1b"}); err == nil {
		t.Fatal("Next with a bad policy name succeeded")
	}
}
