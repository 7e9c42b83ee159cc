package schedules_test

import (
	"context"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/internal/pgtest"
)

// A claim case: a schedule in some state, and the claim a Scheduler sends for it.
type claimCase struct {
	name    string
	set     string // columns of pgcoord_schedules other than the defaults, as "col = value, ..."
	overlap string // the job's overlap, if not 'forbid'
	setup   string // SQL statements (separated by "; ") run after the rows exist, with $1 the schedule's name
	version int64
	from    time.Time
	missed  int64
	ticks   []time.Time
	next    *time.Time
	slow    bool // pgcoord_schedule_claim_many leaves it to pgcoord_schedule_claim
}

// TestClaimManyDecidesAsClaim: pgcoord_schedule_claim_many, which makes the usual claims of
// a batch together in a few statements and leaves the others to pgcoord_schedule_claim,
// decides every case as pgcoord_schedule_claim does alone. Two copies of the same
// schedules, in the same states, are claimed, one copy in one batch and the other one by
// one: they return the same runs and end with the same ledger and next ticks. The usual
// claims take no call of pgcoord_schedule_claim, and the others one each.
func TestClaimManyDecidesAsClaim(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	clock := pgtest.NewClock(t, pool)
	tick := time.Date(2026, 6, 1, 10, 0, 0, 0, time.UTC)
	clock.Freeze(tick.Add(30 * time.Second))
	next := tick.Add(time.Hour)
	running := `INSERT INTO pgcoord_job_runs (job, scheduled_for, state, fence_token, holder, started_at, expires_at)
	            VALUES ($1, timestamptz '2026-06-01 09:00Z', 'running', 1, 'other', pgcoord_now(), pgcoord_now() + interval '1 minute')`
	cases := []claimCase{
		{name: "usual"},
		{name: "busy forbid", setup: running, slow: true},
		{name: "busy allow", overlap: "allow", setup: running},
		{name: "busy buffer", overlap: "buffer", setup: running, slow: true},
		{name: "busy replace", overlap: "replace", setup: running, slow: true},
		{name: "lease expired", setup: running + `; UPDATE pgcoord_job_runs SET expires_at = pgcoord_now() WHERE job = $1`},
		{name: "other handler", set: "handler = 'other'", slow: true},
		{name: "older than the window", set: "catch_up = interval '10 seconds'", slow: true},
		{name: "triggered at the tick", setup: `INSERT INTO pgcoord_job_runs (job, scheduled_for, state, fence_token, holder, started_at, cause)
		                                        VALUES ($1, timestamptz '2026-06-01 10:00Z', 'pending', 0, 'cli', pgcoord_now(), 'trigger')`},
		{name: "ends before next", set: "ends_at = timestamptz '2026-06-01 10:30Z'"},
		{name: "jitter", set: "jitter = interval '10 minutes'"},
		{name: "stale version", version: 2},
		{name: "paused", set: "paused_at = pgcoord_now()"},
		{name: "last tick", next: new(time.Time)},
		{name: "two ticks latest", set: "next_at = timestamptz '2026-06-01 09:00Z', catch_up = interval '2 hours'", from: tick.Add(-time.Hour),
			ticks: []time.Time{tick.Add(-time.Hour), tick}, slow: true},
		{name: "two ticks all", set: "next_at = timestamptz '2026-06-01 09:00Z', catch_up = interval '2 hours', catch_up_policy = 'all'", from: tick.Add(-time.Hour),
			ticks: []time.Time{tick.Add(-time.Hour), tick}, slow: true},
		{name: "missed by the caller", set: "next_at = timestamptz '2026-06-01 08:00Z'", from: tick.Add(-2 * time.Hour),
			missed: 2, slow: true},
	}
	for i := range cases {
		c := &cases[i]
		if c.version == 0 {
			c.version = 1
		}
		if c.from.IsZero() {
			c.from = tick
		}
		if c.ticks == nil {
			c.ticks = []time.Time{tick}
		}
		switch {
		case c.next == nil:
			c.next = &next
		case c.next.IsZero():
			c.next = nil
		}
	}
	for _, copy := range []string{"many", "one"} {
		for _, c := range cases {
			createClaimCase(t, pool, copy+"/"+c.name, c)
		}
	}
	many, calls := claimMany(t, pool, cases)
	one := map[string]string{}
	for _, c := range cases {
		for _, r := range claimOne(t, pool, c) {
			one[c.name] += r
		}
	}
	if !maps.Equal(many, one) {
		for _, c := range cases {
			if many[c.name] != one[c.name] {
				t.Errorf("%s: claimed in a batch:\n\t%s\nalone:\n\t%s", c.name, many[c.name], one[c.name])
			}
		}
	}
	if after := ledger(t, pool, "many/"); !slices.Equal(after, ledger(t, pool, "one/")) {
		t.Errorf("the ledgers differ:\n\tbatch: %v\n\talone: %v", after, ledger(t, pool, "one/"))
	}
	slow := 0
	for _, c := range cases {
		if c.slow {
			slow++
		}
	}
	if calls != slow {
		t.Errorf("the batch called pgcoord_schedule_claim %d times, want %d (its usual claims are made together)", calls, slow)
	}
	if many["usual"] == "" || many["busy allow"] == "" {
		t.Errorf("the usual claims started no run: %v", many)
	}
}

// createClaimCase writes a schedule of "0 * * * *" whose tick of 10:00 is due, as c says.
func createClaimCase(t *testing.T, pool *pgxpool.Pool, name string, c claimCase) {
	t.Helper()
	ctx := t.Context()
	overlap := c.overlap
	if overlap == "" {
		overlap = "forbid"
	}
	statements := []string{
		`INSERT INTO pgcoord_jobs (name, kind, overlap) VALUES ($1, 'cron', '` + overlap + `')`,
		`INSERT INTO pgcoord_schedules (name, expr, zone, handler, catch_up, catch_up_policy, jitter, next_at, due_at, updated_by)
		 VALUES ($1, '0 * * * *', 'UTC', 'h', interval '1 hour', 'latest', interval '0',
		         timestamptz '2026-06-01 10:00Z', timestamptz '2026-06-01 10:00Z', 'test')`,
	}
	if c.set != "" {
		statements = append(statements, `UPDATE pgcoord_schedules SET `+c.set+` WHERE name = $1`)
	}
	if c.setup != "" {
		statements = append(statements, strings.Split(c.setup, "; ")...)
	}
	for _, q := range statements {
		if _, err := pool.Exec(ctx, q, name); err != nil {
			t.Fatalf("%s: %s: %v", name, q, err)
		}
	}
}

// claimMany claims the "many/" copy of every case in one call, and returns what each case
// got and how often the call went through pgcoord_schedule_claim.
func claimMany(t *testing.T, pool *pgxpool.Pool, cases []claimCase) (map[string]string, int) {
	t.Helper()
	ctx := t.Context()
	var (
		names            []string
		versions, missed []int64
		froms, ticks     []time.Time
		firsts, counts   []int32
		nexts            []*time.Time
	)
	for _, c := range cases {
		names = append(names, "many/"+c.name)
		versions = append(versions, c.version)
		froms = append(froms, c.from)
		missed = append(missed, c.missed)
		firsts = append(firsts, int32(len(ticks)+1))
		counts = append(counts, int32(len(c.ticks)))
		ticks = append(ticks, c.ticks...)
		nexts = append(nexts, c.next)
	}
	got := map[string]string{}
	calls := 0
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SET LOCAL track_functions = 'pl'"); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, `SELECT `+runColumns+` FROM pgcoord_schedule_claim_many($1, $2, $3, $4, $5, $6, $7, $8, 'runner', ARRAY['h'], '1 minute') r`,
			names, versions, froms, missed, firsts, counts, ticks, nexts)
		if err != nil {
			return err
		}
		for rows.Next() {
			job, r := scanRun(t, rows)
			got[job[len("many/"):]] += r
		}
		if err := rows.Err(); err != nil {
			return err
		}
		return tx.QueryRow(ctx, `SELECT coalesce(pg_stat_get_xact_function_calls(
			'pgcoord_schedule_claim(text, bigint, timestamptz, bigint, timestamptz[], timestamptz, text, text[], interval)'::regprocedure), 0)`).Scan(&calls)
	})
	if err != nil {
		t.Fatal(err)
	}
	return got, calls
}

// claimOne claims the "one/" copy of c alone.
func claimOne(t *testing.T, pool *pgxpool.Pool, c claimCase) []string {
	t.Helper()
	rows, err := pool.Query(t.Context(), `SELECT `+runColumns+` FROM pgcoord_schedule_claim($1, $2, $3, $4, $5, $6, 'runner', ARRAY['h'], '1 minute') r`,
		"one/"+c.name, c.version, c.from, c.missed, c.ticks, c.next)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var got []string
	for rows.Next() {
		_, r := scanRun(t, rows)
		got = append(got, r)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	slices.Sort(got)
	return got
}

// runColumns are the columns of a run that two copies of a schedule must share (not the
// token, which every grant takes anew).
const runColumns = `r.job, format('[%s %s %s attempt %s ticks %s holder %s expires %s error %s]', r.scheduled_for, r.state, r.cause,
	r.attempt, r.ticks, r.holder, r.expires_at - r.started_at, r.error)`

func scanRun(t *testing.T, rows pgx.Rows) (job, run string) {
	t.Helper()
	if err := rows.Scan(&job, &run); err != nil {
		t.Fatal(err)
	}
	return job, run
}

// ledger is the runs and next ticks of the schedules of one copy, without the copy's
// prefix and the tokens (only whether positive), with whether each next tick's due time
// is jittered as the schedule's name and jitter say.
func ledger(t *testing.T, pool *pgxpool.Pool, prefix string) []string {
	t.Helper()
	rows, err := pool.Query(context.Background(), `
		SELECT substr(r.job, length($1) + 1) || ' ' || format('%s %s %s %s %s %s', r.scheduled_for, r.state, r.cause, r.attempt,
		       r.fence_token > 0, r.error)
		  FROM pgcoord_job_runs r WHERE starts_with(r.job, $1)
		UNION ALL
		SELECT substr(s.name, length($1) + 1) || ' next ' || format('%s due %s jittered %s version %s', s.next_at, s.due_at IS NULL,
		       s.due_at = s.next_at + pgcoord_schedule_jitter(s.name, s.next_at, s.jitter) AND s.due_at > s.next_at, s.version)
		  FROM pgcoord_schedules s WHERE starts_with(s.name, $1)
		ORDER BY 1`, prefix)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return out
}
