package cli_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/pgcoord/pgcoord/internal/cli"
	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/pgcoord"
)

// gcOut is the --json output of `pgcoord gc`.
type gcOut struct {
	OlderThanSeconds int64  `json:"older_than_seconds"`
	DryRun           bool   `json:"dry_run"`
	Deleted          int64  `json:"deleted"`
	WouldDelete      *int64 `json:"would_delete"`
	Kinds            []struct {
		Kind        string `json:"kind"`
		Deleted     int64  `json:"deleted"`
		WouldDelete *int64 `json:"would_delete"`
	} `json:"kinds"`
}

func decodeGCOut(t *testing.T, out string) gcOut {
	t.Helper()
	var raw map[string]any
	if err := json.Unmarshal([]byte(out), &raw); err != nil || len(raw) != 5 {
		t.Fatalf("gc --json printed %q: want an object of 5 keys (%v)", out, err)
	}
	var r gcOut
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatal(err)
	}
	if len(r.Kinds) != len(pgcoord.GCKinds()) {
		t.Fatalf("gc --json listed %d kinds, want %d: %s", len(r.Kinds), len(pgcoord.GCKinds()), out)
	}
	return r
}

// `pgcoord gc` collects old rows of every kind through pgcoord.GC: a table by default, JSON
// with --json, nothing deleted with --dry-run, and --older-than chooses the retention.
func TestGC(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	clock := pgtest.NewClock(t, d.pool)
	clock.Freeze(clock.Now().Truncate(time.Second))
	exec := func(sql string) {
		t.Helper()
		if _, err := d.pool.Exec(t.Context(), sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	// Three released leases and an expired dedupe claim, 40 days ago; a released lease
	// 10 days ago.
	exec(`SELECT pgcoord_lease_release(name, holder, fence_token)
		FROM generate_series(1, 3) i, LATERAL pgcoord_lease_acquire('old:' || i, 'w', '1 minute')`)
	exec(`INSERT INTO pgcoord_dedupe (scope, key, expires_at) VALUES ('s', 'k', pgcoord_now())`)
	clock.Advance(30 * 24 * time.Hour)
	exec(`SELECT pgcoord_lease_release(name, holder, fence_token) FROM pgcoord_lease_acquire('recent', 'w', '1 minute')`)
	clock.Advance(10 * 24 * time.Hour)
	leases := func() int {
		t.Helper()
		var n int
		if err := d.pool.QueryRow(t.Context(), `SELECT count(*) FROM pgcoord_leases`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	code, out, errOut := d.run(t, "gc", "--dry-run")
	if code != cli.ExitOK || !strings.Contains(out, "WOULD DELETE") || !strings.Contains(out, "4 rows older than 30d would be deleted") ||
		!strings.Contains(out, "nothing changed") {
		t.Fatalf("gc --dry-run = %d, %q, %q", code, out, errOut)
	}
	code, out, errOut = d.run(t, "--json", "gc", "--dry-run", "--older-than", "5d")
	r := decodeGCOut(t, out)
	if code != cli.ExitOK || !r.DryRun || r.Deleted != 0 || r.WouldDelete == nil || *r.WouldDelete != 5 || r.OlderThanSeconds != 5*86400 ||
		r.Kinds[0].Kind != "leases" || r.Kinds[0].WouldDelete == nil || *r.Kinds[0].WouldDelete != 4 {
		t.Fatalf("gc --json --dry-run --older-than 5d = %d, %q, %q; want 4 leases and 5 rows in all", code, out, errOut)
	}
	if n := leases(); n != 4 {
		t.Fatalf("a dry run deleted leases: %d left of 4", n)
	}

	code, out, errOut = d.run(t, "gc", "--batch", "2")
	if code != cli.ExitOK || !strings.Contains(out, "deleted 4 rows older than 30d") {
		t.Fatalf("gc = %d, %q, %q", code, out, errOut)
	}
	for _, line := range []string{"KIND", "leases", "dedupe", "inbox"} {
		if !strings.Contains(out, "\n"+line) && !strings.HasPrefix(out, line) {
			t.Errorf("gc's table has no line %q: %q", line, out)
		}
	}
	if errOut != "" {
		t.Errorf("progress on stderr although it is not a terminal: %q", errOut)
	}
	if n := leases(); n != 1 {
		t.Fatalf("%d leases left, want the recent one", n)
	}

	code, out, errOut = d.run(t, "--json", "gc", "--older-than", "1d")
	r = decodeGCOut(t, out)
	if code != cli.ExitOK || r.DryRun || r.Deleted != 1 || r.WouldDelete != nil || r.Kinds[0].Deleted != 1 || r.Kinds[0].WouldDelete != nil {
		t.Fatalf("gc --json --older-than 1d = %d, %q, %q; want the recent lease deleted", code, out, errOut)
	}
	code, out, _ = d.run(t, "--json", "gc")
	if r := decodeGCOut(t, out); code != cli.ExitOK || r.Deleted != 0 {
		t.Fatalf("a second gc = %d, %q", code, out)
	}
}

func TestGCUsageErrors(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"gc", "--older-than", "-1s"},
		{"gc", "--older-than", "-30d"},
		{"gc", "--older-than", "0"},
		{"gc", "--older-than", "500ms"},
		{"gc", "--older-than", "36501d"},
		{"gc", "--older-than", "soon"},
		{"gc", "--older-than", "1d-1h"},
		{"gc", "--batch", "0"},
		{"gc", "--batch", "100001"},
		{"gc", "extra"},
		{"gc", "--bogus"},
	} {
		// No database is needed: usage errors are found before connecting.
		code, _, errOut := run(t, append([]string{"--database-url", "postgres://nobody@127.0.0.1:1/none"}, args...)...)
		if code != cli.ExitUsage {
			t.Errorf("%v: exit %d, want %d (stderr %q)", args, code, cli.ExitUsage, errOut)
		}
	}
}

// A negative --statement-timeout is a usage error (it would silently disable the timeout),
// whatever the command; 0 disables it on purpose.
func TestStatementTimeoutNegative(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"--statement-timeout", "-1s", "leases", "list"},
		{"--statement-timeout=-1ms", "gc"},
		{"migrate", "status", "--statement-timeout", "-5m"},
	} {
		code, _, errOut := run(t, append([]string{"--database-url", "postgres://nobody@127.0.0.1:1/none"}, args...)...)
		if code != cli.ExitUsage || !strings.Contains(errOut, "--statement-timeout") {
			t.Errorf("%v: exit %d, stderr %q; want exit %d naming --statement-timeout", args, code, errOut, cli.ExitUsage)
		}
	}
	d := newTestDB(t)
	if code, out, errOut := d.run(t, "--statement-timeout", "0", "leases", "list"); code != cli.ExitOK {
		t.Fatalf("--statement-timeout 0: exit %d, %q, %q", code, out, errOut)
	}
}

// `pgcoord --help` lists gc.
func TestGCInHelp(t *testing.T) {
	t.Parallel()
	code, out, _ := run(t, "--help")
	if code != cli.ExitOK || !strings.Contains(out, "\n  gc ") {
		t.Fatalf("pgcoord --help = %d, %q: want gc among the commands", code, out)
	}
}
