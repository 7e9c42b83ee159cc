package schedules_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/schedules"
)

// TestEachTickRunsOnceAcrossReplicas: three schedulers (each with a pool of its own, as
// three processes would have) and ten schedules that fire every second or two, in
// different zones, with the seconds field: every tick from each schedule's first run to its
// last runs exactly once, and none is missed or skipped (whatever the machine's load, with
// the catch-up policy all and overlap allowed).
func TestEachTickRunsOnceAcrossReplicas(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Schema(t)
	pgtest.Migrate(t, pool, nil)
	zones := []string{"UTC", "Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "Asia/Kolkata"}
	var names []string
	for i := range 10 {
		expr := "* * * * * *"
		if i%2 == 1 {
			expr = "*/2 * * * * *"
		}
		// CatchUpAll and OverlapAllow: a busy machine may claim a tick after the next one is
		// due, or before the previous run finished; each must still run once.
		s := schedules.Schedule{Name: fmt.Sprintf("s%d", i), Expr: expr, Zone: zones[i%len(zones)], Handler: "h",
			CatchUpPolicy: schedules.CatchUpAll, Overlap: schedules.OverlapAllow}
		if _, err := schedules.Create(t.Context(), pool, s, nil); err != nil {
			t.Fatal(err)
		}
		names = append(names, s.Name)
	}
	c := newCalls()
	var stops []func()
	for range 3 {
		stops = append(stops, start(t, pgtest.NewPool(t, pgtest.URL(t), schema), map[string]schedules.Handler{"h": c.handler()}))
	}
	pgtest.Until(t, "every schedule ran four ticks", func() bool {
		for _, n := range names {
			if c.count(n) < 4 {
				return false
			}
		}
		return true
	})
	for _, stop := range stops {
		stop()
	}
	for _, n := range names {
		info, err := schedules.Get(t.Context(), pool, n)
		if err != nil {
			t.Fatal(err)
		}
		c.mu.Lock()
		ran := c.runs[n]
		var first, last time.Time
		for tick, k := range ran {
			if k != 1 {
				t.Errorf("%s: tick %s ran %d times", n, tick, k)
			}
			if first.IsZero() || tick.Before(first) {
				first = tick
			}
			if tick.After(last) {
				last = tick
			}
		}
		c.mu.Unlock()
		want, err := schedules.NextTicks(info.Schedule, first.Add(-time.Nanosecond), 1000)
		if err != nil {
			t.Fatal(err)
		}
		for _, tick := range want {
			if tick.After(last) {
				break
			}
			if ran[tick] != 1 {
				t.Errorf("%s: tick %s ran %d times, want once", n, tick, ran[tick])
			}
		}
		if _, ticks := runStates(t, pool, n); ticks["missed"]+ticks["skipped"] != 0 {
			t.Errorf("%s: %d ticks missed, %d skipped; want none", n, ticks["missed"], ticks["skipped"])
		}
	}
}

// TestMisfireCatchUp: no scheduler runs across three ticks of an hourly schedule with a
// catch-up window of two hours; when one starts, the policy's ticks run once and the tick
// older than the window is recorded as missed.
func TestMisfireCatchUp(t *testing.T) {
	t.Parallel()
	for _, policy := range []schedules.CatchUpPolicy{schedules.CatchUpLatest, schedules.CatchUpAll} {
		t.Run(string(policy), func(t *testing.T) {
			t.Parallel()
			pool := pgtest.Pool(t)
			clock := pgtest.NewClock(t, pool)
			t0 := time.Date(2026, 3, 2, 8, 30, 0, 0, time.UTC)
			clock.Freeze(t0)
			if _, err := schedules.Create(t.Context(), pool, schedules.Schedule{Name: "hourly", Expr: "0 * * * *", Handler: "h",
				CatchUp: 2 * time.Hour, CatchUpPolicy: policy}, nil); err != nil {
				t.Fatal(err)
			}
			clock.Freeze(t0.Add(3*time.Hour + 20*time.Minute)) // 11:50: 09:00 is missed, 10:00 and 11:00 are due
			c := newCalls()
			stop := start(t, pool, map[string]schedules.Handler{"h": c.handler()})
			want := 1
			if policy == schedules.CatchUpAll {
				want = 2
			}
			pgtest.Until(t, "the due ticks ran", func() bool { return c.count("hourly") >= want })
			pgtest.Until(t, "no run left to start", func() bool {
				info, err := schedules.Get(t.Context(), pool, "hourly")
				return err == nil && info.NextTick.Equal(time.Date(2026, 3, 2, 12, 0, 0, 0, time.UTC))
			})
			stop()
			states, ticks := runStates(t, pool, "hourly")
			at := func(h int) time.Time { return time.Date(2026, 3, 2, h, 0, 0, 0, time.UTC) }
			if states[at(9)] != "missed" || ticks["missed"] != 1 {
				t.Errorf("09:00 is %q and %d ticks missed; want missed, 1", states[at(9)], ticks["missed"])
			}
			if states[at(11)] != "succeeded" || c.runs["hourly"][at(11)] != 1 {
				t.Errorf("11:00 is %q, ran %d times; want succeeded once", states[at(11)], c.runs["hourly"][at(11)])
			}
			wantTen := "skipped"
			if policy == schedules.CatchUpAll {
				wantTen = "succeeded"
			}
			if states[at(10)] != wantTen {
				t.Errorf("10:00 is %q, want %q", states[at(10)], wantTen)
			}
			if len(c.all) != want {
				t.Errorf("%d runs, want %d: %v", len(c.all), want, c.all)
			}
		})
	}
}

// TestChangeAppliesFromTheNextTick: while two schedulers run a schedule every second, a
// change of its expression, then a pause, are each acknowledged by the call's return; no
// run is for a tick of the old expression after the change, and none starts while paused.
func TestChangeAppliesFromTheNextTick(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Schema(t)
	pgtest.Migrate(t, pool, nil)
	s := schedules.Schedule{Name: "every", Expr: "* * * * * *", Handler: "h"}
	if _, err := schedules.Create(t.Context(), pool, s, nil); err != nil {
		t.Fatal(err)
	}
	c := newCalls()
	var started []time.Time // when, by the database clock, each run started
	h := func(ctx context.Context, run schedules.Run) error {
		var now time.Time
		if err := pool.QueryRow(ctx, "SELECT clock_timestamp()").Scan(&now); err != nil {
			return err
		}
		c.mu.Lock()
		started = append(started, now)
		c.mu.Unlock()
		c.record(run)
		return nil
	}
	for range 2 {
		start(t, pgtest.NewPool(t, pgtest.URL(t), schema), map[string]schedules.Handler{"h": h})
	}
	pgtest.Until(t, "two ticks ran", func() bool { return c.count("every") >= 2 })
	s.Expr = "*/3 * * * * *"
	info, err := schedules.Update(t.Context(), pool, s, nil)
	if err != nil {
		t.Fatal(err)
	}
	changedAt := info.UpdatedAt
	n := c.count("every")
	pgtest.Until(t, "two ticks of the new expression ran", func() bool { return c.count("every") >= n+2 })
	if _, err := schedules.Pause(t.Context(), pool, "every", "maintenance", &schedules.ChangeOpts{Actor: "support"}); err != nil {
		t.Fatal(err)
	}
	var pausedAt time.Time
	if err := pool.QueryRow(t.Context(), "SELECT clock_timestamp()").Scan(&pausedAt); err != nil {
		t.Fatal(err)
	}
	// Ticks come every three seconds: wait for the schedulers to have looked at least once
	// past the next one, by the ledger's view of the schedule.
	next := time.Now().Add(4 * time.Second)
	pgtest.Until(t, "a tick of the paused schedule passed", func() bool { return time.Now().After(next) })
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, run := range c.all {
		if run.Tick.After(changedAt) && run.Tick.Second()%3 != 0 {
			t.Errorf("tick %s of the old expression ran after the change at %s", run.Tick, changedAt)
		}
	}
	for _, at := range started {
		if at.After(pausedAt) {
			t.Errorf("a run started at %s, after the pause at %s", at, pausedAt)
		}
	}
}
