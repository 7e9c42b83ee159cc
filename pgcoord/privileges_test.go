package pgcoord_test

import (
	"context"
	"errors"
	"net/url"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/dedupe"
	"github.com/pgcoord/pgcoord/fenced"
	"github.com/pgcoord/pgcoord/idempotency"
	"github.com/pgcoord/pgcoord/internal/pgconfig"
	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/leases"
	"github.com/pgcoord/pgcoord/outbox"
	"github.com/pgcoord/pgcoord/pgcoord"
	"github.com/pgcoord/pgcoord/semaphore"
	"github.com/pgcoord/pgcoord/singleton"
)

// leastPrivilege runs the two SQL blocks of docs/security.md as written, with this test's
// own role names (roles are cluster-wide): the roles as the test's admin, the migrations
// as the owner, the grants as the owner. Its pools connect as each role, with the schema
// on their search_path; the roles are dropped when t ends.
type leastPrivilege struct {
	owner, app, viewer *pgxpool.Pool
	appRole, schema    string
}

func newLeastPrivilege(t *testing.T) leastPrivilege { return newLeastPrivilegeAt(t, 0) }

// newLeastPrivilegeAt is newLeastPrivilege with the owner's migrations stopped at version
// to (0: all of them) before the grants are run, as an install that upgrades later.
func newLeastPrivilegeAt(t *testing.T, to int64) leastPrivilege {
	t.Helper()
	ctx := context.Background()
	doc, err := os.ReadFile("../docs/security.md")
	if err != nil {
		t.Fatal(err)
	}
	var blocks []string
	for _, m := range regexp.MustCompile("(?s)```sql\n(.*?)```").FindAllStringSubmatch(string(doc), -1) {
		blocks = append(blocks, m[1])
	}
	if len(blocks) != 2 {
		t.Fatalf("docs/security.md has %d sql blocks, want 2 (roles, then grants)", len(blocks))
	}
	suffix := strings.ReplaceAll(pgtest.SchemaName(t), "-", "_")
	names := regexp.MustCompile(`\bcoord(_owner|_app|_viewer)?\b`)
	rename := func(sql string) string { return names.ReplaceAllString(sql, "coord${1}_"+suffix) }
	lp := leastPrivilege{appRole: "coord_app_" + suffix, schema: "coord_" + suffix}

	admin, err := pgxpool.New(ctx, pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, sql := range []string{
			`DROP OWNED BY coord_app, coord_viewer`, `DROP OWNED BY coord_owner CASCADE`,
			`DROP ROLE coord_owner, coord_app, coord_viewer`,
		} {
			if _, err := admin.Exec(ctx, rename(sql)); err != nil {
				t.Errorf("cleanup: %s: %v", sql, err)
			}
		}
		admin.Close()
	})
	if _, err := admin.Exec(ctx, rename(blocks[0])); err != nil {
		t.Fatalf("the roles block: %v", err)
	}
	as := func(role, password string) *pgxpool.Pool {
		u, err := url.Parse(pgtest.URL(t))
		if err != nil {
			t.Fatal(err)
		}
		u.User = url.UserPassword(role+"_"+suffix, password)
		cfg, err := pgconfig.Pool(u.String(), pgconfig.Options{AppName: "pgcoord-test", Schema: lp.schema})
		if err != nil {
			t.Fatal(err)
		}
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		return pool
	}
	lp.owner = as("coord_owner", "owner-secret")
	if _, err := pgcoord.Migrate(ctx, lp.owner, &pgcoord.MigrateOpts{To: to}); err != nil {
		t.Fatalf("migrate as the owner: %v", err)
	}
	grants := blocks[1]
	if to != 0 && to < 10 { // the secret comes with 00010: its REVOKE waits for it
		grants = regexp.MustCompile(`(?m)^.*pgcoord_secret.*\n`).ReplaceAllString(grants, "")
	}
	if _, err := lp.owner.Exec(ctx, rename(grants)); err != nil {
		t.Fatalf("the grants block: %v", err)
	}
	lp.app, lp.viewer = as("coord_app", "app-secret"), as("coord_viewer", "viewer-secret")
	return lp
}

// The least-privilege setup of docs/security.md, run as written: an application role uses
// every primitive, a viewer reads, and neither can change pgcoord's schema — nor replace
// its clock.
func TestLeastPrivilegeSetup(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	lp := newLeastPrivilege(t)
	schema := lp.schema
	app := lp.app
	must := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s as the application role: %v", what, err)
		}
	}
	st, err := pgcoord.CheckSchema(ctx, app)
	must("CheckSchema", err)
	if len(st.Pending()) != 0 || st.Schema != schema {
		t.Fatalf("CheckSchema as the application role: %+v, want %s with nothing pending", st, schema)
	}
	l, err := leases.TryAcquire(ctx, app, "orders:42", time.Minute, nil)
	must("leases.TryAcquire", err)
	l, err = leases.Renew(ctx, app, l, time.Minute, nil)
	must("leases.Renew", err)
	must("fenced.CheckLease", pgx.BeginFunc(ctx, app, func(tx pgx.Tx) error { return fenced.CheckLease(ctx, tx, l) }))
	must("leases.Release", leases.Release(ctx, app, l, nil))
	p, err := semaphore.TryAcquire(ctx, app, "tenant-1", 2, time.Minute, nil)
	must("semaphore.TryAcquire", err)
	must("semaphore.Release", semaphore.Release(ctx, app, p))
	_, err = singleton.RunOnce(ctx, app, "report", func(context.Context, pgx.Tx) error { return nil })
	must("singleton.RunOnce", err)
	must("dedupe.Claim and outbox.Enqueue", pgx.BeginFunc(ctx, app, func(tx pgx.Tx) error {
		if _, err := dedupe.Claim(ctx, tx, "webhooks", "evt-1", nil); err != nil {
			return err
		}
		_, err := outbox.Enqueue(ctx, tx, outbox.Message{Topic: "orders", Key: "42", Payload: []byte(`{}`), JSON: true})
		return err
	}))
	a, err := idempotency.Begin(ctx, app, "client-1", "pay-1", []byte("fp"), nil)
	must("idempotency.Begin", err)
	must("Attempt.Complete", a.Complete(ctx, idempotency.Response{Status: 201}))
	_, err = pgcoord.GC(ctx, app, nil)
	must("pgcoord.GC", err)

	viewer := lp.viewer
	if _, err := leases.List(ctx, viewer, nil); err != nil {
		t.Fatalf("leases.List as the viewer: %v", err)
	}
	refused := func(who string, pool *pgxpool.Pool, sql string) {
		t.Helper()
		_, err := pool.Exec(ctx, sql)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "42501" {
			t.Errorf("%s: %s = %v, want SQLSTATE 42501 (insufficient_privilege)", who, sql, err)
		}
	}
	_, err = leases.TryAcquire(ctx, viewer, "orders:43", time.Minute, nil)
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "42501" {
		t.Errorf("leases.TryAcquire as the viewer = %v, want SQLSTATE 42501", err)
	}
	for _, sql := range []string{
		`DROP TABLE pgcoord_leases`,
		`ALTER TABLE pgcoord_leases ADD COLUMN x int`,
		`TRUNCATE pgcoord_leases`,
		`CREATE TABLE pgcoord_extra (x int)`,
		`CREATE OR REPLACE FUNCTION pgcoord_now() RETURNS timestamptz LANGUAGE sql STABLE AS $$ SELECT now() + interval '1 day' $$`,
		`DROP TRIGGER pgcoord_retire ON pgcoord_leases`,
		`ALTER SEQUENCE pgcoord_token_seq RESTART WITH 1`,
		`SELECT setval('pgcoord_token_seq', 1)`,
	} {
		refused("the application role", app, sql)
		refused("the viewer", viewer, sql)
	}
}

// An install that ran docs/security.md's grants (with their default privileges) before
// migration 00010 created the singleton secret: the upgrade keeps the secret from the
// read-only viewer, which could compute singleton keys with it, and leaves it to the
// application role.
func TestUpgradeKeepsTheSecretFromTheViewer(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	lp := newLeastPrivilegeAt(t, 9)
	if _, err := pgcoord.Migrate(ctx, lp.owner, nil); err != nil {
		t.Fatalf("the upgrade, as the owner: %v", err)
	}
	var secret string
	err := lp.viewer.QueryRow(ctx, `SELECT secret FROM pgcoord_secret`).Scan(&secret)
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "42501" {
		t.Fatalf("the viewer reads the secret after the upgrade: %v", err)
	}
	if err := lp.app.QueryRow(ctx, `SELECT secret FROM pgcoord_secret`).Scan(&secret); err != nil {
		t.Fatalf("the application role cannot read the secret: %v", err)
	}
}
