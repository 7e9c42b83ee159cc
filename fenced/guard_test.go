package fenced_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/fenced"
	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/leases"
	"github.com/pgcoord/pgcoord/pgcoord"
)

// guardTriggers counts the guard triggers on table.
func guardTriggers(t *testing.T, pool *pgxpool.Pool, table string) int64 {
	t.Helper()
	return queryInt64(t, pool, `SELECT count(*) FROM pg_trigger
		WHERE tgrelid = $1::regclass AND tgname LIKE 'pgcoord\_fence\_guard\_%' AND NOT tgisinternal`, table)
}

// guardError checks that err is the guard trigger's refusal, as a raw driver call sees it.
func guardError(t *testing.T, what string, err error) {
	t.Helper()
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != fenced.GuardSQLState {
		t.Fatalf("%s: err = %v, want the guard's SQLSTATE %s", what, err, fenced.GuardSQLState)
	}
	if !fenced.IsStale(err) {
		t.Errorf("%s: IsStale(%v) = false", what, err)
	}
	if errors.Is(err, fenced.ErrStale) {
		t.Errorf("%s: a raw driver error unexpectedly is ErrStale", what)
	}
}

func TestGuard(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pgtest.Pool(t)
	exec(t, pool, `CREATE TABLE docs (id int PRIMARY KEY, body text, fence_token bigint, small_token smallint)`)
	exec(t, pool, `INSERT INTO docs VALUES (1, 'a', 10, 3), (2, 'b', NULL, NULL)`)

	for range 2 { // idempotent
		if err := fenced.InstallGuard(ctx, pool, "docs", "fence_token", nil); err != nil {
			t.Fatalf("InstallGuard: %v", err)
		}
	}
	if n := guardTriggers(t, pool, "docs"); n != 1 {
		t.Fatalf("%d guard triggers after installing twice, want 1", n)
	}

	// Raw SQL, not through Exec: the database refuses whichever path sends it.
	_, err := pool.Exec(ctx, `UPDATE docs SET fence_token = 9, body = 'stale' WHERE id = 1`)
	guardError(t, "lowering update", err)
	_, err = pool.Exec(ctx, `UPDATE docs SET fence_token = NULL WHERE id = 1`)
	guardError(t, "update to NULL", err)
	// One stale row fails the whole statement.
	_, err = pool.Exec(ctx, `UPDATE docs SET fence_token = 5`)
	guardError(t, "update of every row", err)

	// Equal, higher, and updates that leave the column alone are allowed.
	for _, sql := range []string{
		`UPDATE docs SET fence_token = 10, body = 'equal' WHERE id = 1`,
		`UPDATE docs SET fence_token = 11, body = 'higher' WHERE id = 1`,
		// The documented limitation: a write that skips fencing is not caught.
		`UPDATE docs SET body = 'unfenced' WHERE id = 1`,
		// A row with no token yet may get one.
		`UPDATE docs SET fence_token = 1 WHERE id = 2`,
	} {
		if _, err := pool.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	var body string
	var token int64
	if err := pool.QueryRow(ctx, `SELECT body, fence_token FROM docs WHERE id = 1`).Scan(&body, &token); err != nil {
		t.Fatal(err)
	}
	if body != "unfenced" || token != 11 {
		t.Fatalf("row 1 = (%s, %d), want (unfenced, 11)", body, token)
	}

	// A second guard, on a smallint column, is independent of the first.
	if err := fenced.InstallGuard(ctx, pool, "docs", "small_token", nil); err != nil {
		t.Fatal(err)
	}
	if n := guardTriggers(t, pool, "docs"); n != 2 {
		t.Fatalf("%d guard triggers with two columns guarded, want 2", n)
	}
	_, err = pool.Exec(ctx, `UPDATE docs SET small_token = 2 WHERE id = 1`)
	guardError(t, "lowering the smallint column", err)

	// RemoveGuard lets the lowering update through again; removing twice is fine.
	for range 2 {
		if err := fenced.RemoveGuard(ctx, pool, "docs", "fence_token"); err != nil {
			t.Fatalf("RemoveGuard: %v", err)
		}
	}
	if n := guardTriggers(t, pool, "docs"); n != 1 {
		t.Fatalf("%d guard triggers after removing one of two, want 1", n)
	}
	if _, err := pool.Exec(ctx, `UPDATE docs SET fence_token = 9 WHERE id = 1`); err != nil {
		t.Fatalf("lowering update after RemoveGuard: %v", err)
	}
}

func TestGuardSchemaQualified(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pgtest.Pool(t)
	other := pgtest.SchemaName(t) // dropped when the test ends
	exec(t, pool, `CREATE SCHEMA `+other)
	// Two tables called docs: one on search_path, one in the other schema.
	for _, table := range []string{"docs", other + ".docs"} {
		exec(t, pool, `CREATE TABLE `+table+` (id int PRIMARY KEY, fence_token bigint NOT NULL)`)
		exec(t, pool, `INSERT INTO `+table+` VALUES (1, 10)`)
	}
	if err := fenced.InstallGuard(ctx, pool, other+".docs", "fence_token", nil); err != nil {
		t.Fatalf("InstallGuard(%s.docs): %v", other, err)
	}
	_, err := pool.Exec(ctx, `UPDATE `+other+`.docs SET fence_token = 9`)
	guardError(t, "lowering update of the qualified table", err)
	if _, err := pool.Exec(ctx, `UPDATE docs SET fence_token = 9`); err != nil {
		t.Errorf("the table on search_path was guarded instead of %s.docs: %v", other, err)
	}

	var current string
	if err := pool.QueryRow(ctx, `SELECT current_schema()`).Scan(&current); err != nil {
		t.Fatal(err)
	}
	if err := fenced.InstallGuard(ctx, pool, current+".docs", "fence_token", nil); err != nil {
		t.Fatal(err)
	}
	_, err = pool.Exec(ctx, `UPDATE docs SET fence_token = 8`)
	guardError(t, "lowering update of the table qualified with the current schema", err)

	if err := fenced.RemoveGuard(ctx, pool, other+".docs", "fence_token"); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE `+other+`.docs SET fence_token = 1`); err != nil {
		t.Errorf("lowering update after RemoveGuard(%s.docs): %v", other, err)
	}
}

func TestGuardBadInput(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pgtest.Pool(t)
	exec(t, pool, `CREATE TABLE docs (id int PRIMARY KEY, body text, fence_token bigint, ratio numeric)`)
	exec(t, pool, `CREATE TABLE y (id int)`)

	cases := []struct{ table, column string }{
		{"docs", "no_such_column"},
		{"docs", "body"},  // text
		{"docs", "ratio"}, // numeric
		{"x; drop table y", "fence_token"},
		{"docs", "fence_token; drop table y"},
		{"docs", "fence_token') ; drop table y; --"},
		{`docs"`, "fence_token"},
		{"", "fence_token"},
		{"docs", ""},
		{".docs", "fence_token"},
		{"a.b.docs", "fence_token"},
		{"docs", "1token"},
	}
	for _, c := range cases {
		if err := fenced.InstallGuard(ctx, pool, c.table, c.column, nil); !errors.Is(err, pgcoord.ErrInvalidArgument) {
			t.Errorf("InstallGuard(%q, %q) = %v, want ErrInvalidArgument", c.table, c.column, err)
		}
		if c.column == "no_such_column" || c.column == "body" || c.column == "ratio" {
			continue // well-formed names: RemoveGuard has nothing to remove, which is fine
		}
		if err := fenced.RemoveGuard(ctx, pool, c.table, c.column); !errors.Is(err, pgcoord.ErrInvalidArgument) {
			t.Errorf("RemoveGuard(%q, %q) = %v, want ErrInvalidArgument", c.table, c.column, err)
		}
	}
	if n := guardTriggers(t, pool, "docs"); n != 0 {
		t.Errorf("%d guard triggers after refused calls, want none", n)
	}
	if n := queryInt64(t, pool, `SELECT count(*) FROM pg_class WHERE oid = to_regclass('y')`); n != 1 {
		t.Errorf("table y is gone")
	}

	// A table that does not exist, or is not a table.
	exec(t, pool, `CREATE VIEW docs_view AS SELECT * FROM docs`)
	for _, table := range []string{"no_such_table", "no_such_schema.docs", "docs_view"} {
		if err := fenced.InstallGuard(ctx, pool, table, "fence_token", nil); !errors.Is(err, pgcoord.ErrInvalidArgument) {
			t.Errorf("InstallGuard(%q) = %v, want ErrInvalidArgument", table, err)
		}
	}

	var nilPool *pgxpool.Pool
	for _, db := range []pgcoord.DBTX{nil, nilPool} {
		if err := fenced.InstallGuard(ctx, db, "docs", "fence_token", nil); !errors.Is(err, pgcoord.ErrInvalidArgument) {
			t.Errorf("InstallGuard on %#v = %v, want ErrInvalidArgument", db, err)
		}
		if err := fenced.RemoveGuard(ctx, db, "docs", "fence_token"); !errors.Is(err, pgcoord.ErrInvalidArgument) {
			t.Errorf("RemoveGuard on %#v = %v, want ErrInvalidArgument", db, err)
		}
	}
}

func TestGuardNames(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pgtest.Pool(t)
	// Two columns (59 bytes) whose names share the first 48: pgcoord_fence_guard_<column>
	// would be cut to the same 63-byte trigger name for both.
	long := strings.Repeat("fence_token_", 4)
	cols := []string{long + "of_writer_a", long + "of_writer_b"}
	exec(t, pool, `CREATE TABLE docs (id int PRIMARY KEY, `+cols[0]+` bigint, `+cols[1]+` bigint)`)
	exec(t, pool, `INSERT INTO docs VALUES (1, 10, 10)`)
	for _, c := range cols {
		if err := fenced.InstallGuard(ctx, pool, "docs", c, nil); err != nil {
			t.Fatalf("InstallGuard(docs, %s): %v", c, err)
		}
	}
	if n := guardTriggers(t, pool, "docs"); n != 2 {
		t.Fatalf("%d guard triggers for two long column names, want 2", n)
	}
	for _, c := range cols {
		_, err := pool.Exec(ctx, `UPDATE docs SET `+c+` = 9`)
		guardError(t, "lowering "+c, err)
	}
	if err := fenced.RemoveGuard(ctx, pool, "docs", cols[0]); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE docs SET `+cols[0]+` = 9`); err != nil {
		t.Errorf("lowering %s after its guard was removed: %v", cols[0], err)
	}
	_, err := pool.Exec(ctx, `UPDATE docs SET `+cols[1]+` = 9`)
	guardError(t, "lowering "+cols[1]+" after the other guard was removed", err)

	// Table names resolve as in SQL: unquoted names fold to lower case.
	if err := fenced.InstallGuard(ctx, pool, "DOCS", cols[0], nil); err != nil {
		t.Fatalf("InstallGuard(DOCS): %v", err)
	}
	_, err = pool.Exec(ctx, `UPDATE docs SET `+cols[0]+` = 8`)
	guardError(t, "lowering "+cols[0]+" guarded through DOCS", err)
}

// guardEvents returns the events the guard trigger of column fires on ("INSERT OR UPDATE"
// or "UPDATE"), from its definition.
func guardEvents(t *testing.T, pool *pgxpool.Pool, table, column string) string {
	t.Helper()
	var def string
	err := pool.QueryRow(t.Context(), `SELECT pg_get_triggerdef(oid) FROM pg_trigger WHERE tgrelid = $1::regclass AND tgname = $2`,
		table, fenced.GuardTriggerName(column)).Scan(&def)
	if err != nil {
		t.Fatalf("the guard trigger of %s.%s: %v", table, column, err)
	}
	_, rest, _ := strings.Cut(def, " BEFORE ")
	events, _, _ := strings.Cut(rest, " ON ")
	return events
}

// The resource-column options: validated before anything is installed; the prefix is
// passed to the trigger exactly (quotes and backslashes included); installing again
// without them turns the guard back into the UPDATE-only one.
func TestGuardResourceColumnOptions(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pgtest.Pool(t)
	exec(t, pool, `CREATE TABLE ledger (id serial PRIMARY KEY, account text, fence_token bigint)`)
	for _, o := range []*fenced.GuardOpts{
		{ResourceColumn: "no_such_column"},
		{ResourceColumn: "account; drop table ledger"},
		{ResourcePrefix: "account:"}, // a prefix needs a column
		{ResourceColumn: "account", ResourcePrefix: strings.Repeat("p", 255)},
		{ResourceColumn: "account", ResourcePrefix: "a\x00b"},
	} {
		if err := fenced.InstallGuard(ctx, pool, "ledger", "fence_token", o); !errors.Is(err, pgcoord.ErrInvalidArgument) {
			t.Errorf("InstallGuard with %+v = %v, want ErrInvalidArgument", o, err)
		}
	}
	if n := guardTriggers(t, pool, "ledger"); n != 0 {
		t.Fatalf("%d guard triggers after refused calls, want none", n)
	}

	// A grant of another lease first, so that the tokens below are not the first ones.
	if _, err := leases.TryAcquire(ctx, pool, "other", time.Minute, nil); err != nil {
		t.Fatal(err)
	}
	prefix := `it's\a:`
	if err := fenced.InstallGuard(ctx, pool, "ledger", "fence_token", &fenced.GuardOpts{ResourceColumn: "account", ResourcePrefix: prefix}); err != nil {
		t.Fatalf("InstallGuard: %v", err)
	}
	if ev := guardEvents(t, pool, "ledger", "fence_token"); ev != "INSERT OR UPDATE" {
		t.Fatalf("the guard with a resource column fires on %q, want INSERT OR UPDATE", ev)
	}
	l, err := leases.TryAcquire(ctx, pool, prefix+"7", time.Minute, nil)
	if err != nil {
		t.Fatal(err)
	}
	exec(t, pool, `INSERT INTO ledger (account, fence_token) VALUES ('7', $1)`, l.Token)
	if got := register(t, pool, prefix+"7"); got != l.Token {
		t.Fatalf("register %q = %d, want %d: the prefix did not reach the trigger intact", prefix+"7", got, l.Token)
	}
	_, err = pool.Exec(ctx, `INSERT INTO ledger (account, fence_token) VALUES ('7', $1)`, l.Token-1)
	guardError(t, "an insert below the lease's grant", err)
	_, err = pool.Exec(ctx, `INSERT INTO ledger (account, fence_token) VALUES ('8', 0)`)
	guardError(t, "an insert with token 0 (no token)", err)

	// Installed again without options: UPDATE-only, and a stale insert passes.
	if err := fenced.InstallGuard(ctx, pool, "ledger", "fence_token", nil); err != nil {
		t.Fatal(err)
	}
	if n, ev := guardTriggers(t, pool, "ledger"), guardEvents(t, pool, "ledger", "fence_token"); n != 1 || ev != "UPDATE" {
		t.Fatalf("after reinstalling without options: %d triggers on %q, want 1 on UPDATE", n, ev)
	}
	exec(t, pool, `INSERT INTO ledger (account, fence_token) VALUES ('7', $1)`, l.Token-1)
	if err := fenced.RemoveGuard(ctx, pool, "ledger", "fence_token"); err != nil {
		t.Fatal(err)
	}
	if n := guardTriggers(t, pool, "ledger"); n != 0 {
		t.Fatalf("%d guard triggers after RemoveGuard", n)
	}
}
