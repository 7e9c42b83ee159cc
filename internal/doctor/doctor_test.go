package doctor_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgcoord/pgcoord/idempotency"
	"github.com/pgcoord/pgcoord/internal/doctor"
	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/leases"
	"github.com/pgcoord/pgcoord/outbox"
	"github.com/pgcoord/pgcoord/pgcoord"
	"github.com/pgcoord/pgcoord/semaphore"
	"github.com/pgcoord/pgcoord/singleton"
)

// findings runs the doctor and returns its findings by check.
func findings(t *testing.T, ctx context.Context, run func() ([]doctor.Finding, error)) map[string]doctor.Finding {
	t.Helper()
	fs, err := run()
	if err != nil {
		t.Fatal(err)
	}
	byCheck := map[string]doctor.Finding{}
	for _, f := range fs {
		if _, dup := byCheck[f.Check]; dup {
			t.Errorf("check %s reported twice", f.Check)
		}
		byCheck[f.Check] = f
	}
	return byCheck
}

func TestHealthySchema(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t)
	fs, err := doctor.Run(ctx, pool, doctor.Options{})
	if err != nil {
		t.Fatal(err)
	}
	// Behind a transaction-mode pooler notify needs attention (pooler_test.go); the rest is healthy.
	pooler := pgtest.BehindPooler()
	var checks []string
	for _, f := range fs {
		checks = append(checks, f.Check)
		if f.Status == doctor.Attention && !(pooler && f.Check == "notify") {
			t.Errorf("%s needs attention in a fresh schema: %s", f.Check, f.Summary)
		}
	}
	if got, want := strings.Join(checks, ","), "schema,notify,clock,time,transactions,replication,leases,semaphores,jobs,schedules,partitions,idempotency,outbox,retention,audit,advisory"; got != want {
		t.Errorf("checks %s, want %s", got, want)
	}
	if doctor.NeedsAttention(fs) != pooler {
		t.Errorf("NeedsAttention is %v for a healthy schema, behind a pooler %v", !pooler, pooler)
	}
	if f := fs[1]; !pooler && (f.Status != doctor.OK || !strings.Contains(f.Summary, "round trip")) {
		t.Errorf("notify on a direct connection: %+v", f)
	}
}

func TestSchemaNotInstalledOrBehind(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := pgtest.Schema(t) // empty
	for _, name := range []string{"not installed", "behind"} {
		if name == "behind" {
			pgtest.Migrate(t, pool, &pgcoord.MigrateOpts{To: 1})
		}
		byCheck := findings(t, ctx, func() ([]doctor.Finding, error) { return doctor.Run(ctx, pool, doctor.Options{}) })
		s := byCheck["schema"]
		if s.Status != doctor.Attention || s.Explain == "" {
			t.Errorf("%s: schema finding %+v, want attention with an explanation", name, s)
		}
		if name == "behind" && !strings.Contains(s.Summary, "pending") {
			t.Errorf("behind: %q does not say migrations are pending", s.Summary)
		}
		for _, c := range []string{"time", "leases", "semaphores", "jobs", "schedules", "idempotency", "outbox", "retention"} {
			if f, ok := byCheck[c]; ok {
				t.Errorf("%s: check %s ran against a schema that is not current: %+v", name, c, f)
			}
		}
		if _, ok := byCheck["notify"]; !ok {
			t.Errorf("%s: the database checks must run without pgcoord's schema", name)
		}
	}
}

func TestLongTransaction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t)
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	var pid int32
	if err := tx.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		t.Fatal(err)
	}
	// The transaction's start must be older than the threshold by the database clock.
	if _, err := pool.Exec(ctx, "SELECT pg_sleep(0.02)"); err != nil {
		t.Fatal(err)
	}
	byCheck := findings(t, ctx, func() ([]doctor.Finding, error) {
		return doctor.Run(ctx, pool, doctor.Options{LongTransaction: 10 * time.Millisecond})
	})
	f := byCheck["transactions"]
	// The finding names the five oldest transactions of the whole server: other tests'
	// may crowd this one out, and then it says how many more there are.
	named := strings.Contains(f.Summary, fmt.Sprintf("pid %d ", pid))
	crowded := strings.Contains(f.Summary, " more")
	if f.Status != doctor.Attention || !(named || crowded) || f.Explain == "" {
		t.Errorf("an open transaction (pid %d) older than the threshold: %+v", pid, f)
	}
}

func TestLeakedPermitAndOverdueJob(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t)
	clock := pgtest.NewClock(t, pool)
	clock.Run(-time.Hour)
	// A permit granted an hour ago for a second, never released: a leaked slot.
	if _, err := semaphore.TryAcquire(ctx, pool, "tenant-leaky", 2, time.Second, nil); err != nil {
		t.Fatal(err)
	}
	// A job whose only tick was claimed an hour ago and never finished: overdue.
	job := singleton.Job{Name: "hourly-export", Every: time.Minute, TTL: time.Second}
	if _, err := singleton.ClaimTick(ctx, pool, job, nil); err != nil {
		t.Fatal(err)
	}
	clock.Run(0)
	if _, err := semaphore.TryAcquire(ctx, pool, "tenant-fine", 2, time.Hour, nil); err != nil {
		t.Fatal(err)
	}
	fs, err := doctor.Run(ctx, pool, doctor.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if !doctor.NeedsAttention(fs) {
		t.Error("NeedsAttention is false")
	}
	byCheck := findings(t, ctx, func() ([]doctor.Finding, error) { return fs, nil })
	if f := byCheck["semaphores"]; f.Status != doctor.Attention || !strings.Contains(f.Summary, "tenant-leaky (1 leaked") ||
		strings.Contains(f.Summary, "tenant-fine") || !strings.Contains(f.Summary, "1 of 2") {
		t.Errorf("semaphores: %+v", f)
	}
	if f := byCheck["jobs"]; f.Status != doctor.Attention || !strings.Contains(f.Summary, "hourly-export") {
		t.Errorf("jobs: %+v", f)
	}
}

// A lease renewed with less than a quarter of its grant left in the last hour calls for
// attention, naming it; one whose near miss is older does not.
func TestLeaseNearMiss(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t)
	byCheck := findings(t, ctx, func() ([]doctor.Finding, error) { return doctor.Run(ctx, pool, doctor.Options{}) })
	if f := byCheck["leases"]; f.Status != doctor.OK {
		t.Fatalf("no lease: %+v", f)
	}
	clock := pgtest.NewClock(t, pool)
	for name, ago := range map[string]time.Duration{"close-call": 2 * time.Minute, "long-ago": 2 * time.Hour} {
		clock.Freeze(time.Now().Add(-ago - 55*time.Second))
		l, err := leases.TryAcquire(ctx, pool, name, time.Minute, nil)
		if err != nil {
			t.Fatal(err)
		}
		// Renewed with 5s of its 60s left.
		clock.Advance(55 * time.Second)
		if _, err := leases.Renew(ctx, pool, l, time.Minute, nil); err != nil {
			t.Fatal(err)
		}
	}
	clock.Run(0)
	byCheck = findings(t, ctx, func() ([]doctor.Finding, error) { return doctor.Run(ctx, pool, doctor.Options{}) })
	f := byCheck["leases"]
	if f.Status != doctor.Attention || !strings.Contains(f.Summary, "close-call (latest 2m") ||
		strings.Contains(f.Summary, "long-ago") || f.Explain == "" {
		t.Errorf("leases with near misses 2m and 2h ago: %+v", f)
	}
}

// An idempotency attempt that recorded a recovery point and then died (its connection
// terminated) leaves a key in flight that nobody holds: stuck until a client retries.
func TestStuckIdempotencyKey(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t)
	fp := idempotency.Fingerprint("POST", "/charges", []byte("{}"), nil)
	for _, key := range []string{"alive", "dead"} {
		a, err := idempotency.Begin(ctx, pool, "payments", key, fp, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer a.Close(ctx)
		if err := a.Checkpoint(ctx, "charged", nil); err != nil {
			t.Fatal(err)
		}
	}
	// The dead attempt: left as a dead process leaves its key, its lease lapsed.
	if _, err := pool.Exec(ctx, `UPDATE pgcoord_idempotency_keys SET holder = 'dead-process', lease_expires_at = pgcoord_now() - interval '1 second'
		WHERE scope = 'payments' AND key = 'dead'`); err != nil {
		t.Fatal(err)
	}
	byCheck := findings(t, ctx, func() ([]doctor.Finding, error) { return doctor.Run(ctx, pool, doctor.Options{}) })
	f := byCheck["idempotency"]
	if f.Status != doctor.Attention || !strings.Contains(f.Summary, "payments/dead") || strings.Contains(f.Summary, "alive") ||
		!strings.Contains(f.Summary, `"charged"`) {
		t.Errorf("idempotency: %+v", f)
	}
}

// A message whose relay gave up on it is dead; a topic whose oldest pending message is older
// than the lag has no relay keeping up.
func TestOutboxDeadAndLagging(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t)
	enqueue := func(topic, key string) {
		t.Helper()
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := outbox.Enqueue(ctx, tx, outbox.Message{Topic: topic, Key: key, Payload: []byte("x")})
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	enqueue("fresh", "k1")
	byCheck := findings(t, ctx, func() ([]doctor.Finding, error) { return doctor.Run(ctx, pool, doctor.Options{}) })
	if f := byCheck["outbox"]; f.Status != doctor.OK || !strings.Contains(f.Summary, "1 pending") {
		t.Errorf("a fresh pending message: %+v", f)
	}

	enqueue("orders", "k2")
	relay, err := outbox.NewRelay(pool, &outbox.Config{Topics: []string{"orders"}, MaxAttempts: 1,
		Handler: outbox.HandlerFunc(func(context.Context, outbox.Message) error { return errors.New("broker down") })})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := relay.RunBatch(ctx); err != nil {
		t.Fatal(err)
	}
	// "fresh" was written a few statements ago: older than a lag of a microsecond.
	byCheck = findings(t, ctx, func() ([]doctor.Finding, error) {
		return doctor.Run(ctx, pool, doctor.Options{OutboxLag: time.Microsecond})
	})
	f := byCheck["outbox"]
	if f.Status != doctor.Attention || !strings.Contains(f.Summary, "orders (1 dead)") ||
		!strings.Contains(f.Summary, "fresh (oldest pending") || f.Explain == "" {
		t.Errorf("a dead message and a lagging topic: %+v", f)
	}
}

// A schema whose pgcoord_now() or pgcoord_clock() is not the database's own clock (a test
// harness moved it) needs attention: "time is not the database's".
func TestTimeNotTheDatabases(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t)
	clock := pgtest.NewClock(t, pool)
	check := func() doctor.Finding {
		t.Helper()
		return findings(t, ctx, func() ([]doctor.Finding, error) { return doctor.Run(ctx, pool, doctor.Options{}) })["time"]
	}
	if f := check(); f.Status != doctor.OK {
		t.Fatalf("a fresh schema: %+v", f)
	}
	for name, move := range map[string]func(){
		"moved":  func() { clock.Run(time.Hour) },
		"frozen": func() { clock.Freeze(time.Now()) },
	} {
		move()
		f := check()
		if f.Status != doctor.Attention || !strings.Contains(f.Summary, "time is not the database's") ||
			!strings.Contains(f.Summary, "pgcoord_now()") || !strings.Contains(f.Summary, "pgcoord_clock()") || f.Explain == "" {
			t.Errorf("%s clock: %+v", name, f)
		}
	}
	// Only one of the two replaced.
	clock.Run(0)
	if _, err := pool.Exec(ctx, `CREATE OR REPLACE FUNCTION pgcoord_clock() RETURNS timestamptz LANGUAGE sql VOLATILE
		AS $$ SELECT clock_timestamp() - interval '1 day' $$`); err != nil {
		t.Fatal(err)
	}
	if f := check(); f.Status != doctor.Attention || strings.Contains(f.Summary, "pgcoord_now()") || !strings.Contains(f.Summary, "pgcoord_clock()") {
		t.Errorf("pgcoord_clock() replaced: %+v", f)
	}
	clock.Run(0)
	if f := check(); f.Status != doctor.OK {
		t.Errorf("the clock put back: %+v", f)
	}
}

// The retention check counts what pgcoord gc would collect, and suggests it when a kind has
// many rows.
func TestRetention(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t)
	clock := pgtest.NewClock(t, pool)
	clock.Run(-40 * 24 * time.Hour)
	if _, err := pool.Exec(ctx, `SELECT count(*) FROM generate_series(1, 10000) i,
		LATERAL pgcoord_lease_acquire('order:' || i, 'w', '1 minute')`); err != nil {
		t.Fatal(err)
	}
	clock.Run(0)
	f := findings(t, ctx, func() ([]doctor.Finding, error) { return doctor.Run(ctx, pool, doctor.Options{}) })["retention"]
	if f.Status != doctor.Info || !strings.Contains(f.Summary, "leases 10000") || !strings.Contains(f.Explain, "pgcoord gc") {
		t.Errorf("10000 leases expired 40 days ago: %+v", f)
	}
	if _, err := pgcoord.GC(ctx, pool, nil); err != nil {
		t.Fatal(err)
	}
	f = findings(t, ctx, func() ([]doctor.Finding, error) { return doctor.Run(ctx, pool, doctor.Options{}) })["retention"]
	if f.Status != doctor.OK || !strings.Contains(f.Summary, "0 row(s)") {
		t.Errorf("after gc: %+v", f)
	}
}

// The audit check flags a weak grant — a role other than the owner allowed to UPDATE,
// DELETE or TRUNCATE the audit log, as docs/security.md's grants once gave the application
// role — and a disabled or missing append-only trigger, and is OK once they are undone.
func TestAuditFlagsWeakGrants(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t)
	role := "app_" + strings.TrimPrefix(pgtest.SchemaName(t), "t_")
	exec := func(sql string) {
		t.Helper()
		if _, err := pool.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	exec(`CREATE ROLE ` + role + ` LOGIN`)
	t.Cleanup(func() {
		for _, sql := range []string{`DROP OWNED BY ` + role, `DROP ROLE ` + role} {
			if _, err := pool.Exec(context.Background(), sql); err != nil {
				t.Errorf("cleanup: %s: %v", sql, err)
			}
		}
	})
	audit := func() doctor.Finding {
		t.Helper()
		return findings(t, ctx, func() ([]doctor.Finding, error) { return doctor.Run(ctx, pool, doctor.Options{}) })["audit"]
	}
	if f := audit(); f.Status != doctor.OK || !strings.Contains(f.Summary, "append-only") {
		t.Fatalf("audit in a fresh schema: %+v, want OK", f)
	}

	exec(`GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA ` + pgtestSchema(t, pool) + ` TO ` + role)
	f := audit()
	if f.Status != doctor.Attention || !strings.Contains(f.Summary, role+" (DELETE, UPDATE)") ||
		!strings.Contains(f.Explain, "REVOKE UPDATE, DELETE, TRUNCATE, TRIGGER ON pgcoord_audit FROM "+role) {
		t.Errorf("audit with DELETE and UPDATE granted to %s: %+v, want attention naming the role and the REVOKE", role, f)
	}
	exec(`REVOKE UPDATE, DELETE ON pgcoord_audit FROM ` + role)
	exec(`GRANT TRUNCATE ON pgcoord_audit TO PUBLIC`)
	exec(`GRANT UPDATE (actor) ON pgcoord_audit TO ` + role)
	if f := audit(); f.Status != doctor.Attention || !strings.Contains(f.Summary, "PUBLIC (TRUNCATE)") ||
		!strings.Contains(f.Summary, role+" (UPDATE (actor))") {
		t.Errorf("audit with TRUNCATE to PUBLIC and UPDATE (actor) to %s: %+v, want attention naming both", role, f)
	}
	exec(`REVOKE TRUNCATE ON pgcoord_audit FROM PUBLIC`)
	exec(`REVOKE UPDATE (actor) ON pgcoord_audit FROM ` + role)
	if f := audit(); f.Status != doctor.OK {
		t.Errorf("audit with the grants revoked (SELECT and INSERT left): %+v, want OK", f)
	}

	exec(`ALTER TABLE pgcoord_audit DISABLE TRIGGER pgcoord_audit_append_only`)
	if f := audit(); f.Status != doctor.Attention || !strings.Contains(f.Summary, "pgcoord_audit_append_only is disabled") {
		t.Errorf("audit with the trigger disabled: %+v, want attention", f)
	}
	exec(`ALTER TABLE pgcoord_audit ENABLE TRIGGER pgcoord_audit_append_only`)
	exec(`DROP TRIGGER pgcoord_audit_stamp ON pgcoord_audit`)
	if f := audit(); f.Status != doctor.Attention || !strings.Contains(f.Summary, "pgcoord_audit_stamp is missing") {
		t.Errorf("audit with the stamp trigger dropped: %+v, want attention", f)
	}
}

// pgtestSchema is the schema pool's connections resolve to, quoted.
func pgtestSchema(t *testing.T, pool interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}) string {
	t.Helper()
	var s string
	if err := pool.QueryRow(context.Background(), `SELECT quote_ident(current_schema())`).Scan(&s); err != nil {
		t.Fatal(err)
	}
	return s
}

// A login without pgcoord's grants that holds advisory locks is reported, by role and pid,
// as information; pgcoord's own role holding one is not.
func TestAdvisoryLocksOfStrangers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t)
	stranger, err := pgx.Connect(ctx, pgtest.Stranger(t, pool))
	if err != nil {
		t.Fatal(err)
	}
	defer stranger.Close(ctx)
	var pid int32
	var role string
	if err := stranger.QueryRow(ctx, `SELECT pg_backend_pid(), current_user, pg_advisory_lock(42)`).Scan(&pid, &role, nil); err != nil {
		t.Fatal(err)
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	var own int32
	if err := conn.QueryRow(ctx, `SELECT pg_backend_pid(), pg_advisory_lock(43)`).Scan(&own, nil); err != nil {
		t.Fatal(err)
	}
	defer func() { _, _ = conn.Exec(ctx, `SELECT pg_advisory_unlock_all()`) }()
	f := findings(t, ctx, func() ([]doctor.Finding, error) { return doctor.Run(ctx, pool, doctor.Options{}) })["advisory"]
	if f.Status != doctor.Info || !strings.Contains(f.Summary, fmt.Sprintf("role %s (pid %d)", role, pid)) {
		t.Fatalf("advisory finding %+v, want Info naming role %s and pid %d", f, role, pid)
	}
	if strings.Contains(f.Summary, fmt.Sprintf("pid %d)", own)) || strings.Contains(f.Summary, fmt.Sprintf(" %d,", own)) {
		t.Errorf("advisory finding %+v names pgcoord's own session %d", f, own)
	}
}
