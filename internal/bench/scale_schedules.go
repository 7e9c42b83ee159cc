package bench

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/internal/dbsqlc"
)

// The schedules' scale scenarios, among N stored schedules of one handler, a few of them
// due and the others due later (issue: 10k schedules at 0.5 or more of the rate of 100):
//
//   - scale.schedules_due_scan.N: a Scheduler's look for due ticks, as each of its passes
//     makes it: ScheduleDue, then ScheduleNextDue (when to wake);
//   - scale.schedules_pass.N: the four reads of a pass that finds nothing to arm, claim or
//     start: ScheduleUnarmed, ScheduleDue, ScheduleNextDue and ScheduleWaiting.
//
// The ops run the Scheduler's own statements (internal/dbsqlc) with its batch size, on the
// worker's pool; they claim nothing, so the same schedules stay due.

const (
	// scaleSchedulesDue is how many of the loaded schedules are due (a minute ago).
	scaleSchedulesDue = 3
	// schedulerBatch is what package schedules' Scheduler asks each look for at most.
	schedulerBatch = 100
	// scaleSchedulesHandler is the loaded schedules' handler, and the ops'.
	scaleSchedulesHandler = "bench"
)

var schedulerQueries dbsqlc.Queries

func init() {
	what := fmt.Sprintf("for the handler of every schedule, %d of them due and the others due over the hour from an "+
		"hour ahead (so that none falls due during a bench), claiming nothing", scaleSchedulesDue)
	for _, f := range []scaleFamily{{
		name: "schedules_due_scan", unit: "schedules", sizes: []int{100, 1000, 10000},
		what: fmt.Sprintf("a Scheduler's look for due ticks: ScheduleDue (up to %d rows), then ScheduleNextDue, %s",
			schedulerBatch, what),
		load: loadSchedules, newOp: newScaleDueScanOp,
	}, {
		name: "schedules_pass", unit: "schedules", sizes: []int{100, 1000, 10000},
		what: fmt.Sprintf("the four reads of a Scheduler's pass: ScheduleUnarmed, ScheduleDue, ScheduleNextDue and "+
			"ScheduleWaiting (up to %d rows each), %s", schedulerBatch, what),
		load: loadSchedules, newOp: newScalePassOp,
	}} {
		f.register()
	}
}

// loadSchedules stores n armed schedules of scaleSchedulesHandler, as rows: the first
// scaleSchedulesDue due a minute ago, the others due over the hour that starts one to two
// hours ahead, each at its own tick (a seconds-field expression: that minute and second of
// every hour).
func loadSchedules(ctx context.Context, pool *pgxpool.Pool, n int) error {
	err := insertSchedules(ctx, pool, `
		SELECT 'due/' || g AS name, $3::text AS handler,
		       CASE WHEN g <= $2 THEN '0 * * * * *' ELSE format('%s %s * * * *', o.s % 60, o.s / 60) END AS expr,
		       CASE WHEN g <= $2 THEN date_trunc('minute', pgcoord_now()) - interval '1 minute'
		            ELSE date_trunc('hour', pgcoord_now()) + interval '2 hours' + o.s * interval '1 second' END AS at
		  FROM generate_series(1, $1::int) g, LATERAL (SELECT g * 3600 / $1::int AS s) o`,
		n, scaleSchedulesDue, scaleSchedulesHandler)
	if err != nil {
		return fmt.Errorf("load pgcoord_schedules: %w", err)
	}
	_, err = pool.Exec(ctx, `ANALYZE pgcoord_jobs, pgcoord_schedules`)
	return err
}

// dueScan runs ScheduleDue and ScheduleNextDue on pool and checks what they found among
// n loaded schedules: the due ones, and a next one when there are more.
func dueScan(ctx context.Context, pool *pgxpool.Pool, n int) error {
	handlers := []string{scaleSchedulesHandler}
	due, err := schedulerQueries.ScheduleDue(ctx, pool, dbsqlc.ScheduleDueParams{Handlers: handlers, MaxRows: schedulerBatch})
	if err != nil {
		return fmt.Errorf("due: %w", err)
	}
	next, err := schedulerQueries.ScheduleNextDue(ctx, pool, handlers)
	if err != nil {
		return fmt.Errorf("next due: %w", err)
	}
	if want := min(n, scaleSchedulesDue); len(due) != want || len(next) != min(1, n-want) {
		return fmt.Errorf("found %d due schedules and %d next, want %d and %d", len(due), len(next), want, min(1, n-want))
	}
	return nil
}

func newScaleDueScanOp(_ Worker, n int) scaleOp {
	return func(ctx context.Context, pool *pgxpool.Pool) error {
		if err := dueScan(ctx, pool, n); err != nil {
			return fmt.Errorf("bench: scale.schedules_due_scan: %w", err)
		}
		return nil
	}
}

func newScalePassOp(_ Worker, n int) scaleOp {
	return func(ctx context.Context, pool *pgxpool.Pool) error {
		unarmed, err := schedulerQueries.ScheduleUnarmed(ctx, pool, schedulerBatch)
		if err != nil {
			return fmt.Errorf("bench: scale.schedules_pass: unarmed: %w", err)
		}
		if err := dueScan(ctx, pool, n); err != nil {
			return fmt.Errorf("bench: scale.schedules_pass: %w", err)
		}
		waiting, err := schedulerQueries.ScheduleWaiting(ctx, pool, dbsqlc.ScheduleWaitingParams{
			Handlers: []string{scaleSchedulesHandler}, MaxRows: schedulerBatch,
		})
		if err != nil {
			return fmt.Errorf("bench: scale.schedules_pass: waiting: %w", err)
		}
		if len(unarmed) != 0 || len(waiting) != 0 {
			return fmt.Errorf("bench: scale.schedules_pass: %d unarmed and %d waiting schedules, want none", len(unarmed), len(waiting))
		}
		return nil
	}
}
