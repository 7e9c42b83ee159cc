package pgcoord_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/pgcoord"
)

// The retention these tests collect with, and a time well past it.
const (
	gcRetention = 30 * 24 * time.Hour
	gcLater     = 31 * 24 * time.Hour
)

func mustExec(t *testing.T, db pgcoord.DBTX, sql string, args ...any) {
	t.Helper()
	if _, err := db.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

func scalar[T any](t *testing.T, db pgcoord.DBTX, sql string, args ...any) T {
	t.Helper()
	var v T
	if err := db.QueryRow(context.Background(), sql, args...).Scan(&v); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return v
}

// column returns the first column of every row, as text, sorted.
func column(t *testing.T, db pgcoord.DBTX, sql string) []string {
	t.Helper()
	rows, err := db.Query(context.Background(), sql)
	if err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	slices.Sort(got)
	return got
}

// counts returns r as a map of kind to count, after checking that r lists every kind once,
// in the documented order.
func counts(t *testing.T, r pgcoord.GCResult) map[string]int64 {
	t.Helper()
	var kinds []string
	m := map[string]int64{}
	for _, k := range r.Kinds {
		kinds = append(kinds, k.Kind)
		m[k.Kind] = k.Removed
	}
	if !reflect.DeepEqual(kinds, pgcoord.GCKinds()) {
		t.Fatalf("GC reported kinds %v, want %v", kinds, pgcoord.GCKinds())
	}
	return m
}

// frozenClock freezes pool's schema clock at the database's current time and returns it.
func frozenClock(t *testing.T, pool *pgxpool.Pool) *pgtest.Clock {
	clock := pgtest.NewClock(t, pool)
	clock.Freeze(clock.Now().Truncate(time.Second))
	return clock
}

// gcRows creates, through the SQL API, one set of rows of every kind. Rows of old are
// created by the caller at a time at least gcLater before the collection; the others just
// before it.
func gcRows(t *testing.T, pool *pgxpool.Pool, prefix string) {
	t.Helper()
	// leases: one released, one held (it expires after a minute, or is still held when
	// young).
	mustExec(t, pool, `SELECT pgcoord_lease_release(name, holder, fence_token)
		FROM pgcoord_lease_acquire($1 || 'released', 'w', '1 minute')`, prefix)
	mustExec(t, pool, `SELECT pgcoord_lease_acquire($1 || 'held', 'w', '1 minute')`, prefix)
	// fences: a register.
	mustExec(t, pool, `SELECT pgcoord_fence_check($1 || 'resource', pgcoord_next_token())`, prefix)
	// permits: a permit (expires after a minute) and a waiter behind it.
	mustExec(t, pool, `SELECT pgcoord_semaphore_acquire($1 || 'sem', 'h1', 1, '1 minute')`, prefix)
	mustExec(t, pool, `SELECT pgcoord_semaphore_acquire($1 || 'sem', 'h2', 1, '1 minute', '1 minute')`, prefix)
	// semaphores: a key whose demand came and went (collectible once old), a key set by an
	// operator and a key with demand (both kept).
	mustExec(t, pool, `SELECT pgcoord_semaphore_add_demand($1 || 'idle', 1)`, prefix)
	mustExec(t, pool, `SELECT pgcoord_semaphore_add_demand($1 || 'idle', -1)`, prefix)
	mustExec(t, pool, `SELECT pgcoord_semaphore_set_limit($1 || 'configured', 3)`, prefix)
	mustExec(t, pool, `SELECT pgcoord_semaphore_add_demand($1 || 'demand', 2)`, prefix)
	// dedupe: a claim with a retention of a day, and one kept forever.
	mustExec(t, pool, `INSERT INTO pgcoord_dedupe (scope, key, expires_at)
		VALUES ('s', $1 || 'day', pgcoord_now() + interval '1 day'), ('s', $1 || 'forever', NULL)`, prefix)
	// idempotency: a completed key with a retention of a day, and a tombstone that expires
	// with it.
	tx, err := pool.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	mustExec(t, tx, `SELECT pgcoord_idempotency_claim('s', $1 || 'key', '\x01', 'w', '1 day', '1 minute')`, prefix)
	mustExec(t, tx, `SELECT pgcoord_idempotency_complete('s', $1 || 'key', 'w', 200, NULL, NULL)`, prefix)
	if err := tx.Commit(t.Context()); err != nil {
		t.Fatal(err)
	}
	mustExec(t, pool, `INSERT INTO pgcoord_idempotency_tombstones (scope, key, fingerprint, expires_at)
		VALUES ('s', $1 || 'tombstone', '\x01', pgcoord_now() + interval '1 day')`, prefix)
	// outbox: a message delivered, one dead (both settled by one claim), one pending; and
	// an inbox record.
	mustExec(t, pool, `SELECT pgcoord_outbox_enqueue('t', $1 || k, '{}') FROM unnest(ARRAY['delivered', 'dead']) k`, prefix)
	mustExec(t, pool, `
		WITH c AS (SELECT * FROM pgcoord_outbox_claim('relay', 10, 1, 1048576, '1 minute'))
		SELECT pgcoord_outbox_settle(max(c.claim_token),
			array_agg(c.id) FILTER (WHERE c.key = $1 || 'delivered'),
			array_agg(c.id) FILTER (WHERE c.key = $1 || 'dead'), ARRAY['boom'], NULL, 1, '1 second', '1 second')
		FROM c`, prefix)
	mustExec(t, pool, `SELECT pgcoord_outbox_enqueue('t', $1 || 'pending', '{}', '{}', '1 hour')`, prefix)
	mustExec(t, pool, `INSERT INTO pgcoord_outbox_inbox (consumer, message_id) VALUES ($1 || 'consumer', 1)`, prefix)
	// singletons: a job run once (RunOnce's lock, in a transaction of its own).
	mustExec(t, pool, `SELECT pgcoord_singleton_try($1 || 'job', false)`, prefix)
	// ratelimit: a key charged once, at rest an hour later (a unit an hour, burst 2).
	mustExec(t, pool, `SELECT pgcoord_ratelimit_set('gc', 1, '1 hour', 2)`)
	mustExec(t, pool, `SELECT pgcoord_ratelimit_allow('gc', $1 || 'key')`, prefix)
	// schedule_handlers: a scheduler's registration of a handler, for a minute (inserted as
	// pgcoord_schedule_register does, which would also delete the others that ran out).
	mustExec(t, pool, `INSERT INTO pgcoord_schedule_handlers (handler, holder, until)
		VALUES ('h', $1 || 'holder', pgcoord_now() + interval '1 minute')`, prefix)
	// partition_members: a member of a group for a minute, and nobody heartbeats after it
	// (its grant of the one partition records its token in the register of 'group#0').
	mustExec(t, pool, `SELECT count(*) FROM pgcoord_partition_create($1 || 'group', 1)`, prefix)
	mustExec(t, pool, `SELECT count(*) FROM pgcoord_partition_heartbeat($1 || 'group', 'm', 1, '1 minute')`, prefix)
}

// Every kind is collected once older than the retention, and nothing younger, nothing
// configured and no job's latest run; a dry run counts exactly what the run then deletes
// and deletes nothing.
func TestGCCollectsOldRowsOfEveryKind(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pgtest.Pool(t)
	clock := frozenClock(t, pool)

	gcRows(t, pool, "old-")
	// job_runs: two finished runs of one job an hour apart, and one run of another job.
	for _, job := range []string{"report", "report", "single"} {
		mustExec(t, pool, `SELECT pgcoord_job_finish(job, scheduled_for, fence_token, NULL)
			FROM pgcoord_job_claim($1, '1 hour', NULL, 'forbid', 'w', '1 minute')`, job)
		clock.Advance(time.Hour)
	}

	clock.Advance(gcLater)
	gcRows(t, pool, "young-")
	clock.Advance(time.Second) // the young rows' minute-long grants are still live

	tables := `SELECT (SELECT count(*) FROM pgcoord_leases) + (SELECT count(*) FROM pgcoord_fences)
		+ (SELECT count(*) FROM pgcoord_semaphore_permits) + (SELECT count(*) FROM pgcoord_semaphore_waiters)
		+ (SELECT count(*) FROM pgcoord_semaphores) + (SELECT count(*) FROM pgcoord_job_runs)
		+ (SELECT count(*) FROM pgcoord_dedupe) + (SELECT count(*) FROM pgcoord_idempotency_keys)
		+ (SELECT count(*) FROM pgcoord_idempotency_tombstones) + (SELECT count(*) FROM pgcoord_outbox)
		+ (SELECT count(*) FROM pgcoord_outbox_inbox) + (SELECT count(*) FROM pgcoord_singletons)
		+ (SELECT count(*) FROM pgcoord_outbox_keys) + (SELECT count(*) FROM pgcoord_ratelimit_state)
		+ (SELECT count(*) FROM pgcoord_schedule_handlers) + (SELECT count(*) FROM pgcoord_partition_members)`
	before := scalar[int64](t, pool, tables)
	latestRuns := column(t, pool, `SELECT job || '@' || max(scheduled_for) FROM pgcoord_job_runs GROUP BY job`)
	if len(latestRuns) != 2 {
		t.Fatalf("latest runs %v, want one of each of two jobs", latestRuns)
	}

	want := map[string]int64{
		"leases": 2, "fences": 2, "permits": 2, "semaphores": 2, "job_runs": 1,
		"dedupe": 1, "idempotency": 2, "outbox": 1, "inbox": 1,
		// The order rows of every key with no pending message, old or young.
		"singletons": 1, "outbox_keys": 4,
		// The old key is at rest; the young one's hour has not passed.
		"ratelimit": 1,
		// The old registration ran out; the young one is live.
		"schedule_handlers": 1,
		// The old member's lease ran out; the young one is live.
		"partition_members": 1,
	}
	var dryProgress int
	dry, err := pgcoord.GC(ctx, pool, &pgcoord.GCOpts{OlderThan: gcRetention, DryRun: true,
		Progress: func(pgcoord.GCResult) { dryProgress++ }})
	if err != nil {
		t.Fatal(err)
	}
	if got := counts(t, dry); !reflect.DeepEqual(got, want) {
		t.Errorf("dry run counted %v, want %v", got, want)
	}
	if dryProgress != 1 {
		t.Errorf("a dry run reported progress %d times, want once", dryProgress)
	}
	if after := scalar[int64](t, pool, tables); after != before {
		t.Fatalf("a dry run changed the tables: %d rows, then %d", before, after)
	}

	res, err := pgcoord.GC(ctx, pool, &pgcoord.GCOpts{OlderThan: gcRetention})
	if err != nil {
		t.Fatal(err)
	}
	if got := counts(t, res); !reflect.DeepEqual(got, want) {
		t.Errorf("GC removed %v, want %v", got, want)
	}
	if res.Total() != 22 || res.Removed("job_runs") != 1 {
		t.Errorf("Total() = %d, Removed(job_runs) = %d; want 22 and 1", res.Total(), res.Removed("job_runs"))
	}

	// What is left: the young rows, configuration, demand and each job's latest run.
	left := map[string][]string{
		`SELECT name FROM pgcoord_leases`:                            {"young-held", "young-released"},
		`SELECT resource FROM pgcoord_fences`:                        {"young-group#0", "young-resource"},
		`SELECT key || '/' || holder FROM pgcoord_semaphore_permits`: {"young-sem/h1"},
		`SELECT key || '/' || holder FROM pgcoord_semaphore_waiters`: {"young-sem/h2"},
		`SELECT key FROM pgcoord_semaphores`: {"old-configured", "old-demand", "young-configured",
			"young-demand", "young-idle", "young-sem"},
		`SELECT job || '@' || scheduled_for FROM pgcoord_job_runs`: latestRuns,
		`SELECT key FROM pgcoord_dedupe`:                           {"old-forever", "young-day", "young-forever"},
		`SELECT key FROM pgcoord_idempotency_keys`:                 {"young-key"},
		`SELECT key FROM pgcoord_idempotency_tombstones`:           {"old-key", "young-tombstone"},
		`SELECT key FROM pgcoord_outbox`:                           {"old-dead", "old-pending", "young-dead", "young-delivered", "young-pending"},
		`SELECT consumer FROM pgcoord_outbox_inbox`:                {"young-consumer"},
		`SELECT job FROM pgcoord_singletons`:                       {"young-job"},
		`SELECT key FROM pgcoord_outbox_keys`:                      {"old-pending", "young-pending"},
		`SELECT key FROM pgcoord_ratelimit_state`:                  {"young-key"},
		`SELECT holder FROM pgcoord_schedule_handlers`:             {"young-holder"},
	}
	for sql, want := range left {
		if got := column(t, pool, sql); !reflect.DeepEqual(got, want) {
			t.Errorf("after GC, %s = %v, want %v", sql, got, want)
		}
	}
	// The old key left a tombstone that refuses a late retry.
	if state := scalar[string](t, pool, `SELECT state FROM pgcoord_idempotency_lookup('s', 'old-key')`); state != "expired" {
		t.Errorf("lookup of a collected idempotency key: state %q, want expired", state)
	}

	again, err := pgcoord.GC(ctx, pool, &pgcoord.GCOpts{OlderThan: gcRetention})
	if err != nil {
		t.Fatal(err)
	}
	if again.Total() != 0 {
		t.Errorf("a second GC removed %v, want nothing", counts(t, again))
	}
}

// The issue's test: 100,000 names collected in batches (released, or expired with a holder
// paused past its lease); a name acquired again gets a token higher than every token
// before; an old token is still refused, at a register that was collected and at a
// resource that never had one.
func TestGCNeverLetsATokenGoBack(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pgtest.Pool(t)
	clock := frozenClock(t, pool)

	const n = 100000
	// order:1 and order:2 are held; the others are taken and released.
	mustExec(t, pool, `SELECT count(*) FROM generate_series(3, $1) i,
		LATERAL pgcoord_lease_acquire('order:' || i, 'w', '1 minute') a,
		LATERAL pgcoord_lease_release(a.name, a.holder, a.fence_token) r`, n)
	old1 := scalar[int64](t, pool, `SELECT fence_token FROM pgcoord_lease_acquire('order:1', 'w', '1 minute')`)
	old2 := scalar[int64](t, pool, `SELECT fence_token FROM pgcoord_lease_acquire('order:2', 'w', '1 minute')`)
	highest := scalar[int64](t, pool, `SELECT max(fence_token) FROM pgcoord_leases`)
	if n := scalar[int64](t, pool, `SELECT count(*) FROM pgcoord_leases WHERE holder IS NULL`); n != 99998 {
		t.Fatalf("%d released leases, want 99998", n)
	}
	if !scalar[bool](t, pool, `SELECT EXISTS (SELECT FROM pgcoord_fence_check('order:2', $1))`, old2) {
		t.Fatal("the holder of order:2 could not write")
	}

	clock.Advance(gcLater)
	var rounds int
	var last int64
	res, err := pgcoord.GC(ctx, pool, &pgcoord.GCOpts{OlderThan: gcRetention, Batch: 10000,
		Progress: func(r pgcoord.GCResult) {
			rounds++
			if r.Removed("leases") < last {
				t.Errorf("progress went backwards: %d leases, then %d", last, r.Removed("leases"))
			}
			last = r.Removed("leases")
		}})
	if err != nil {
		t.Fatal(err)
	}
	if res.Removed("leases") != n || res.Removed("fences") != 1 {
		t.Fatalf("GC removed %d leases and %d registers, want %d and 1", res.Removed("leases"), res.Removed("fences"), n)
	}
	if rounds != n/10000+1 {
		t.Errorf("GC took %d rounds for %d leases in batches of 10000, want %d", rounds, n, n/10000+1)
	}
	if left := scalar[int64](t, pool, `SELECT count(*) FROM pgcoord_leases`); left != 0 {
		t.Fatalf("%d leases left", left)
	}

	// The floor's one cost: the holder of order:1, paused for longer than the retention, is
	// refused although nobody took order:1 since (its lease row was collected and it never
	// wrote, so nothing tells its grant from an older one).
	if scalar[bool](t, pool, `SELECT EXISTS (SELECT FROM pgcoord_fence_check('order:1', $1))`, old1) {
		t.Errorf("fence check of order:1 with its collected grant's token %d, below the retired floor, accepted it", old1)
	}
	// A new grant of a collected name (whose register was collected too) is higher than every
	// token before, and the old holder is refused.
	again := scalar[int64](t, pool, `SELECT fence_token FROM pgcoord_lease_acquire('order:2', 'v', '1 minute')`)
	if again <= highest {
		t.Fatalf("order:2 acquired again with token %d, not above the highest before GC (%d)", again, highest)
	}
	if !scalar[bool](t, pool, `SELECT EXISTS (SELECT FROM pgcoord_fence_check('order:2', $1))`, again) {
		t.Fatal("the new holder of order:2 could not write")
	}
	if scalar[bool](t, pool, `SELECT EXISTS (SELECT FROM pgcoord_fence_check('order:2', $1))`, old2) {
		t.Fatal("the old holder of order:2 wrote after the new holder")
	}
}

// A schedule's pending runs (a backfilled tick here) have not finished: GC keeps them
// however old, as it keeps each job's latest run, and collects its other old runs.
func TestGCKeepsPendingRuns(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pgtest.Pool(t)
	clock := frozenClock(t, pool)
	mustExec(t, pool, `SELECT pgcoord_schedule_create('s', '@yearly', 'UTC', 'h')`)
	// Two triggered runs an hour apart, each run and finished.
	for range 2 {
		mustExec(t, pool, `SELECT pgcoord_schedule_trigger('s')`)
		mustExec(t, pool, `SELECT pgcoord_job_finish(job, scheduled_for, fence_token, NULL)
			FROM pgcoord_schedule_start('s', 'w', ARRAY['h'], '1 minute')`)
		clock.Advance(time.Hour)
	}
	// A tick of the day before, backfilled: pending until a scheduler starts it.
	mustExec(t, pool, `SELECT pgcoord_schedule_backfill('s', ARRAY[pgcoord_now() - interval '1 day'])`)
	clock.Advance(gcLater)
	res, err := pgcoord.GC(ctx, pool, &pgcoord.GCOpts{OlderThan: gcRetention})
	if err != nil {
		t.Fatal(err)
	}
	left := column(t, pool, `SELECT state || ' ' || cause FROM pgcoord_job_runs WHERE job = 's'`)
	if res.Removed("job_runs") != 1 || !reflect.DeepEqual(left, []string{"pending backfill", "succeeded trigger"}) {
		t.Errorf("GC removed %d job runs, left %v; want the older finished run removed, the pending and the latest kept",
			res.Removed("job_runs"), left)
	}
}

// GC calls the function until every kind has fewer rows than a batch left, and sums.
func TestGCBatches(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	for _, tc := range []struct {
		leases, dedupe, batch int
		rounds                int
	}{
		{leases: 10, dedupe: 7, batch: 3, rounds: 4}, // 3+3, 3+3, 3+1, 1+0
		{leases: 9, dedupe: 0, batch: 3, rounds: 4},  // a last round finds nothing
		{leases: 2, dedupe: 5, batch: 100, rounds: 1},
	} {
		pool := pgtest.Pool(t)
		clock := frozenClock(t, pool)
		mustExec(t, pool, `SELECT count(*) FROM generate_series(1, $1) i, LATERAL pgcoord_lease_acquire('l' || i, 'w', '1 minute')`, tc.leases)
		mustExec(t, pool, `INSERT INTO pgcoord_dedupe (scope, key, expires_at)
			SELECT 's', 'k' || i, pgcoord_now() FROM generate_series(1, $1) i`, tc.dedupe)
		clock.Advance(gcLater)
		var progress []int64
		res, err := pgcoord.GC(ctx, pool, &pgcoord.GCOpts{Batch: tc.batch,
			Progress: func(r pgcoord.GCResult) { progress = append(progress, r.Total()) }})
		if err != nil {
			t.Fatal(err)
		}
		if res.Removed("leases") != int64(tc.leases) || res.Removed("dedupe") != int64(tc.dedupe) || res.Total() != int64(tc.leases+tc.dedupe) {
			t.Errorf("%+v: GC removed %v", tc, counts(t, res))
		}
		if len(progress) != tc.rounds || progress[len(progress)-1] != res.Total() {
			t.Errorf("%+v: progress totals %v, want %d rounds ending at %d", tc, progress, tc.rounds, res.Total())
		}
	}
}

// With no options GC keeps 30 days: a lease released 29 days ago stays, one released 31
// days ago goes.
func TestGCDefaultRetention(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pgtest.Pool(t)
	clock := frozenClock(t, pool)
	mustExec(t, pool, `SELECT pgcoord_lease_release(name, holder, fence_token) FROM pgcoord_lease_acquire('old', 'w', '1 minute')`)
	clock.Advance(2 * 24 * time.Hour)
	mustExec(t, pool, `SELECT pgcoord_lease_release(name, holder, fence_token) FROM pgcoord_lease_acquire('young', 'w', '1 minute')`)
	clock.Advance(29 * 24 * time.Hour)
	res, err := pgcoord.GC(ctx, pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := column(t, pool, `SELECT name FROM pgcoord_leases`); res.Total() != 1 || !reflect.DeepEqual(got, []string{"young"}) {
		t.Fatalf("GC with defaults removed %v; leases left %v, want [young]", counts(t, res), got)
	}
}

// Bad options are refused before any SQL runs (the pool reaches no server), and a
// cancelled context stops GC before its first batch.
func TestGCRefusesBadOptions(t *testing.T) {
	t.Parallel()
	nowhere, err := pgxpool.New(context.Background(), "postgres://nobody@127.0.0.1:1/none?connect_timeout=1")
	if err != nil {
		t.Fatal(err)
	}
	defer nowhere.Close()
	for _, opts := range []pgcoord.GCOpts{
		{OlderThan: -time.Hour},
		{OlderThan: 500 * time.Millisecond},
		{OlderThan: pgcoord.MaxGCRetention + time.Hour},
		{Batch: -1},
		{Batch: pgcoord.MaxGCBatch + 1},
	} {
		if _, err := pgcoord.GC(t.Context(), nowhere, &opts); !errors.Is(err, pgcoord.ErrInvalidArgument) {
			t.Errorf("GC(%+v) = %v, want ErrInvalidArgument", opts, err)
		}
	}
	if _, err := pgcoord.GC(t.Context(), (*pgxpool.Pool)(nil), nil); !errors.Is(err, pgcoord.ErrInvalidArgument) {
		t.Errorf("GC(nil pool) = %v, want ErrInvalidArgument", err)
	}

	pool := pgtest.Pool(t)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := pgcoord.GC(ctx, pool, nil); !errors.Is(err, context.Canceled) {
		t.Errorf("GC with a cancelled context = %v, want context.Canceled", err)
	}
}

// Collect, as a daily cron job would, what pgcoord no longer needs; a dry run first counts
// it. On a fresh schema there is nothing to collect.
func ExampleGC() {
	ctx := context.Background()
	pool := pgtest.ExamplePool()

	would, err := pgcoord.GC(ctx, pool, &pgcoord.GCOpts{DryRun: true})
	if err != nil {
		panic(err)
	}
	fmt.Println("would delete:", would.Total())

	res, err := pgcoord.GC(ctx, pool, nil) // 30 days of retention, batches of 10,000
	if err != nil {
		panic(err)
	}
	for _, k := range res.Kinds {
		if k.Removed > 0 {
			fmt.Printf("%s: %d\n", k.Kind, k.Removed)
		}
	}
	fmt.Println("deleted:", res.Total())
	// Output:
	// would delete: 0
	// deleted: 0
}
