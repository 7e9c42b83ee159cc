package cli_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/pgcoord/pgcoord/internal/cli"
	"github.com/pgcoord/pgcoord/ratelimit"
)

// The operator's round: create a policy, see it, watch a key, reset it, turn shadow mode
// on, delete it; every change is in the audit log.
func TestRatelimitCommands(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	code, out, errOut := d.run(t, "ratelimit", "set", "api", "--rate", "10", "--period", "1h", "--burst", "3")
	if code != cli.ExitOK || !strings.Contains(out, `policy "api": 10 per 1h, burst 3, enforce (one unit every 6m0s)`) {
		t.Fatalf("set = %d, %q, %q", code, out, errOut)
	}
	for range 2 {
		if dec, err := ratelimit.Allow(t.Context(), d.pool, 1, []ratelimit.Limit{{Policy: "api", Key: "k1"}}, nil); err != nil || !dec.Allowed {
			t.Fatalf("Allow: %+v, %v", dec, err)
		}
	}
	code, out, _ = d.run(t, "--json", "ratelimit", "get", "api", "k1")
	var st struct {
		Remaining  int64   `json:"remaining"`
		ResetAfter float64 `json:"reset_after_seconds"`
	}
	if err := json.Unmarshal([]byte(out), &st); code != cli.ExitOK || err != nil || st.Remaining != 1 ||
		st.ResetAfter <= (11*time.Minute).Seconds() || st.ResetAfter > (12*time.Minute).Seconds() {
		t.Fatalf("get api k1 --json = %d, %q (%v)", code, out, err)
	}
	code, out, _ = d.run(t, "ratelimit", "reset", "api", "k1")
	if code != cli.ExitOK || !strings.Contains(out, "a full burst again") {
		t.Fatalf("reset = %d, %q", code, out)
	}
	code, out, _ = d.run(t, "ratelimit", "get", "api", "k1")
	if code != cli.ExitOK || !strings.Contains(out, "remaining:    3") {
		t.Fatalf("get after reset = %d, %q", code, out)
	}
	code, out, _ = d.run(t, "ratelimit", "set", "api", "--rate", "10", "--period", "1h", "--burst", "3", "--shadow")
	if code != cli.ExitOK || !strings.Contains(out, "shadow") {
		t.Fatalf("set --shadow = %d, %q", code, out)
	}
	code, out, _ = d.run(t, "ratelimit", "list")
	if code != cli.ExitOK || !strings.Contains(out, "api") || !strings.Contains(out, "10/1h") || !strings.Contains(out, "shadow") {
		t.Fatalf("list = %d, %q", code, out)
	}
	code, out, _ = d.run(t, "ratelimit", "delete", "api")
	if code != cli.ExitOK || !strings.Contains(out, "deleted") {
		t.Fatalf("delete = %d, %q", code, out)
	}
	if code, _, errOut = d.run(t, "ratelimit", "delete", "api"); code != cli.ExitFailure || !strings.Contains(errOut, "no such policy") {
		t.Fatalf("delete again = %d, %q", code, errOut)
	}
	if code, _, errOut = d.run(t, "ratelimit", "get", "api"); code != cli.ExitFailure || !strings.Contains(errOut, "no such policy") {
		t.Fatalf("get of a deleted policy = %d, %q", code, errOut)
	}
	// An unlogged policy says so, and its mode cannot change.
	code, out, _ = d.run(t, "ratelimit", "set", "fast", "--rate", "1", "--period", "1s", "--burst", "1", "--unlogged")
	if code != cli.ExitOK || !strings.Contains(out, "enforce, unlogged") {
		t.Fatalf("set --unlogged = %d, %q", code, out)
	}
	if code, _, errOut = d.run(t, "ratelimit", "set", "fast", "--rate", "1", "--period", "1s", "--burst", "1"); code == cli.ExitOK || !strings.Contains(errOut, "unlogged") {
		t.Fatalf("making an unlogged policy durable = %d, %q", code, errOut)
	}
	code, out, _ = d.run(t, "ratelimit", "get", "fast", "--json")
	if code != cli.ExitOK || !strings.Contains(out, `"unlogged": true`) {
		t.Fatalf("get --json of an unlogged policy = %d, %q", code, out)
	}
	var actions []string
	rows, err := d.pool.Query(t.Context(), `SELECT action FROM pgcoord_audit ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var a string
		if err := rows.Scan(&a); err != nil {
			t.Fatal(err)
		}
		actions = append(actions, a)
	}
	if got, want := strings.Join(actions, " "), "ratelimit.set ratelimit.reset ratelimit.set ratelimit.delete ratelimit.set"; got != want {
		t.Fatalf("audit = %q, want %q", got, want)
	}
}

func TestRatelimitUsageErrors(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"ratelimit", "set", "api", "--rate", "10", "--period", "1s"},
		{"ratelimit", "set", "api", "--rate", "0", "--period", "1s", "--burst", "1"},
		{"ratelimit", "set", "api", "--rate", "1", "--period", "0s", "--burst", "1"},
		{"ratelimit", "set", "api", "--rate", "1", "--period", "1500ns", "--burst", "1"},
		{"ratelimit", "set", "api", "--rate", "1", "--period", "1s", "--burst", "0"},
		{"ratelimit", "get"},
		{"ratelimit", "get", "a", "b", "c"},
		{"ratelimit", "reset", "api"},
		{"ratelimit", "bogus"},
	} {
		code, _, errOut := run(t, append([]string{"--database-url", "postgres://nobody@127.0.0.1:1/none"}, args...)...)
		if code != cli.ExitUsage {
			t.Errorf("%v: exit %d, want %d (stderr %q)", args, code, cli.ExitUsage, errOut)
		}
	}
}
