package sqlclients

import (
	"context"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/pgcoord"
)

// The pg_cron recipe, loaded with psql as README.md says, run by pg_cron itself: its
// retention job collects what is older than its retention and keeps the rest, and its
// minute job, scheduled twice so that two runs race for every tick, claims each tick once:
// one run does the work, the other finds the tick claimed. pg_cron 1.4 (Debian 12's) fires
// at minute boundaries, so the test waits for the next one or two.
func TestCronRecipe(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := startCronCluster(t)
	app, admin := c.pool("app"), c.pool("postgres")
	if _, err := pgcoord.Migrate(ctx, app, nil); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	exec := func(pool *pgxpool.Pool, sql string) {
		t.Helper()
		if _, err := pool.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	// What the retention (30 days) collects: three leases and a fence register, aged by 31
	// days; what it keeps: a lease released now. And a backlog of two messages.
	exec(app, `SELECT pgcoord_lease_release(l.name, l.holder, l.fence_token)
		FROM generate_series(1, 3) i, pgcoord_lease_acquire('old-' || i, 'w', interval '1 minute') l`)
	exec(app, `SELECT pgcoord_fence_check(name, fence_token) FROM pgcoord_leases WHERE name = 'old-1'`)
	exec(app, `UPDATE pgcoord_leases SET released_at = released_at - interval '31 days' WHERE name LIKE 'old-%'`)
	exec(app, `UPDATE pgcoord_fences SET updated_at = updated_at - interval '31 days'`)
	exec(app, `SELECT pgcoord_lease_release(name, holder, fence_token) FROM pgcoord_lease_acquire('recent', 'w', interval '1 minute')`)
	exec(app, `SELECT pgcoord_outbox_enqueue('orders', 'order-' || i, '{}') FROM generate_series(1, 2) i`)
	var oldToken int64
	if err := app.QueryRow(ctx, `SELECT fence_token FROM pgcoord_fences WHERE resource = 'old-1'`).Scan(&oldToken); err != nil {
		t.Fatal(err)
	}

	recipe, err := os.Open("cron.sql")
	if err != nil {
		t.Fatal(err)
	}
	defer recipe.Close()
	c.psql("app", "coord", recipe)
	// Retention every minute rather than hourly, and a second schedule of the minute job.
	exec(admin, `SELECT cron.alter_job(jobid, schedule => '* * * * *') FROM cron.job WHERE jobname = 'pgcoord-gc'`)
	exec(app, `SELECT cron.schedule('minute-report-2', '* * * * *', 'CALL minute_report()')`)

	// Wait for a minute in which both schedules of the minute job ran, and for a run of the
	// retention job: by the next boundary, or the one after if pg_cron read the schedules
	// after the next one passed.
	limit := 2*time.Minute - time.Since(time.Now().Truncate(time.Minute)) + pgtest.WaitLimit
	tick := waitCron(t, admin, limit)

	// The tick: claimed once, by one of the two runs of that minute, which did the work.
	var holder, state string
	var token, backlog int64
	var reports int
	var pids []string
	err = admin.QueryRow(ctx, `
		SELECT r.holder, r.state, r.fence_token,
		       (SELECT count(*) FROM minute_reports m WHERE m.scheduled_for = r.scheduled_for
		           AND m.fence_token = r.fence_token AND m.holder = r.holder),
		       (SELECT max(m.outbox_backlog) FROM minute_reports m WHERE m.scheduled_for = r.scheduled_for),
		       ARRAY(SELECT 'pg_cron/' || d.job_pid FROM cron.job_run_details d JOIN cron.job j USING (jobid)
		              WHERE j.jobname LIKE 'minute-report%' AND date_trunc('minute', d.start_time) = $1)
		  FROM pgcoord_job_runs r WHERE r.job = 'minute-report' AND r.scheduled_for = $1`, tick,
	).Scan(&holder, &state, &token, &reports, &backlog, &pids)
	if err != nil {
		t.Fatalf("the run of tick %v: %v", tick, err)
	}
	if state != "succeeded" || reports != 1 || backlog != 2 || len(pids) != 2 || !slices.Contains(pids, holder) {
		t.Errorf("tick %v: run by %s (%s, token %d), %d reports of it with backlog %d; pg_cron's runs: %v;"+
			" want succeeded, by one of two runs, with one report of backlog 2", tick, holder, state, token, reports, backlog, pids)
	}
	var rows, ticks int
	if err := admin.QueryRow(ctx, `SELECT count(*), count(DISTINCT scheduled_for) FROM minute_reports`).Scan(&rows, &ticks); err != nil || rows != ticks {
		t.Errorf("minute_reports: %d rows for %d ticks (%v), want one per tick", rows, ticks, err)
	}

	// The retention: the old rows are gone, the recent lease stays, and the collected
	// register's token is still refused (the retired floor).
	var old, recent, stale int
	err = pgx.BeginFunc(ctx, app, func(tx pgx.Tx) error {
		return tx.QueryRow(ctx, `
			SELECT (SELECT count(*) FROM pgcoord_leases WHERE name LIKE 'old-%')
			     + (SELECT count(*) FROM pgcoord_fences WHERE resource LIKE 'old-%'),
			       (SELECT count(*) FROM pgcoord_leases WHERE name = 'recent'),
			       (SELECT count(*) FROM pgcoord_fence_check('old-1', $1))`, oldToken).Scan(&old, &recent, &stale)
	})
	if err != nil || old != 0 || recent != 1 || stale != 0 {
		t.Errorf("after retention: %d old rows, %d recent leases, old-1's token %d accepted %d times (%v); want 0, 1, 0",
			old, recent, oldToken, stale, err)
	}
}

// waitCron polls pg_cron's run history, at most limit, until a run of the retention job
// has succeeded and both schedules of the minute job have succeeded in one minute, which it
// returns. It fails t as soon as a run failed.
func waitCron(t *testing.T, admin *pgxpool.Pool, limit time.Duration) time.Time {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		var failed string
		var gcDone bool
		var raced *time.Time
		err := admin.QueryRow(context.Background(), `
			SELECT coalesce(string_agg(j.jobname || ': ' || coalesce(d.return_message, ''), '; ')
			                FILTER (WHERE d.status = 'failed'), ''),
			       coalesce(bool_or(j.jobname = 'pgcoord-gc' AND d.status = 'succeeded'), false),
			       (SELECT min(m) FROM (
			            SELECT date_trunc('minute', d2.start_time) AS m
			              FROM cron.job_run_details d2 JOIN cron.job j2 USING (jobid)
			             WHERE j2.jobname LIKE 'minute-report%' AND d2.status = 'succeeded'
			             GROUP BY 1 HAVING count(DISTINCT j2.jobname) = 2) raced)
			  FROM cron.job_run_details d JOIN cron.job j USING (jobid)`).Scan(&failed, &gcDone, &raced)
		if err != nil {
			t.Fatalf("pg_cron's run history: %v", err)
		}
		if failed != "" {
			t.Fatalf("pg_cron runs failed: %s", failed)
		}
		if gcDone && raced != nil {
			return *raced
		}
		if time.Now().After(deadline) {
			t.Fatalf("pg_cron: the jobs did not run within %v (retention job done: %v, minute with both schedules: %v)",
				limit, gcDone, raced)
		}
		time.Sleep(250 * time.Millisecond)
	}
}
