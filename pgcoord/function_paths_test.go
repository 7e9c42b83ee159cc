package pgcoord_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/fenced"
	"github.com/pgcoord/pgcoord/internal/listen"
	"github.com/pgcoord/pgcoord/internal/pgconfig"
	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/pgcoord"
)

// TestFunctionSearchPaths: after Migrate, every trigger function and every SECURITY
// DEFINER function of pgcoord's schema pins its search_path to the schema followed by
// pg_temp (last, so no temporary table or function of the caller's is found before
// pgcoord's), and any other function that pins a search_path ends it with pg_temp too.
// Plain functions are left unpinned (a SQL function with SET is never inlined). The test
// enumerates the catalog, so functions added by later migrations are checked as well.
func TestFunctionSearchPaths(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t)
	var want string // as ALTER FUNCTION ... SET search_path = %I, pg_temp stores it
	if err := pool.QueryRow(ctx, `SELECT format('%I, pg_temp', current_schema())`).Scan(&want); err != nil {
		t.Fatal(err)
	}
	rows, err := pool.Query(ctx, `
		SELECT p.oid::regprocedure::text, p.prorettype = 'trigger'::regtype, p.prosecdef,
		       (SELECT substr(c, length('search_path=') + 1) FROM unnest(p.proconfig) c WHERE c LIKE 'search\_path=%')
		  FROM pg_proc p
		 WHERE p.pronamespace = current_schema()::regnamespace AND p.proname LIKE 'pgcoord\_%'
		 ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	type fn struct {
		Name          string
		Trigger, SDef bool
		Path          *string
	}
	fns, err := pgx.CollectRows(rows, pgx.RowToStructByPos[fn])
	if err != nil {
		t.Fatal(err)
	}
	triggers := 0
	for _, f := range fns {
		if f.Trigger {
			triggers++
		}
		switch {
		case (f.Trigger || f.SDef) && (f.Path == nil || *f.Path != want):
			t.Errorf("%s (trigger %v, security definer %v): search_path %s, want %q", f.Name, f.Trigger, f.SDef, show(f.Path), want)
		case f.Path != nil && !strings.HasSuffix(*f.Path, "pg_temp"):
			t.Errorf("%s: search_path %q does not end with pg_temp", f.Name, *f.Path)
		}
	}
	if triggers < 3 || len(fns) < 50 {
		t.Fatalf("found %d functions, %d of them triggers: the query missed pgcoord's functions?", len(fns), triggers)
	}
}

func show(p *string) string {
	if p == nil {
		return "not set"
	}
	return `"` + *p + `"`
}

// TestFenceGuardIgnoresTheWritersTempTables is the attack on the fence guard by a writer
// of a guarded table (which needs no privilege on pgcoord's tables): it creates temporary
// tables named like pgcoord's registers, which a search_path without pg_temp at its end
// searches first, so the guard would judge a stale token against the writer's empty
// registers and let it through. With pg_temp last, the guard reads pgcoord's own.
func TestFenceGuardIgnoresTheWritersTempTables(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Direct(t, pgtest.Pool(t)) // temporary tables need a session
	if _, err := pool.Exec(ctx, `CREATE TABLE ledger (id int PRIMARY KEY, account text, fence_token bigint)`); err != nil {
		t.Fatal(err)
	}
	if err := fenced.InstallGuard(ctx, pool, "ledger", "fence_token", &fenced.GuardOpts{ResourceColumn: "account"}); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO ledger VALUES (1, 'acct', 100)`); err != nil {
		t.Fatal(err)
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Hijack().Close(ctx) }() // its temporary tables go with it
	for _, sql := range []string{
		`CREATE TEMP TABLE pgcoord_leases (name text, fence_token bigint)`,
		`CREATE TEMP TABLE pgcoord_fences (resource text PRIMARY KEY, fence_token bigint NOT NULL, updated_at timestamptz NOT NULL)`,
		`CREATE TEMP TABLE pgcoord_fence_floor (one boolean PRIMARY KEY DEFAULT true, fence_token bigint NOT NULL)`,
		`INSERT INTO pg_temp.pgcoord_fence_floor (fence_token) VALUES (0)`,
	} {
		if _, err := conn.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	_, err = conn.Exec(ctx, `INSERT INTO ledger VALUES (2, 'acct', 5)`)
	if pe := (*pgconn.PgError)(nil); !errors.As(err, &pe) || pe.Code != "PGC01" {
		t.Fatalf("a stale token (5 after 100) written beside temporary copies of pgcoord's registers: err = %v, want SQLSTATE PGC01", err)
	}
}

// notifyCall is one pg_notify call and what follows it on its line.
var notifyCall = regexp.MustCompile(`pg_notify\([^\n]*`)

// safePayload is what a pgcoord notification may carry: nothing, or a name's tag.
var safePayload = regexp.MustCompile(`^pg_notify\(pgcoord_channel\('[a-z_]+'\), (''|pgcoord_wake_tag\([@a-z_:]+\))\)`)

// TestNotificationsCarryNoName: any login may LISTEN on pgcoord's channels, so no
// notification carries a lease name or semaphore key. Every pg_notify in the schema's
// functions (as installed, after every migration) and in the queries the Go library sends
// carries nothing or a tag; and a stranger's session LISTENing on the lease and semaphore
// channels receives the tags of the names, never the names.
func TestNotificationsCarryNoName(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t)
	rows, err := pool.Query(ctx, `
		SELECT p.oid::regprocedure::text, pg_get_functiondef(p.oid)
		  FROM pg_proc p
		 WHERE p.pronamespace = current_schema()::regnamespace AND p.proname LIKE 'pgcoord\_%' AND p.prokind = 'f'`)
	if err != nil {
		t.Fatal(err)
	}
	sources := map[string]string{}
	for rows.Next() {
		var name, def string
		if err := rows.Scan(&name, &def); err != nil {
			t.Fatal(err)
		}
		sources["function "+name] = def
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	queries, err := filepath.Glob("../sql/queries/*.sql")
	if err != nil || len(queries) == 0 {
		t.Fatalf("no query files (%v)", err)
	}
	for _, q := range queries {
		b, err := os.ReadFile(q)
		if err != nil {
			t.Fatal(err)
		}
		sources[q] = string(b)
	}
	calls := 0
	for where, src := range sources {
		for _, call := range notifyCall.FindAllString(src, -1) {
			calls++
			if !safePayload.MatchString(call) {
				t.Errorf("%s: %s: the payload is neither '' nor pgcoord_wake_tag(...)", where, call)
			}
		}
	}
	if calls < 7 {
		t.Fatalf("found %d pg_notify calls: the search missed pgcoord's notifications?", calls)
	}

	// A stranger LISTENs.
	direct := pgtest.Direct(t, pool)
	if listen.Pooled(direct) {
		return
	}
	conn, err := direct.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Hijack().Close(ctx) }()
	var leasesCh, semCh string
	if err := conn.QueryRow(ctx, `SELECT pgcoord_channel('leases'), pgcoord_channel('semaphores')`).Scan(&leasesCh, &semCh); err != nil {
		t.Fatal(err)
	}
	for _, ch := range []string{leasesCh, semCh} {
		if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{ch}.Sanitize()); err != nil {
			t.Fatal(err)
		}
	}
	for _, sql := range []string{
		`SELECT pgcoord_lease_acquire('payroll-2026', 'a', '1 minute')`,
		`SELECT pgcoord_lease_wait('payroll-2026', 'b', '1 minute', '1 minute')`,
		`SELECT pgcoord_lease_expire('payroll-2026', NULL)`,
		`SELECT pgcoord_semaphore_set_limit('export-ácme', 2)`,
	} {
		if _, err := pool.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	got := map[string]string{}
	for len(got) < 2 {
		wctx, cancel := context.WithTimeout(ctx, pgtest.WaitLimit)
		n, err := conn.Conn().WaitForNotification(wctx)
		cancel()
		if err != nil {
			t.Fatalf("notifications received %v, want one on each channel: %v", got, err)
		}
		got[n.Channel] = n.Payload
	}
	if got[leasesCh] != listen.Tag("payroll-2026") || got[semCh] != listen.Tag("export-ácme") {
		t.Errorf("a stranger LISTENing received %q; want the tags of payroll-2026 and export-ácme, never the names", got)
	}
}

// TestRollbackRestoresFunctions: rolling back the newest migration leaves every function
// of the schema exactly as the migration before left it (text, settings), so a Down that
// rewrites functions, as 00012's does, undoes what its Up did and nothing else.
func TestRollbackRestoresFunctions(t *testing.T) {
	needsSession(t)
	t.Parallel()
	ctx := context.Background()
	ms := pgcoord.Migrations()
	prev := ms[len(ms)-2].Version
	before, _ := pgtest.Schema(t)
	if _, err := pgcoord.Migrate(ctx, before, &pgcoord.MigrateOpts{To: prev}); err != nil {
		t.Fatal(err)
	}
	after := pgtest.Pool(t)
	if _, err := pgcoord.Rollback(ctx, after, &pgcoord.RollbackOpts{To: prev}); err != nil {
		t.Fatal(err)
	}
	want, got := functionDefs(t, before), functionDefs(t, after)
	for name, def := range want {
		if got[name] != def {
			t.Errorf("%s after rolling back to %d:\n%s\nwant, as migrating to %d left it:\n%s", name, prev, got[name], prev, def)
		}
	}
	for name := range got {
		if _, ok := want[name]; !ok {
			t.Errorf("%s is left after rolling back to %d", name, prev)
		}
	}
	if len(want) < 50 {
		t.Fatalf("%d functions: the query missed pgcoord's?", len(want))
	}
}

// functionDefs returns the definitions of the pgcoord functions pool's schema holds,
// with the schema's name replaced by SCHEMA.
func functionDefs(t *testing.T, pool *pgxpool.Pool) map[string]string {
	t.Helper()
	rows, err := pool.Query(context.Background(), `
		SELECT p.oid::regprocedure::text,
		       replace(replace(pg_get_functiondef(p.oid), quote_ident(current_schema()), 'SCHEMA'), current_schema(), 'SCHEMA')
		  FROM pg_proc p
		 WHERE p.pronamespace = current_schema()::regnamespace AND p.proname LIKE 'pgcoord\_%'`)
	if err != nil {
		t.Fatal(err)
	}
	defs := map[string]string{}
	for rows.Next() {
		var name, def string
		if err := rows.Scan(&name, &def); err != nil {
			t.Fatal(err)
		}
		defs[name] = def
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return defs
}

// TestOutboxBucketIsInlined: pgcoord_outbox_bucket computes the generated bucket column of
// every outbox message, so it must stay inlinable (no SET clause: migration 00025). The
// planner then puts its body into the caller's query, resolved on the caller's
// search_path; so its body names everything by schema, and a function of the caller's
// named like pgcoord_lock_key, first on the search_path, changes no bucket.
func TestOutboxBucketIsInlined(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t)
	rows, err := pool.Query(ctx, `EXPLAIN (VERBOSE, COSTS OFF) SELECT pgcoord_outbox_bucket(topic, key) FROM pgcoord_outbox`)
	if err != nil {
		t.Fatal(err)
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	plan := strings.Join(lines, "\n")
	if strings.Contains(plan, "pgcoord_outbox_bucket(") || !strings.Contains(plan, "hashtextextended") {
		t.Errorf("pgcoord_outbox_bucket is not inlined; the plan:\n%s", plan)
	}

	var schema string
	if err := pool.QueryRow(ctx, `SELECT current_schema()`).Scan(&schema); err != nil {
		t.Fatal(err)
	}
	var want int
	if err := pool.QueryRow(ctx, `SELECT pgcoord_outbox_bucket('orders', 'o-1')`).Scan(&want); err != nil || want == 0 {
		t.Fatalf("bucket of (orders, o-1): %d, %v (the test needs one that is not 0, the impostor's)", want, err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	evil := pgconfig.QuoteIdent(schema + "_evil")
	for _, sql := range []string{
		`CREATE SCHEMA ` + evil,
		`CREATE FUNCTION ` + evil + `.pgcoord_lock_key(name text) RETURNS bigint LANGUAGE sql IMMUTABLE AS $$ SELECT 0::bigint $$`,
		`SET LOCAL search_path = ` + evil + `, ` + pgconfig.QuoteIdent(schema),
	} {
		if _, err := tx.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	var got int
	if err := tx.QueryRow(ctx, `SELECT `+pgconfig.QuoteIdent(schema)+`.pgcoord_outbox_bucket('orders', 'o-1')`).Scan(&got); err != nil {
		t.Fatal(err)
	}
	if got != want {
		t.Errorf("with the caller's own pgcoord_lock_key first on its search_path, the bucket of (orders, o-1) is %d, want %d", got, want)
	}
}
