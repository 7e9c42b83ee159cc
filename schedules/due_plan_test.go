package schedules_test

import (
	"testing"

	"github.com/pgcoord/pgcoord/internal/dbsqlc"
	"github.com/pgcoord/pgcoord/internal/pgtest"
)

// Shape of TestDueScanPlansStayIndexed: many schedules of the Scheduler's handler, a few
// of them due, the others due later.
const (
	planSchedules = 10000
	planDue       = 3
	planRowBound  = 10 // rows any plan node may read or filter out: a few times what it finds
)

// A Scheduler's look for due ticks (ScheduleDue, then ScheduleNextDue, as each pass sends
// them) costs what it finds, not what is stored: on freshly loaded, unanalyzed tables, in
// each of a session's first 6 looks (custom plans, then the plan cache's choice) and under
// a forced generic plan, both reach pgcoord_schedules through its index of due times
// (pgcoord_schedules_due), never by a sequential scan, no plan node reads or filters out
// more than a few rows, and nothing is compiled with JIT.
func TestDueScanPlansStayIndexed(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pgtest.Pool(t)
	ex := pgtest.AutoExplain(t, pool)
	ex.Exec(`ALTER TABLE pgcoord_jobs SET (autovacuum_enabled = off)`)
	ex.Exec(`ALTER TABLE pgcoord_schedules SET (autovacuum_enabled = off)`)
	ex.Exec(`INSERT INTO pgcoord_jobs (name, kind, overlap) SELECT 's' || g, 'cron', 'forbid' FROM generate_series(1, $1::int) g`, planSchedules)
	// The first planDue due a minute ago, the others over the hour from an hour ahead.
	ex.Exec(`INSERT INTO pgcoord_schedules (name, expr, zone, handler, catch_up, catch_up_policy, jitter, next_at, due_at, updated_by)
	         SELECT 's' || g, '0 * * * * *', 'UTC', 'h', interval '1 hour', 'latest', interval '0', t.at, t.at, 'test'
	           FROM generate_series(1, $1::int) g,
	                LATERAL (SELECT CASE WHEN g <= $2 THEN pgcoord_now() - interval '1 minute'
	                                     ELSE pgcoord_now() + interval '1 hour' + g * interval '1 hour' / $1::int END AS at) t`,
		planSchedules, planDue)
	var q dbsqlc.Queries
	handlers := []string{"h"}
	check := func(call int, what string, plans []pgtest.Explained) {
		t.Helper()
		if len(plans) == 0 {
			t.Fatalf("call %d of %s: auto_explain logged no plan of it", call, what)
		}
		for _, p := range plans {
			if p.JIT != nil {
				t.Errorf("call %d of %s: compiled with JIT (%d functions)", call, what, p.JIT.Functions)
			}
			indexed := false
			p.Plan.Walk(func(n pgtest.PlanNode) {
				indexed = indexed || n.Index == "pgcoord_schedules_due"
				if n.Type == "Seq Scan" && n.Relation == "pgcoord_schedules" ||
					n.Rows*n.Loops > planRowBound || n.RemovedByFilter*n.Loops > planRowBound {
					t.Errorf("call %d of %s: a plan node does O(schedules) work: %v\nin the plan of\n%s", call, what, n, p.Query)
				}
			})
			if !indexed {
				t.Errorf("call %d of %s: pgcoord_schedules_due is not used in the plan of\n%s", call, what, p.Query)
			}
		}
	}
	for call := 1; call <= 7; call++ {
		if call == 7 {
			ex.Exec(`SET plan_cache_mode = force_generic_plan`)
		}
		var due []dbsqlc.ScheduleDueRow
		plans := ex.Plans("ScheduleDue :many", func() {
			var err error
			if due, err = q.ScheduleDue(ctx, ex.Conn, dbsqlc.ScheduleDueParams{Handlers: handlers, MaxRows: 100}); err != nil {
				t.Fatal(err)
			}
		})
		if len(due) != planDue {
			t.Errorf("call %d: %d schedules due, want %d", call, len(due), planDue)
		}
		check(call, "ScheduleDue", plans)
		var next []dbsqlc.ScheduleNextDueRow
		plans = ex.Plans("ScheduleNextDue :many", func() {
			var err error
			if next, err = q.ScheduleNextDue(ctx, ex.Conn, handlers); err != nil {
				t.Fatal(err)
			}
		})
		if len(next) != 1 || !next[0].DueAt.After(next[0].DbNow) {
			t.Errorf("call %d: next due %+v, want one in the future", call, next)
		}
		check(call, "ScheduleNextDue", plans)
	}
}
