package cli_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/pgcoord/pgcoord/internal/cli"
)

func TestJobsCheckHealthy(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	setUpJobs(t, d.pool, "fresh")
	code, out, errOut := d.run(t, "jobs", "check")
	if code != cli.ExitOK || !strings.Contains(out, "all 1 jobs healthy") || errOut != "" {
		t.Fatalf("jobs check on a job that just succeeded = %d, %q, %q; want exit 0", code, out, errOut)
	}
}

func TestJobsCheckOverdue(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	setUpJobs(t, d.pool, "fresh", "stale")
	code, out, errOut := d.run(t, "jobs", "check")
	if code != cli.ExitCheck {
		t.Fatalf("jobs check with a job last successful 2h ago (every 1m) = %d, %q, %q; want exit 3", code, out, errOut)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 1 || !strings.HasPrefix(lines[0], "OVERDUE stale: no success for 1h59m") ||
		!strings.Contains(lines[0], "runs every 1m, allowed staleness 5m") || !strings.Contains(lines[0], "ticks missed") {
		t.Fatalf("jobs check printed %q; want one line for stale, saying why", out)
	}
	if !strings.Contains(errOut, "1 of 2 jobs need attention") {
		t.Errorf("stderr %q", errOut)
	}
	// A staleness allowance of 3h makes it fine.
	if code, out, errOut := d.run(t, "jobs", "check", "--max-staleness", "3h"); code != cli.ExitOK {
		t.Fatalf("jobs check --max-staleness 3h = %d, %q, %q; want exit 0", code, out, errOut)
	}
	// Checking only the fresh job passes.
	if code, out, errOut := d.run(t, "jobs", "check", "--job", "fresh"); code != cli.ExitOK {
		t.Fatalf("jobs check --job fresh = %d, %q, %q; want exit 0", code, out, errOut)
	}
}

func TestJobsCheckFailingStuckAndMissing(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	setUpJobs(t, d.pool, "broken", "fresh", "stuck")
	code, out, errOut := d.run(t, "jobs", "check")
	if code != cli.ExitCheck {
		t.Fatalf("jobs check = %d, %q, %q; want exit 3", code, out, errOut)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2 ||
		!strings.HasPrefix(lines[0], "FAILING broken: last run failed") || !strings.Contains(lines[0], "smtp: connection refused retry later") ||
		// (The first tick is 2h before the minute setUpJobs ran in: 2h1m ago once the
		// minute has turned.)
		!(strings.HasPrefix(lines[1], "OVERDUE stuck: never succeeded; first tick 2h0m ago") ||
			strings.HasPrefix(lines[1], "OVERDUE stuck: never succeeded; first tick 2h1m ago")) {
		t.Fatalf("jobs check printed:\n%s", out)
	}
	if !strings.Contains(errOut, "2 of 3 jobs need attention") {
		t.Errorf("stderr %q", errOut)
	}

	// --json: every job checked, with its status and problems.
	code, out, _ = d.run(t, "--json", "jobs", "check")
	var checked []struct {
		Name     string   `json:"name"`
		Status   string   `json:"status"`
		Problems []string `json:"problems"`
	}
	if err := json.Unmarshal([]byte(out), &checked); err != nil || code != cli.ExitCheck || len(checked) != 3 {
		t.Fatalf("jobs check --json = %d, %q (%v)", code, out, err)
	}
	for i, want := range []string{"failing", "ok", "overdue"} {
		if checked[i].Status != want || (want == "ok") != (len(checked[i].Problems) == 0) || checked[i].Problems == nil {
			t.Errorf("job %d: %+v, want status %s", i, checked[i], want)
		}
	}

	// A job named with --job that never ran is a failure.
	code, out, _ = d.run(t, "jobs", "check", "--job", "fresh", "--job", "weekly-report")
	if code != cli.ExitCheck || !strings.HasPrefix(out, "MISSING weekly-report: ") || strings.Contains(out, "fresh") {
		t.Fatalf("jobs check --job for a job that never ran = %d, %q; want exit 3 naming it", code, out)
	}
}

func TestJobsCheckNoJobs(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	code, out, errOut := d.run(t, "jobs", "check")
	if code != cli.ExitOK || out != "" || !strings.Contains(errOut, "no jobs") {
		t.Fatalf("jobs check with no jobs = %d, %q, %q; want exit 0 with a note", code, out, errOut)
	}
	code, out, _ = d.run(t, "--json", "jobs", "check")
	if code != cli.ExitOK || strings.TrimSpace(out) != "[]" {
		t.Fatalf("jobs check --json with no jobs = %d, %q; want []", code, out)
	}
	code, out, _ = d.run(t, "--json", "jobs", "list")
	if code != cli.ExitOK || strings.TrimSpace(out) != "[]" {
		t.Fatalf("jobs list --json with no jobs = %d, %q; want []", code, out)
	}
	code, out, _ = d.run(t, "jobs", "list")
	if code != cli.ExitOK || !strings.HasPrefix(out, "JOB") || strings.Count(out, "\n") != 1 {
		t.Fatalf("jobs list with no jobs = %d, %q; want the header alone", code, out)
	}
}
