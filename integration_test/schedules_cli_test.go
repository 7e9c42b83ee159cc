//go:build unix

package integration_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/pgcoord/pgcoord/internal/cli"
	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/schedules"
)

// TestScheduleChangedFromTheCLIWhileReplicasRun: while three replica processes run the
// schedule "report" on the even seconds ("*/2 * * * * *" in Asia/Kolkata) beside a
// "witness" that fires every second, the real pgcoord binary moves it to the odd seconds
// (`schedules update --expr`), pauses it (`schedules pause --note`) and resumes it
// (`schedules resume`). Judged by the database clock against each change's audit row
// (pgcoord_audit.at, the time of the change's transaction) and the ledger's claims
// (pgcoord_job_runs.started_at, the time of the claim's transaction):
//   - no run of an even tick (the old expression) is claimed after the update, and no tick
//     after it runs but an odd one;
//   - no run is claimed while the schedule is paused, and no tick that came while it was
//     paused runs, though the witness shows the replicas claiming ticks past it;
//   - after the resume a run starts again;
//   - the handler's record agrees with the ledger: each tick called once, with its run's token.
//
// A run claimed just before a change may enter its handler just after it (the claim's
// commit comes first, then the handler's own round trip): the documented "runs already
// running go on". Such handler starts are logged, not failed.
func TestScheduleChangedFromTheCLIWhileReplicasRun(t *testing.T) {
	t.Parallel()
	pgcoordBinary(t) // built before the replicas start, not while they run
	pool, schema := workerDB(t, schedCallsSchema)
	startSchedReplicas(t, pool, schema, 3)
	for _, s := range []schedules.Schedule{
		{Name: "report", Expr: "*/2 * * * * *", Zone: "Asia/Kolkata", Handler: schedHandler},
		{Name: "witness", Expr: "* * * * * *", Handler: schedHandler},
	} {
		if _, err := schedules.Create(t.Context(), pool, s, nil); err != nil {
			t.Fatal(err)
		}
	}
	// change runs `pgcoord schedules ARGS...` on report and returns when the change was
	// made, by its audit row.
	change := func(action string, args ...string) time.Time {
		t.Helper()
		args = append([]string{"--schema", schema, "--actor", "oncall", "schedules", action, "report"}, args...)
		if code, out, errOut := runCLI(t, pgtest.URL(t), args...); code != cli.ExitOK {
			t.Fatalf("pgcoord %s: exit %d, want %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), code, cli.ExitOK, out, errOut)
		}
		var at time.Time
		var n int
		if err := pool.QueryRow(t.Context(), `SELECT max(at), count(*) FROM pgcoord_audit WHERE action = $1 AND target = 'report' AND actor = 'oncall'`,
			"schedule."+action).Scan(&at, &n); err != nil || n != 1 {
			t.Fatalf("audit rows of the %s: %d, %v; want one", action, n, err)
		}
		return at.UTC()
	}
	calledAfter := func(schedule string, after time.Time) int {
		return queryInt(t, pool, `SELECT count(*) FROM sched_calls WHERE schedule = $1 AND tick > $2`, schedule, after)
	}

	pgtest.Until(t, "two ticks ran", func() bool { return calledAfter("report", time.Time{}) >= 2 })
	updated := change("update", "--expr", "1-59/2 * * * * *")
	pgtest.Until(t, "two ticks ran after the update", func() bool { return calledAfter("report", updated) >= 2 })
	paused := change("pause", "--note", "INC-7: the report service is down")
	// Progress, not a sleep: a replica claimed the witness's tick three seconds after the
	// pause, in a look at every due schedule, past at least one odd tick of report.
	pgtest.Until(t, "the replicas ran the witness three seconds past the pause", func() bool {
		return calledAfter("witness", paused.Add(3*time.Second-time.Microsecond)) > 0
	})
	resumed := change("resume")
	pgtest.Until(t, "a tick ran after the resume", func() bool { return calledAfter("report", resumed) > 0 })

	runs := schedRunsOf(t, pool, "report")
	for tick, r := range runs {
		odd := tick.Second()%2 == 1
		switch {
		case !odd && (tick.After(updated) || r.claimed.After(updated)):
			t.Errorf("even tick %s (the old expression) is %s, claimed at %s; the update was at %s", tick, r.state, r.claimed, updated)
		case odd && !tick.After(updated):
			t.Errorf("odd tick %s (the new expression) is %s; the update was later, at %s", tick, r.state, updated)
		case r.claimed.After(paused) && r.claimed.Before(resumed):
			t.Errorf("tick %s is %s, claimed at %s while paused (%s to %s)", tick, r.state, r.claimed, paused, resumed)
		case tick.After(paused) && !tick.After(resumed):
			t.Errorf("tick %s came while paused (%s to %s) and is %s", tick, paused, resumed, r.state)
		}
	}
	seen := map[time.Time]int{}
	var late []string
	for _, c := range schedCallsOf(t, pool, "report") {
		seen[c.tick]++
		r, ok := runs[c.tick]
		if !ok || r.token != c.token {
			t.Errorf("tick %s was called with token %d; the ledger has %+v (found: %v)", c.tick, c.token, r, ok)
		}
		for _, ch := range []struct {
			what string
			at   time.Time
		}{{"update", updated}, {"pause", paused}} {
			if r.claimed.Before(ch.at) && c.started.After(ch.at) {
				late = append(late, fmt.Sprintf("tick %s claimed %v before the %s, its handler started %v after it",
					c.tick.Format(time.TimeOnly), ch.at.Sub(r.claimed), ch.what, c.started.Sub(ch.at)))
			}
		}
	}
	for tick, n := range seen {
		if n != 1 {
			t.Errorf("tick %s was called %d times, want once", tick, n)
		}
	}
	t.Logf("%d ticks of report ran; runs claimed before a change whose handler started after it: %d %v", len(seen), len(late), late)
	info, err := schedules.Get(t.Context(), pool, "report")
	if err != nil {
		t.Fatal(err)
	}
	if info.Expr != "1-59/2 * * * * *" || info.Zone != "Asia/Kolkata" || info.Paused {
		t.Errorf("report is %q in %s, paused %v; want the new expression in its zone, resumed", info.Expr, info.Zone, info.Paused)
	}
}
