package cli_test

import (
	"encoding/json"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/pgcoord/pgcoord/internal/cli"
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
	want := []string{"action", "actor", "at", "details", "id", "remote_addr", "target"}
	if keys := slices.Sorted(maps.Keys(got[0])); !slices.Equal(keys, want) {
		t.Fatalf("keys %v, want %v", keys, want)
	}
	if got[1]["details"].(map[string]any)["fence_token"] != float64(3) || got[0]["at"] == nil {
		t.Fatalf("entry %v", got[1])
	}

	code, out, _ = d.run(t, "audit", "list", "--action", "lease.expire")
	if code != cli.ExitOK || !strings.Contains(out, "ACTOR") || !strings.Contains(out, "order:1") ||
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
