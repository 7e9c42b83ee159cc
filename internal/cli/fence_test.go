package cli_test

import (
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
	d := newLeaseDB(t)
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
	d := newLeaseDB(t)
	if _, err := d.pool.Exec(context.Background(), "CREATE TABLE payments (id int PRIMARY KEY, note text, fence_token bigint)"); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
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
