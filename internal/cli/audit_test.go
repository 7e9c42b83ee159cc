package cli_test

import (
	"context"
	"encoding/json"
	"errors"
	"maps"
	"net/url"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgcoord/pgcoord/internal/cli"
	"github.com/pgcoord/pgcoord/internal/pgconfig"
	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/internal/ui/audit"
)

// TestAuditList: `audit list` shows the audited actions newest first, as a table and as
// JSON with snake_case keys, filtered by --action and capped by --limit.
func TestAuditList(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	code, out, _ := d.run(t, "--json", "audit", "list")
	if code != cli.ExitOK || strings.TrimSpace(out) != "[]" {
		t.Fatalf("empty audit list --json = %d %q, want []", code, out)
	}
	for _, e := range []audit.Entry{
		{Actor: "local", RemoteAddr: "127.0.0.1:5000", Action: "lease.expire", Target: "order:1", Details: map[string]any{"fence_token": 3}},
		{Actor: "token:ab12cd34", RemoteAddr: "10.0.0.9:6000", Action: "semaphore.set_limit", Target: "tenant:9", Details: map[string]any{"limit": 5}},
	} {
		if _, err := audit.Record(t.Context(), d.pool, e); err != nil {
			t.Fatal(err)
		}
	}

	code, out, errOut := d.run(t, "--json", "audit", "list")
	if code != cli.ExitOK {
		t.Fatalf("audit list --json = %d: %s", code, errOut)
	}
	var got []map[string]any
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if len(got) != 2 || got[0]["action"] != "semaphore.set_limit" || got[1]["target"] != "order:1" ||
		got[0]["actor"] != "token:ab12cd34" || got[1]["remote_addr"] != "127.0.0.1:5000" {
		t.Fatalf("audit list --json = %s, want the two entries newest first", out)
	}
	want := []string{"action", "actor", "at", "details", "id", "remote_addr", "session_role", "target"}
	if keys := slices.Sorted(maps.Keys(got[0])); !slices.Equal(keys, want) {
		t.Fatalf("keys %v, want %v", keys, want)
	}
	var login string
	if err := d.pool.QueryRow(t.Context(), "SELECT session_user").Scan(&login); err != nil {
		t.Fatal(err)
	}
	if got[1]["details"].(map[string]any)["fence_token"] != float64(3) || got[0]["at"] == nil || got[0]["session_role"] != login {
		t.Fatalf("entry %v", got[1])
	}

	code, out, _ = d.run(t, "audit", "list", "--action", "lease.expire")
	if code != cli.ExitOK || !strings.Contains(out, "ACTOR") || !strings.Contains(out, "LOGIN") || !strings.Contains(out, "order:1") ||
		strings.Contains(out, "tenant:9") || !strings.Contains(out, `{"fence_token":3}`) {
		t.Fatalf("audit list --action lease.expire = %d:\n%s", code, out)
	}
	code, out, errOut = d.run(t, "audit", "list", "--limit", "1")
	if code != cli.ExitOK || !strings.Contains(out, "tenant:9") || strings.Contains(out, "order:1") ||
		!strings.Contains(errOut, "there are more") {
		t.Fatalf("audit list --limit 1 = %d:\n%s\n%s", code, out, errOut)
	}
	if code, _, _ := d.run(t, "audit", "list", "--limit", "0"); code != cli.ExitUsage {
		t.Fatalf("--limit 0 = %d, want 2", code)
	}
}

// appRole creates a login role, dropped when t ends, with the grants docs/security.md
// gives the application role on d's schema — DELETE and UPDATE on every table, the audit
// log included, as a careless operator leaves them — and returns its name and the
// flags that run pgcoord as it.
func appRole(t *testing.T, d testDB) (string, []string) {
	t.Helper()
	ctx := context.Background()
	var schema string
	if err := d.pool.QueryRow(ctx, "SELECT current_schema()").Scan(&schema); err != nil {
		t.Fatal(err)
	}
	role := "app_" + strings.TrimPrefix(pgtest.SchemaName(t), "t_")
	if len(role) > 63 {
		role = role[len(role)-63:]
	}
	admin := d.pool // the test's login owns the schema and its tables
	q := pgconfig.QuoteIdent
	for _, sql := range []string{
		"CREATE ROLE " + q(role) + " LOGIN PASSWORD 'app-secret'",
		"GRANT USAGE ON SCHEMA " + q(schema) + " TO " + q(role),
		"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA " + q(schema) + " TO " + q(role),
		"GRANT USAGE ON ALL SEQUENCES IN SCHEMA " + q(schema) + " TO " + q(role),
	} {
		if _, err := admin.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	t.Cleanup(func() {
		for _, sql := range []string{"DROP OWNED BY " + q(role), "DROP ROLE " + q(role)} {
			if _, err := admin.Exec(context.Background(), sql); err != nil {
				t.Errorf("cleanup: %s: %v", sql, err)
			}
		}
	})
	u, err := url.Parse(pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(role, "app-secret")
	return role, []string{"--database-url", u.String(), "--schema", schema}
}

// An operator who runs pgcoord as the application role cannot pass for someone else:
// whatever --actor claims, the entry records the role the session logged in as; and
// cannot erase the entry afterwards, although the role was granted DELETE and UPDATE.
func TestAuditRecordsTheLoginRoleNotTheClaimedActor(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	role, flags := appRole(t, d)
	if code, _, errOut := run(t, append(flags, "--actor", "someone", "semaphores", "set-limit", "tenant:forged", "3")...); code != cli.ExitOK {
		t.Fatalf("semaphores set-limit as the application role = %d: %s", code, errOut)
	}
	code, out, errOut := run(t, append(flags, "--json", "audit", "list")...)
	if code != cli.ExitOK {
		t.Fatalf("audit list as the application role = %d: %s", code, errOut)
	}
	var got []map[string]any
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if len(got) != 1 || got[0]["actor"] != "someone" || got[0]["session_role"] != role || got[0]["action"] != "semaphore.set_limit" {
		t.Fatalf("audit list --json = %s; want the set-limit by actor someone recorded as session role %s", out, role)
	}
	code, out, _ = run(t, append(flags, "audit", "list")...)
	if code != cli.ExitOK || !strings.Contains(out, "someone") || !strings.Contains(out, role) {
		t.Fatalf("audit list = %d:\n%s\nwant actor someone beside login %s", code, out, role)
	}

	app := pgtest.NewPool(t, flags[1], flags[3])
	for _, sql := range []string{`DELETE FROM pgcoord_audit`, `UPDATE pgcoord_audit SET actor = 'nobody'`} {
		_, err := app.Exec(t.Context(), sql)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "42501" {
			t.Errorf("%s as the application role = %v; want SQLSTATE 42501", sql, err)
		}
	}
	// The owner prunes (docs/cli.md: DELETE as the owner).
	if tag, err := d.pool.Exec(t.Context(), `DELETE FROM pgcoord_audit WHERE action = 'semaphore.set_limit'`); err != nil || tag.RowsAffected() != 1 {
		t.Fatalf("the owner's DELETE = %v, %v; want 1 row", tag, err)
	}
}
