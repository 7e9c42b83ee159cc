package schedules_test

import (
	"testing"
	"time"

	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/schedules"
)

// TestDaylightSavingOnTheDatabaseClock runs a schedule across each kind of transition of
// 2026 in three zones, on the database clock: a local time in a spring-forward gap fires
// once at the first instant after the gap, and a local time that occurs twice fires at its
// first occurrence only (the claim of it sets the next tick past the second). The fire
// times are written out by hand from the zones' published rules, not computed by the
// package under test.
func TestDaylightSavingOnTheDatabaseClock(t *testing.T) {
	t.Parallel()
	utc := func(s string) time.Time {
		at, err := time.Parse(time.RFC3339, s)
		if err != nil {
			t.Fatal(err)
		}
		return at
	}
	for _, c := range []struct {
		name, zone, expr string
		from             string // the clock when the schedule is created
		fires, next      string // the tick that runs, and the one after it
	}{
		// 29 March: 02:00 CET jumps to 03:00 CEST; 02:30 does not exist.
		{"berlin-spring", "Europe/Berlin", "30 2 * * *", "2026-03-28T23:00:00Z", "2026-03-29T01:00:00Z", "2026-03-30T00:30:00Z"},
		// 25 October: 03:00 CEST falls back to 02:00 CET; 02:30 happens at 00:30Z and 01:30Z.
		{"berlin-fall", "Europe/Berlin", "30 2 * * *", "2026-10-25T00:00:00Z", "2026-10-25T00:30:00Z", "2026-10-26T01:30:00Z"},
		// 8 March: 02:00 EST jumps to 03:00 EDT.
		{"new-york-spring", "America/New_York", "30 2 * * *", "2026-03-08T06:00:00Z", "2026-03-08T07:00:00Z", "2026-03-09T06:30:00Z"},
		// 1 November: 02:00 EDT falls back to 01:00 EST; 01:30 happens at 05:30Z and 06:30Z.
		{"new-york-fall", "America/New_York", "30 1 * * *", "2026-11-01T05:00:00Z", "2026-11-01T05:30:00Z", "2026-11-02T06:30:00Z"},
		// 4 October: 02:00 LHST (+10:30) jumps 30 minutes to 02:30 LHDT (+11); 02:15 does not exist.
		{"lord-howe-spring", "Australia/Lord_Howe", "15 2 * * *", "2026-10-03T15:00:00Z", "2026-10-03T15:30:00Z", "2026-10-04T15:15:00Z"},
		// 5 April: 02:00 LHDT falls back 30 minutes to 01:30 LHST; 01:45 happens at 14:45Z and 15:15Z.
		{"lord-howe-fall", "Australia/Lord_Howe", "45 1 * * *", "2026-04-04T14:30:00Z", "2026-04-04T14:45:00Z", "2026-04-05T15:15:00Z"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			pool := pgtest.Pool(t)
			clock := pgtest.NewClock(t, pool)
			clock.Freeze(utc(c.from))
			info, err := schedules.Create(t.Context(), pool, schedules.Schedule{Name: c.name, Expr: c.expr, Zone: c.zone, Handler: "h"}, nil)
			if err != nil {
				t.Fatal(err)
			}
			if !info.NextTick.Equal(utc(c.fires)) {
				t.Fatalf("next tick %s, want %s", info.NextTick.UTC().Format(time.RFC3339), c.fires)
			}
			clock.Freeze(utc(c.fires).Add(30 * time.Second))
			calls := newCalls()
			stop := start(t, pool, map[string]schedules.Handler{"h": calls.handler()})
			pgtest.Until(t, "the tick ran", func() bool { return calls.count(c.name) == 1 })
			pgtest.Until(t, "the next tick is set", func() bool {
				info, err = schedules.Get(t.Context(), pool, c.name)
				return err == nil && info.NextTick.After(utc(c.fires))
			})
			stop()
			if !info.NextTick.Equal(utc(c.next)) {
				t.Errorf("after the tick the next one is %s, want %s", info.NextTick.UTC().Format(time.RFC3339), c.next)
			}
			if calls.runs[c.name][utc(c.fires)] != 1 || len(calls.all) != 1 {
				t.Errorf("runs %v, want tick %s once", calls.all, c.fires)
			}
		})
	}
}
