package cli_test

import (
	"encoding/json"
	"errors"
	"maps"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/internal/cli"
	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/singleton"
)

// claimTick claims the tick of job current at now (the database clock when zero).
func claimTick(t *testing.T, pool *pgxpool.Pool, job singleton.Job, now time.Time) singleton.Run {
	t.Helper()
	var run singleton.Run
	var err error
	pgtest.At(t, pool, now, func() {
		run, err = singleton.ClaimTick(t.Context(), pool, job, &singleton.ClaimOpts{Holder: "worker-1"})
	})
	if err != nil {
		t.Fatalf("claim %s at %v: %v", job.Name, now, err)
	}
	return run
}

// finishTick records run's outcome now.
func finishTick(t *testing.T, pool *pgxpool.Pool, run singleton.Run, runErr error) {
	t.Helper()
	if err := singleton.FinishTick(t.Context(), pool, run, runErr); err != nil {
		t.Fatalf("finish %s: %v", run.Job, err)
	}
}

// finishTickAt records run's success as of at.
func finishTickAt(t *testing.T, pool *pgxpool.Pool, run singleton.Run, at time.Time) {
	t.Helper()
	pgtest.At(t, pool, at, func() { finishTick(t, pool, run, nil) })
}

var minutely = singleton.Job{Every: time.Minute, TTL: 10 * time.Second}

// job returns minutely under another name.
func job(name string) singleton.Job {
	j := minutely
	j.Name = name
	return j
}

// fresh: succeeded just now. stale: last success two hours ago. broken: the last run failed.
// stuck: claimed two hours ago, never finished.
func setUpJobs(t *testing.T, pool *pgxpool.Pool, names ...string) {
	t.Helper()
	twoHoursAgo := time.Now().Add(-2 * time.Hour)
	for _, name := range names {
		switch name {
		case "fresh":
			finishTick(t, pool, claimTick(t, pool, job(name), time.Now()), nil)
		case "stale":
			// A minute after its tick: the age shows as 1h59m for a minute (a loaded machine
			// may take seconds between this and the listing).
			finishTickAt(t, pool, claimTick(t, pool, job(name), twoHoursAgo), twoHoursAgo.Add(time.Minute))
		case "broken":
			finishTick(t, pool, claimTick(t, pool, job(name), time.Time{}), errors.New("smtp: connection refused\nretry later"))
		case "stuck":
			claimTick(t, pool, job(name), twoHoursAgo)
		default:
			t.Fatalf("no recipe for job %q", name)
		}
	}
}

var jobKeys = []string{"consecutive_failures", "cron", "db_now", "every_ms", "failing", "fence_token", "first_tick",
	"kind", "last_error", "last_failure_at", "last_started_at", "last_state", "last_success_at", "missed_ticks",
	"name", "next_tick", "origin", "overdue", "overlap", "problems", "running", "status"}

type listedJob struct {
	Name                string   `json:"name"`
	EveryMS             int64    `json:"every_ms"`
	Status              string   `json:"status"`
	Overdue             bool     `json:"overdue"`
	Failing             bool     `json:"failing"`
	Problems            []string `json:"problems"`
	LastSuccessAt       *string  `json:"last_success_at"`
	LastFailureAt       *string  `json:"last_failure_at"`
	LastError           *string  `json:"last_error"`
	ConsecutiveFailures int      `json:"consecutive_failures"`
	LastState           *string  `json:"last_state"`
	Running             int      `json:"running"`
	MissedTicks         int64    `json:"missed_ticks"`
	NextTick            *string  `json:"next_tick"`
	DBNow               *string  `json:"db_now"`
}

func TestJobsList(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	setUpJobs(t, d.pool, "stale", "broken", "fresh", "stuck")
	// A run in progress.
	claimTick(t, d.pool, singleton.Job{Name: "running", Every: time.Hour, TTL: time.Minute}, time.Time{})

	code, out, errOut := d.run(t, "--json", "jobs", "list")
	if code != cli.ExitOK {
		t.Fatalf("jobs list --json = %d, %s", code, errOut)
	}
	var raw []map[string]any
	if err := json.Unmarshal([]byte(out), &raw); err != nil {
		t.Fatal(err)
	}
	for _, m := range raw {
		if keys := slices.Sorted(maps.Keys(m)); !slices.Equal(keys, jobKeys) {
			t.Fatalf("job object has keys %v, want %v", keys, jobKeys)
		}
	}
	var jobs []listedJob
	if err := json.Unmarshal([]byte(out), &jobs); err != nil {
		t.Fatal(err)
	}
	if len(jobs) != 5 {
		t.Fatalf("listed %d jobs, want 5: %s", len(jobs), out)
	}
	byName := map[string]listedJob{}
	for _, j := range jobs {
		byName[j.Name] = j
		if j.DBNow == nil || j.NextTick == nil || !strings.HasSuffix(*j.NextTick, "Z") || j.Problems == nil {
			t.Errorf("%s: %+v", j.Name, j)
		}
	}
	if names := slices.Collect(maps.Keys(byName)); len(names) != 5 || jobs[0].Name != "broken" || jobs[4].Name != "stuck" {
		t.Errorf("jobs not in name order: %v", jobs)
	}
	if j := byName["fresh"]; j.Status != "ok" || j.EveryMS != 60000 || j.LastSuccessAt == nil || j.LastFailureAt != nil ||
		j.LastError != nil || j.ConsecutiveFailures != 0 || j.LastState == nil || *j.LastState != "succeeded" || len(j.Problems) != 0 {
		t.Errorf("fresh: %+v", j)
	}
	if j := byName["stale"]; j.Status != "overdue" || !j.Overdue || j.Failing || j.MissedTicks < 100 {
		t.Errorf("stale: %+v; want overdue with about 120 ticks missed", j)
	}
	if j := byName["broken"]; j.Status != "failing" || !j.Failing || j.LastSuccessAt != nil || j.LastFailureAt == nil ||
		j.LastError == nil || !strings.HasPrefix(*j.LastError, "smtp: connection refused") || j.ConsecutiveFailures != 1 {
		t.Errorf("broken: %+v", j)
	}
	if j := byName["stuck"]; j.Status != "overdue" || j.LastSuccessAt != nil || j.Running != 0 || j.LastState == nil || *j.LastState != "running" {
		t.Errorf("stuck: %+v; want overdue, its run's lease long expired", j)
	}
	if j := byName["running"]; j.Status != "ok" || j.Running != 1 {
		t.Errorf("running: %+v; want ok with one run in progress", j)
	}

	code, out, _ = d.run(t, "jobs", "list")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if code != cli.ExitOK || len(lines) != 6 ||
		strings.Join(strings.Fields(lines[0]), " ") != "JOB SCHEDULE LAST SUCCESS LAST FAILURE FAILS MISSED RUNNING NEXT TICK STATUS" {
		t.Fatalf("jobs list printed:\n%s", out)
	}
	rows := map[string][]string{}
	for _, l := range lines[1:] {
		f := strings.Fields(l)
		rows[f[0]] = f
	}
	// JOB SCHEDULE SUCCESS [ago] FAILURE [ago] FAILS MISSED RUNNING NEXT STATUS; "Ns" is an age
	// in seconds, which depends on how long the machine took since the runs finished, and
	// "*" a count of missed ticks, 0 or 1 as the listing falls before or after the next tick.
	for name, want := range map[string][]string{
		"broken":  {"broken", "1m", "-", "Ns", "ago", "1"},
		"fresh":   {"fresh", "1m", "Ns", "ago", "-", "0", "*", "0"},
		"running": {"running", "1h", "-", "-", "0", "*", "1"},
		"stale":   {"stale", "1m", "1h59m", "ago", "-", "0"},
		"stuck":   {"stuck", "1m", "-", "-", "0"},
	} {
		f := rows[name]
		if len(f) < len(want) || !slices.EqualFunc(f[:len(want)], want, func(got, w string) bool {
			return got == w || w == "Ns" && secondsAge.MatchString(got) || w == "*" && (got == "0" || got == "1")
		}) {
			t.Errorf("row %v, want it to start with %v", f, want)
		}
	}
	for name, status := range map[string]string{"broken": "failing", "fresh": "ok", "running": "ok", "stale": "overdue", "stuck": "overdue"} {
		if f := rows[name]; len(f) == 0 || f[len(f)-1] != status {
			t.Errorf("row %v, want status %s", f, status)
		}
	}
}

// secondsAge is an age under a minute as the tables print it.
var secondsAge = regexp.MustCompile(`^[0-9]{1,2}s$`)

type listedRun struct {
	Job          string  `json:"job"`
	ScheduledFor *string `json:"scheduled_for"`
	State        string  `json:"state"`
	FenceToken   int64   `json:"fence_token"`
	Attempt      int     `json:"attempt"`
	Holder       string  `json:"holder"`
	StartedAt    *string `json:"started_at"`
	ExpiresAt    *string `json:"expires_at"`
	FinishedAt   *string `json:"finished_at"`
	DurationMS   *int64  `json:"duration_ms"`
	Error        *string `json:"error"`
}

var runKeys = []string{"attempt", "duration_ms", "error", "expires_at", "fence_token", "finished_at", "holder",
	"job", "scheduled_for", "started_at", "state"}

func TestJobsRuns(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	base := time.Now().Add(-time.Hour).Truncate(time.Minute)
	j := job("report")
	first := claimTick(t, d.pool, j, base.Add(5*time.Second))
	finishTick(t, d.pool, first, nil)
	second := claimTick(t, d.pool, j, base.Add(time.Minute+5*time.Second))
	finishTick(t, d.pool, second, errors.New("boom"))
	third := claimTick(t, d.pool, j, base.Add(2*time.Minute+5*time.Second))
	if !(first.Token < second.Token && second.Token < third.Token) {
		t.Fatalf("run tokens %d, %d, %d: not increasing", first.Token, second.Token, third.Token)
	}
	setUpJobs(t, d.pool, "fresh") // another job's runs are not listed

	code, out, errOut := d.run(t, "--json", "jobs", "runs", "report")
	if code != cli.ExitOK {
		t.Fatalf("jobs runs --json = %d, %s", code, errOut)
	}
	var raw []map[string]any
	if err := json.Unmarshal([]byte(out), &raw); err != nil {
		t.Fatal(err)
	}
	for _, m := range raw {
		if keys := slices.Sorted(maps.Keys(m)); !slices.Equal(keys, runKeys) {
			t.Fatalf("run object has keys %v, want %v", keys, runKeys)
		}
	}
	var runs []listedRun
	if err := json.Unmarshal([]byte(out), &runs); err != nil {
		t.Fatal(err)
	}
	if len(runs) != 3 {
		t.Fatalf("%d runs, want 3: %s", len(runs), out)
	}
	for i, want := range []struct {
		state string
		token int64
		tick  time.Time
	}{{"running", third.Token, base.Add(2 * time.Minute)}, {"failed", second.Token, base.Add(time.Minute)}, {"succeeded", first.Token, base}} {
		r := runs[i]
		if r.Job != "report" || r.State != want.state || r.FenceToken != want.token || r.Attempt != 1 || r.Holder != "worker-1" ||
			parseTime(t, r.ScheduledFor) != want.tick.UTC() {
			t.Errorf("run %d = %+v, want %s with token %d for %v (newest first)", i, r, want.state, want.token, want.tick)
		}
	}
	if r := runs[0]; r.FinishedAt != nil || r.DurationMS != nil || r.Error != nil || r.ExpiresAt == nil {
		t.Errorf("running run: %+v", r)
	}
	if r := runs[1]; r.Error == nil || *r.Error != "boom" || r.FinishedAt == nil || r.DurationMS == nil {
		t.Errorf("failed run: %+v", r)
	}

	code, out, _ = d.run(t, "jobs", "runs", "report", "--limit", "2")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if code != cli.ExitOK || len(lines) != 3 ||
		strings.Join(strings.Fields(lines[0]), " ") != "SCHEDULED FOR STATE ATTEMPT TOKEN HOLDER STARTED DURATION ERROR" {
		t.Fatalf("jobs runs --limit 2 printed:\n%s", out)
	}
	if f := strings.Fields(lines[1]); f[1] != "running" || f[6] != "-" || f[7] != "-" {
		t.Errorf("row %v", f)
	}
	if f := strings.Fields(lines[2]); f[1] != "failed" || f[len(f)-1] != "boom" {
		t.Errorf("row %v", f)
	}

	code, _, errOut = d.run(t, "jobs", "runs", "nightly")
	if code != cli.ExitFailure || !strings.Contains(errOut, `no such job "nightly"`) {
		t.Fatalf("jobs runs of an unknown job = %d, %q; want exit 1", code, errOut)
	}
}

func TestJobsUsageErrors(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"jobs", "list", "extra"},
		{"jobs", "list", "--max-staleness", "-1m"},
		{"jobs", "check", "--max-staleness", "soon"},
		{"jobs", "check", "--max-staleness", "-5s"},
		{"jobs", "check", "--job", ""},
		{"jobs", "check", "extra"},
		{"jobs", "runs"},
		{"jobs", "runs", "a", "b"},
		{"jobs", "runs", "report", "--limit", "0"},
		{"jobs", "runs", "report", "--limit", "10001"},
		{"jobs", "runs", strings.Repeat("j", 256)},
		{"jobs", "bogus"},
	} {
		code, _, errOut := run(t, append([]string{"--database-url", "postgres://nobody@127.0.0.1:1/none"}, args...)...)
		if code != cli.ExitUsage {
			t.Errorf("%v: exit %d, want %d (stderr %q)", args, code, cli.ExitUsage, errOut)
		}
	}
}
