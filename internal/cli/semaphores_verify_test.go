package cli_test

import (
	"encoding/json"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/pgcoord/pgcoord/internal/cli"
	"github.com/pgcoord/pgcoord/semaphore"
)

// verify: exit 0 when every key is healthy, 3 with a key over its limit or holding permits
// past expiry, saying which.
func TestSemaphoresVerify(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	code, out, errOut := d.run(t, "semaphores", "verify")
	if code != cli.ExitOK || !strings.Contains(out, "all 0 semaphore keys healthy") {
		t.Fatalf("verify with no keys = %d, stdout %q, stderr %q", code, out, errOut)
	}
	code, out, _ = d.run(t, "--json", "semaphores", "verify")
	if code != cli.ExitOK || strings.TrimSpace(out) != "[]" {
		t.Fatalf("verify --json with no keys = %d, %q; want []", code, out)
	}

	semGrant(t, d.pool, "healthy", "a", 2, time.Minute, time.Time{})
	semGrant(t, d.pool, "healthy", "b", 2, time.Minute, time.Time{})
	if code, out, errOut = d.run(t, "semaphores", "verify"); code != cli.ExitOK || !strings.Contains(out, "all 1 semaphore keys healthy") {
		t.Fatalf("verify of a full, healthy key = %d, stdout %q, stderr %q", code, out, errOut)
	}

	// A permit whose holder died an hour ago and that nobody reclaimed.
	semGrant(t, d.pool, "leaky", "dead", 2, time.Second, time.Now().Add(-time.Hour))
	code, out, errOut = d.run(t, "semaphores", "verify")
	if code != cli.ExitCheck || !strings.Contains(out, "LEAKED leaky: 1 permit(s) past expiry") || strings.Contains(out, "healthy") ||
		!strings.Contains(errOut, "1 of 2 semaphore keys need attention") {
		t.Fatalf("verify with a leaked permit = %d, stdout %q, stderr %q", code, out, errOut)
	}

	// A key over its lowered limit.
	lowered := semGrant(t, d.pool, "lowered", "a", 3, time.Minute, time.Time{})
	semGrant(t, d.pool, "lowered", "b", 3, time.Minute, time.Time{})
	if err := semaphore.SetLimit(t.Context(), d.pool, "lowered", 1, nil); err != nil {
		t.Fatal(err)
	}
	code, out, errOut = d.run(t, "semaphores", "verify")
	if code != cli.ExitCheck || !strings.Contains(out, "OVER-LIMIT lowered: holds 2 permits, more than its limit of 1") ||
		!strings.Contains(out, "expected right after the limit was lowered") || !strings.Contains(errOut, "2 of 3") {
		t.Fatalf("verify with a key over its limit = %d, stdout %q, stderr %q", code, out, errOut)
	}

	code, out, _ = d.run(t, "--json", "semaphores", "verify")
	var raw []map[string]any
	if code != cli.ExitCheck || json.Unmarshal([]byte(out), &raw) != nil || len(raw) != 3 {
		t.Fatalf("verify --json = %d, %q", code, out)
	}
	for _, m := range raw {
		semCheckKeys(t, "verify object", m, []string{"expired", "held", "key", "leaked", "limit", "over_limit", "problems", "status"})
	}
	status := map[string]string{}
	for _, m := range raw {
		status[m["key"].(string)] = m["status"].(string)
	}
	if want := map[string]string{"healthy": "ok", "leaky": "leaked", "lowered": "over_limit"}; !maps.Equal(status, want) {
		t.Errorf("verify --json statuses %v, want %v", status, want)
	}

	// Once the permits drain, the key is healthy again; the leaked permit is reclaimed by the
	// next admission to its key.
	if err := semaphore.Release(t.Context(), d.pool, lowered); err != nil {
		t.Fatal(err)
	}
	if err := semaphore.Release(t.Context(), d.pool, semGrant(t, d.pool, "leaky", "next", 2, time.Minute, time.Time{})); err != nil {
		t.Fatal(err)
	}
	if code, out, errOut = d.run(t, "semaphores", "verify"); code != cli.ExitOK {
		t.Fatalf("verify after draining = %d, stdout %q, stderr %q", code, out, errOut)
	}
}
