//go:build unix

package integration_test

import (
	"fmt"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/schedules"
)

// TestScheduleTicksRunOnceAcrossReplicaProcesses: three replica processes (each a
// schedules.Scheduler in its own OS process, sharing nothing but the database) and ten
// schedules in five zones — UTC, Europe/Berlin, America/New_York, Australia/Lord_Howe (a
// half-hour daylight saving shift), Asia/Kolkata (+05:30) — with the seconds field (every
// second, every two seconds), all ending ten seconds on: every tick from each schedule's
// first to its last runs exactly once — one call of the handler, and one run in the ledger,
// succeeded at its first attempt with the call's token — and nothing else is recorded
// (nothing missed or skipped). CatchUpAll and OverlapAllow make that hold on a busy machine
// too: a replica that claims a tick after the next one is due still runs both, and a run
// that has not finished does not hold the next tick back.
func TestScheduleTicksRunOnceAcrossReplicaProcesses(t *testing.T) {
	t.Parallel()
	pool, schema := workerDB(t, schedCallsSchema)
	startSchedReplicas(t, pool, schema, 3)
	var end time.Time
	if err := pool.QueryRow(t.Context(), `SELECT date_trunc('second', now()) + interval '10 seconds'`).Scan(&end); err != nil {
		t.Fatal(err)
	}
	zones := []string{"UTC", "Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "Asia/Kolkata"}
	var all []schedules.Schedule
	want := map[string][]time.Time{} // a schedule's ticks, from the first after its creation to its end
	for i := range 10 {
		s := schedules.Schedule{Name: fmt.Sprintf("s%d", i), Expr: "* * * * * *", Zone: zones[i%len(zones)], Handler: schedHandler,
			CatchUpPolicy: schedules.CatchUpAll, Overlap: schedules.OverlapAllow, EndsAt: end}
		if i%2 == 1 {
			s.Expr = "*/2 * * * * *"
		}
		info, err := schedules.Create(t.Context(), pool, s, nil)
		if err != nil {
			t.Fatal(err)
		}
		if want[s.Name], err = schedules.NextTicks(info.Schedule, info.CreatedAt, 1000); err != nil || len(want[s.Name]) == 0 {
			t.Fatalf("%s: ticks %v, %v; want some before %s", s.Name, want[s.Name], err, end)
		}
		all = append(all, s)
	}
	pgtest.Until(t, "every schedule ran a tick of its last five seconds", func() bool {
		return queryInt(t, pool, `SELECT count(DISTINCT schedule) FROM sched_calls WHERE tick >= $1`, end.Add(-5*time.Second)) == len(all)
	})
	pgtest.Until(t, "every schedule finished: no tick left to claim, no run running or pending", func() bool {
		return queryInt(t, pool, `SELECT count(*) FROM pgcoord_schedules s WHERE s.next_at IS NOT NULL OR s.arm_from IS NOT NULL
			OR EXISTS (SELECT FROM pgcoord_job_runs r WHERE r.job = s.name AND r.state IN ('running', 'pending'))`) == 0
	})

	var lateness []time.Duration
	perReplica := map[int]int{}
	for _, s := range all {
		calls, runs := map[time.Time][]schedCall{}, schedRunsOf(t, pool, s.Name)
		for _, c := range schedCallsOf(t, pool, s.Name) {
			calls[c.tick] = append(calls[c.tick], c)
			lateness = append(lateness, c.started.Sub(c.tick))
			perReplica[c.pid]++
		}
		ticks := want[s.Name]
		for _, tick := range ticks {
			cs, r := calls[tick], runs[tick]
			if len(cs) != 1 {
				t.Errorf("%s (%q in %s): tick %s was called %d times, want once", s.Name, s.Expr, s.Zone, tick, len(cs))
				continue
			}
			if r.state != "succeeded" || r.attempt != 1 || r.token != cs[0].token {
				t.Errorf("%s (%q in %s): tick %s is %q at attempt %d with token %d in the ledger; want succeeded at attempt 1 with the call's token %d",
					s.Name, s.Expr, s.Zone, tick, r.state, r.attempt, r.token, cs[0].token)
			}
		}
		if len(calls) != len(ticks) || len(runs) != len(ticks) {
			t.Errorf("%s (%q in %s): %d ticks called and %d rows in the ledger, want its %d ticks from %s to %s only; ledger: %v",
				s.Name, s.Expr, s.Zone, len(calls), len(runs), len(ticks), ticks[0], ticks[len(ticks)-1], runs)
		}
	}
	// Lateness is reported, not asserted (a test makes no timed assertion): its bound is
	// measured by the bench, `pgcoord bench` scenario schedules.lateness.
	slices.Sort(lateness)
	t.Logf("%d runs (by replica pid: %v); lateness, the handler's start by the database clock minus its tick: p50 %v, p99 %v, max %v",
		len(lateness), perReplica, percentile(lateness, 0.5), percentile(lateness, 0.99), lateness[len(lateness)-1])
}

// percentile is the nearest-rank p-th percentile of sorted, which is not empty.
func percentile(sorted []time.Duration, p float64) time.Duration {
	i := int(math.Ceil(float64(len(sorted))*p)) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}
