package singleton

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/pgcoord/pgcoord/internal/dbarg"
	"github.com/pgcoord/pgcoord/internal/pgtest"
)

// slotOf computes in Go the slot the database computes with date_bin, also before the
// origin and for odd strides.
func TestSlotOfMatchesDateBin(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	ctx := t.Context()
	r := rand.New(rand.NewPCG(1, 2))
	origins := []time.Time{epoch, time.Date(2024, 1, 1, 9, 0, 0, 0, time.UTC), time.Date(2030, 6, 1, 0, 0, 0, 123456000, time.UTC)}
	for i := range 300 {
		every := time.Duration(1+r.Int64N(int64(400*24*time.Hour/time.Microsecond))) * time.Microsecond
		if every > MaxEvery {
			every = MaxEvery
		}
		origin := origins[i%len(origins)]
		at := time.UnixMicro(r.Int64N(int64(100 * 365 * 24 * time.Hour / time.Microsecond))).UTC()
		var want time.Time
		if err := pool.QueryRow(ctx, `SELECT date_bin($1::interval, $2::timestamptz, $3::timestamptz)`,
			dbarg.Interval(every), at, origin).Scan(&want); err != nil {
			t.Fatal(err)
		}
		if got := slotOf(at, every, origin); !got.Equal(want) {
			t.Fatalf("slotOf(%v, %v, %v) = %v; date_bin says %v", at, every, origin, got, want)
		}
	}
}

// Schedule times its claims by the database clock: replicas whose own clocks are off by
// a fraction of a slot (plus whole seconds) still claim each tick just after its boundary
// — none before it, and the median tick well within maxLag (a loaded machine may delay a
// tick or two) — and miss none. Timing by the local clock would claim every tick 350ms
// late, or 350ms early (in the previous slot, which already ran).
func TestScheduleFollowsTheDatabaseClock(t *testing.T) {
	t.Parallel()
	const (
		every  = 800 * time.Millisecond
		delay  = 50 * time.Millisecond
		window = 4 * time.Second
		// maxLag is how late after its boundary a claim may come: delay plus room for a
		// loaded machine, well below the 400ms a clock 350ms behind would give.
		maxLag = 250 * time.Millisecond
	)
	pool := pgtest.Pool(t)
	skews := []time.Duration{350 * time.Millisecond, -350 * time.Millisecond, 5*time.Second + 350*time.Millisecond, -3*time.Second - 350*time.Millisecond}
	ctx, cancel := context.WithTimeout(t.Context(), window)
	defer cancel()
	errs := make(chan error, len(skews))
	for i, skew := range skews {
		job := Job{Name: fmt.Sprintf("skewed-%d", i), Every: every, TTL: 5 * time.Second}
		go func() {
			errs <- Schedule(ctx, pool, job, func(context.Context, Run) error { return nil },
				&ScheduleOpts{Delay: delay, now: func() time.Time { return time.Now().Add(skew) }})
		}()
	}
	for range skews {
		select {
		case err := <-errs:
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("Schedule returned %v", err)
			}
		case <-time.After(window + 15*time.Second):
			t.Fatal("Schedule did not return")
		}
	}
	for i, skew := range skews {
		rs, err := ListRuns(t.Context(), pool, fmt.Sprintf("skewed-%d", i), nil)
		if err != nil {
			t.Fatal(err)
		}
		if len(rs) < int(window/every)-1 {
			t.Errorf("clock off by %v: %d ticks ran in %v, want about %d", skew, len(rs), window, window/every)
		}
		var lags []time.Duration
		for j, r := range rs {
			if j > 0 && !rs[j-1].ScheduledFor.Equal(r.ScheduledFor.Add(every)) {
				t.Errorf("clock off by %v: no tick between %v and %v", skew, r.ScheduledFor, rs[j-1].ScheduledFor)
			}
			lag := r.StartedAt.Sub(r.ScheduledFor)
			if lag < 0 {
				t.Errorf("clock off by %v: tick %v claimed %v before its boundary", skew, r.ScheduledFor, -lag)
			}
			lags = append(lags, lag)
		}
		slices.Sort(lags)
		if len(lags) > 0 && lags[len(lags)/2] > maxLag {
			t.Errorf("clock off by %v: ticks claimed %v after their boundaries; want about %v", skew, lags, delay)
		}
	}
}
