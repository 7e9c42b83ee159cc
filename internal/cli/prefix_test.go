package cli_test

import (
	"context"
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/idempotency"
	"github.com/pgcoord/pgcoord/internal/cli"
	"github.com/pgcoord/pgcoord/internal/ui/audit"
)

// prefixNames are the names each list is filled with: '%', '_' and '\' are plain
// characters to --prefix, never patterns.
var prefixNames = []string{"a%", "a%b", "a_b", "axb", "ab", `a\b`, "b%a", "A%b"}

// prefixCases are prefixes and the names of prefixNames each must list, exactly.
var prefixCases = []struct {
	prefix string
	want   []string
}{
	{"a%", []string{"a%", "a%b"}},
	{"a_", []string{"a_b"}},
	{`a\`, []string{`a\b`}},
	{"a", []string{"a%", "a%b", "a_b", "ab", "axb", `a\b`}},
	{"a%b", []string{"a%b"}},
	{"zz", []string{}},
}

// listKind is one list command: how to create a row of a name, the command, and the JSON
// key that holds the name --prefix filters.
type listKind struct {
	create func(t *testing.T, pool *pgxpool.Pool, name string)
	args   []string
	key    string
}

var listKinds = map[string]listKind{
	"leases": {func(t *testing.T, pool *pgxpool.Pool, name string) { grant(t, pool, name, "h", time.Hour, time.Time{}) },
		[]string{"leases", "list", "--page-size", "1"}, "name"},
	"semaphores": {func(t *testing.T, pool *pgxpool.Pool, name string) {
		semGrant(t, pool, name, "h", 1, time.Hour, time.Time{})
	},
		[]string{"semaphores", "list"}, "key"},
	"jobs": {func(t *testing.T, pool *pgxpool.Pool, name string) { claimTick(t, pool, job(name), time.Time{}) },
		[]string{"jobs", "list"}, "name"},
	"idempotency": {idemScope, []string{"idempotency", "list"}, "scope"},
	"outbox": {func(t *testing.T, pool *pgxpool.Pool, name string) { obEnqueue(t, pool, obMsg(name, "k", "1")) },
		[]string{"outbox", "list"}, "topic"},
	"outbox stats": {func(t *testing.T, pool *pgxpool.Pool, name string) { obEnqueue(t, pool, obMsg(name, "k", "1")) },
		[]string{"outbox", "stats"}, "topic"},
	"audit": {func(t *testing.T, pool *pgxpool.Pool, name string) {
		if _, err := audit.Record(t.Context(), pool, audit.Entry{Actor: "t", Action: "lease.expire", Target: name}); err != nil {
			t.Fatal(err)
		}
	}, []string{"audit", "list"}, "target"},
}

// idemScope completes key "k" in scope name.
func idemScope(t *testing.T, pool *pgxpool.Pool, name string) {
	t.Helper()
	a, err := idempotency.Begin(context.Background(), pool, name, "k", idempotency.Fingerprint("GET", "/", nil, nil), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Complete(context.Background(), idempotency.Response{Status: 200}); err != nil {
		t.Fatal(err)
	}
}

// --prefix on every list returns exactly the rows whose name starts with it, character for
// character: '%', '_' and '\' match only themselves, case counts, and paging (leases,
// one row per query) keeps the filter.
func TestListPrefix(t *testing.T) {
	t.Parallel()
	for name, k := range listKinds {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			d := newTestDB(t)
			for _, n := range prefixNames {
				k.create(t, d.pool, n)
			}
			for _, c := range prefixCases {
				code, out, errOut := d.run(t, append([]string{"--json"}, append(slices.Clone(k.args), "--prefix", c.prefix)...)...)
				if code != cli.ExitOK {
					t.Fatalf("%v --prefix %q = %d: %s", k.args, c.prefix, code, errOut)
				}
				var rows []map[string]any
				if err := json.Unmarshal([]byte(out), &rows); err != nil || rows == nil {
					t.Fatalf("%v --prefix %q printed %q: %v", k.args, c.prefix, out, err)
				}
				got := []string{}
				for _, r := range rows {
					got = append(got, r[k.key].(string))
				}
				slices.Sort(got)
				want := slices.Sorted(slices.Values(c.want))
				if !slices.Equal(got, want) {
					t.Errorf("%v --prefix %q listed %q, want %q", k.args, c.prefix, got, want)
				}
			}
		})
	}
}

// --limit counts the rows that match --prefix, read page by page.
func TestListPrefixLimit(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	for _, n := range []string{"a", "b:1", "b:2", "b:3", "c"} {
		grant(t, d.pool, n, "h", time.Hour, time.Time{})
	}
	rows := d.listJSON(t, "--prefix", "b:", "--limit", "2", "--page-size", "1")
	if len(rows) != 2 || rows[0].Name != "b:1" || rows[1].Name != "b:2" {
		t.Fatalf("leases list --prefix b: --limit 2 = %+v, want b:1 and b:2", rows)
	}
}
