package cli_test

import (
	"github.com/jackc/pgx/v5"

	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgcoord/pgcoord/internal/cli"
)

// fence guard installs a trigger that makes the database refuse an UPDATE lowering the fence
// column (SQLSTATE PGC01), whatever code sends it; --remove takes it away.
func TestFenceGuardInstallAndRemove(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	ctx := context.Background()
	if _, err := d.pool.Exec(ctx, `CREATE TABLE payments (id int PRIMARY KEY, status text, fence_token bigint);
		INSERT INTO payments VALUES (42, 'pending', 10)`); err != nil {
		t.Fatal(err)
	}
	lower := func() error {
		_, err := d.pool.Exec(ctx, "UPDATE payments SET status = 'charged', fence_token = 9 WHERE id = 42")
		return err
	}

	code, out, errOut := d.run(t, "fence", "guard", "payments", "fence_token")
	if code != cli.ExitOK || !strings.Contains(out, "installed guard trigger pgcoord_fence_guard_fence_token on payments") {
		t.Fatalf("fence guard = %d, stdout %q, stderr %q", code, out, errOut)
	}
	var pgErr *pgconn.PgError
	if err := lower(); !errors.As(err, &pgErr) || pgErr.Code != "PGC01" {
		t.Fatalf("a lowering UPDATE under the guard: %v, want SQLSTATE PGC01", err)
	}
	if _, err := d.pool.Exec(ctx, "UPDATE payments SET status = 'charged', fence_token = 11 WHERE id = 42"); err != nil {
		t.Fatalf("a raising UPDATE under the guard: %v", err)
	}
	// Installing again is harmless.
	if code, _, errOut := d.run(t, "fence", "guard", "payments", "fence_token"); code != cli.ExitOK {
		t.Fatalf("second fence guard = %d, %s", code, errOut)
	}

	code, out, errOut = d.run(t, "--json", "fence", "guard", "payments", "fence_token", "--remove")
	var g struct {
		Table     string `json:"table"`
		Column    string `json:"column"`
		Trigger   string `json:"trigger"`
		Installed *bool  `json:"installed"`
	}
	if err := json.Unmarshal([]byte(out), &g); code != cli.ExitOK || err != nil || g.Table != "payments" || g.Column != "fence_token" ||
		g.Trigger != "pgcoord_fence_guard_fence_token" || g.Installed == nil || *g.Installed {
		t.Fatalf("fence guard --remove --json = %d, %q (%v), stderr %q", code, out, err, errOut)
	}
	if err := lower(); err != nil {
		t.Fatalf("a lowering UPDATE after --remove: %v, want it accepted", err)
	}
	var n int
	if err := d.pool.QueryRow(ctx, "SELECT count(*) FROM pg_trigger WHERE tgrelid = 'payments'::regclass AND NOT tgisinternal").Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d triggers left on payments (%v)", n, err)
	}
	// Removing a guard that is not there is not an error.
	if code, _, errOut := d.run(t, "fence", "guard", "payments", "fence_token", "--remove"); code != cli.ExitOK {
		t.Fatalf("second --remove = %d, %s", code, errOut)
	}

	// Schema-qualified names work too, with --json on install.
	var schema string
	if err := d.pool.QueryRow(ctx, "SELECT current_schema()").Scan(&schema); err != nil {
		t.Fatal(err)
	}
	code, out, errOut = d.run(t, "--json", "fence", "guard", schema+".payments", "fence_token")
	if err := json.Unmarshal([]byte(out), &g); code != cli.ExitOK || err != nil || !*g.Installed || g.Table != schema+".payments" {
		t.Fatalf("fence guard schema.table --json = %d, %q (%v), stderr %q", code, out, err, errOut)
	}
	_, err := d.pool.Exec(ctx, "UPDATE payments SET fence_token = 8 WHERE id = 42") // the row has 9
	if !errors.As(err, &pgErr) || pgErr.Code != "PGC01" {
		t.Fatalf("a lowering UPDATE under the schema-qualified guard: %v, want SQLSTATE PGC01", err)
	}
}

// Bad identifiers, missing or non-integer columns and wrong argument counts are usage
// errors (exit 2).
func TestFenceGuardBadArguments(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	if _, err := d.pool.Exec(context.Background(), "CREATE TABLE payments (id int PRIMARY KEY, note text, fence_token bigint)"); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"payments", "fence_token", "--resource-column", "no_such_column"},
		{"payments", "fence_token", "--resource-column", "order-id"},
		{"payments", "fence_token", "--resource-prefix", "order:"},
		{"payments; DROP TABLE payments", "fence_token"},
		{"payments", "fence-token"},
		{"a.b.c", "fence_token"},
		{"", "fence_token"},
		{"payments", ""},
		{"payments", "no_such_column"},
		{"payments", "note"},
		{"payments", "fence_token", "extra"},
		{"payments"},
	} {
		for _, remove := range []bool{false, true} {
			all := append([]string{"fence", "guard"}, args...)
			if remove {
				if args[0] == "payments" && len(args) == 2 && (args[1] == "no_such_column" || args[1] == "note") {
					continue // removing checks names only: nothing to remove is not an error
				}
				// With --remove, any --resource-* flag is a usage error too.
				all = append(all, "--remove")
			}
			code, out, errOut := d.run(t, all...)
			if code != cli.ExitUsage || out != "" || !strings.HasPrefix(errOut, "pgcoord: ") {
				t.Errorf("pgcoord %q = %d, stdout %q, stderr %q; want exit 2", all, code, out, errOut)
			}
		}
	}
	var n int
	if err := d.pool.QueryRow(context.Background(), "SELECT count(*) FROM payments").Scan(&n); err != nil {
		t.Fatalf("payments is gone: %v", err)
	}
}

// With --resource-column the guard judges every INSERT and UPDATE against the fence register
// of the resource the row names: an insert-only ledger is guarded, whatever code inserts.
func TestFenceGuardResourceColumn(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	ctx := context.Background()
	if _, err := d.pool.Exec(ctx, `CREATE TABLE charges (order_id int, amount int, fence_token bigint)`); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := d.run(t, "--json", "fence", "guard", "charges", "fence_token", "--resource-column", "order_id", "--resource-prefix", "order:")
	var g struct {
		Table          string `json:"table"`
		Column         string `json:"column"`
		ResourceColumn string `json:"resource_column"`
		ResourcePrefix string `json:"resource_prefix"`
		Events         string `json:"events"`
		Trigger        string `json:"trigger"`
		Installed      bool   `json:"installed"`
	}
	if err := json.Unmarshal([]byte(out), &g); code != cli.ExitOK || err != nil || g.ResourceColumn != "order_id" || g.ResourcePrefix != "order:" ||
		g.Events != "INSERT, UPDATE" || g.Trigger != "pgcoord_fence_guard_fence_token" || !g.Installed {
		t.Fatalf("fence guard --resource-column --json = %d, %q (%v), stderr %q", code, out, err, errOut)
	}
	// The leases of order 42: A's grant, then B's after A's expiry (forced, here).
	var a, b int64
	if err := d.pool.QueryRow(ctx, `SELECT fence_token FROM pgcoord_lease_acquire('order:42', 'A', '1 minute')`).Scan(&a); err != nil {
		t.Fatal(err)
	}
	if _, err := d.pool.Exec(ctx, `SELECT pgcoord_lease_expire('order:42', 'test')`); err != nil {
		t.Fatal(err)
	}
	if err := d.pool.QueryRow(ctx, `SELECT fence_token FROM pgcoord_lease_acquire('order:42', 'B', '1 minute')`).Scan(&b); err != nil {
		t.Fatal(err)
	}
	insert := func(token any) error {
		_, err := d.pool.Exec(ctx, `INSERT INTO charges VALUES (42, 100, $1)`, token)
		return err
	}
	var pgErr *pgconn.PgError
	if err := insert(a); !errors.As(err, &pgErr) || pgErr.Code != "PGC01" {
		t.Fatalf("A's stale INSERT before B wrote: %v, want SQLSTATE PGC01", err)
	}
	if err := insert(b); err != nil {
		t.Fatalf("B's INSERT: %v", err)
	}
	if err := insert(nil); !errors.As(err, &pgErr) || pgErr.Code != "PGC01" {
		t.Fatalf("an INSERT without a token: %v, want SQLSTATE PGC01", err)
	}

	// Installing it again without the resource column makes it UPDATE-only: INSERTs pass.
	code, out, errOut = d.run(t, "fence", "guard", "charges", "fence_token")
	if code != cli.ExitOK || !strings.Contains(out, "INSERTs are not checked") {
		t.Fatalf("fence guard without --resource-column = %d, %q, %q", code, out, errOut)
	}
	if err := insert(a); err != nil {
		t.Fatalf("an INSERT under the UPDATE-only guard: %v, want it accepted (the documented limit)", err)
	}
	if code, _, errOut := d.run(t, "fence", "guard", "charges", "fence_token", "--remove", "--resource-column", "order_id"); code != cli.ExitUsage {
		t.Fatalf("--remove with --resource-column = %d (%s), want a usage error", code, errOut)
	}
}

// TABLE is read as SQL reads a table name: unquoted parts fold to lower case, double-quoted
// parts keep their case, spaces and dots, and either may be schema-qualified. A table that
// does not exist is a failure (exit 1) naming the schema looked in, not a usage error.
func TestFenceGuardTableNames(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	schema := d.flags[3]
	if _, err := d.pool.Exec(context.Background(), `CREATE TABLE "My Table" (id int, fence_token bigint);
		CREATE TABLE orders (id int, fence_token bigint)`); err != nil {
		t.Fatal(err)
	}
	for _, table := range []string{`"My Table"`, pgx.Identifier{schema, "My Table"}.Sanitize(), "orders", "ORDERS",
		schema + ".orders", pgx.Identifier{schema}.Sanitize() + ".Orders"} {
		if code, out, errOut := d.run(t, "fence", "guard", table, "fence_token"); code != cli.ExitOK || !strings.Contains(out, "installed guard trigger") {
			t.Errorf("fence guard %s = %d, %q, %q; want it installed", table, code, out, errOut)
		}
	}
	for _, table := range []string{"no_such_table", `"my table"`, "no_such_schema.orders", pgx.Identifier{schema, "nope"}.Sanitize()} {
		code, out, errOut := d.run(t, "fence", "guard", table, "fence_token")
		if code != cli.ExitFailure || out != "" || !strings.Contains(errOut, "no table") || !strings.Contains(errOut, `first in schema "`+schema+`"`) ||
			strings.Contains(errOut, "--help") {
			t.Errorf("fence guard %s (no such table) = %d, %q, %q; want exit 1 naming the schema", table, code, out, errOut)
		}
	}
}
