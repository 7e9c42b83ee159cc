package cli_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

func TestDoctor(t *testing.T) {
	t.Parallel()
	db := newTestDB(t)

	code, out, errOut := db.run(t, "doctor")
	if code != 0 {
		t.Fatalf("doctor on a fresh schema: exit %d\n%s%s", code, out, errOut)
	}
	for _, check := range []string{"schema", "notify", "clock", "transactions", "replication", "leases", "semaphores", "jobs",
		"idempotency", "outbox"} {
		if !strings.Contains(out, " "+check+" ") {
			t.Errorf("the report lacks the %s check:\n%s", check, out)
		}
	}

	// A leaked permit needs attention: exit 3, and --json says which check and why.
	semGrant(t, db.pool, "tenant-7", "w1", 1, time.Second, time.Now().Add(-time.Hour))
	code, out, errOut = db.run(t, "doctor", "--json")
	if code != 3 || !strings.Contains(errOut, "attention") {
		t.Fatalf("doctor with a leaked permit: exit %d, stderr %q; want 3", code, errOut)
	}
	var findings []struct {
		Check, Status, Summary, Explain string
	}
	if err := json.Unmarshal([]byte(out), &findings); err != nil {
		t.Fatalf("--json: %v\n%s", err, out)
	}
	var semaphores int
	for _, f := range findings {
		if f.Check == "semaphores" {
			semaphores++
			if f.Status != "attention" || !strings.Contains(f.Summary, "tenant-7") || f.Explain == "" {
				t.Errorf("semaphores finding %+v", f)
			}
		}
	}
	if semaphores != 1 {
		t.Errorf("%d semaphores findings in %s", semaphores, out)
	}
}

func TestDoctorBadFlags(t *testing.T) {
	t.Parallel()
	for _, flag := range []string{"--long-transaction=0s", "--max-staleness=-1s", "--notify-timeout=0s", "--outbox-lag=0s"} {
		code, _, errOut := run(t, "--database-url", "postgres://nobody@127.0.0.1:1/none", "doctor", flag)
		if code != 2 || !strings.Contains(errOut, strings.SplitN(flag, "=", 2)[0]) {
			t.Errorf("doctor %s: exit %d, %q; want 2 naming the flag", flag, code, errOut)
		}
	}
}
