package cli_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/pgcoord/pgcoord/internal/cli"
)

// scheduleOut is the part of a schedule's --json the tests read.
type scheduleOut struct {
	Name      string  `json:"name"`
	Expr      string  `json:"expr"`
	Zone      string  `json:"zone"`
	Overlap   string  `json:"overlap"`
	Version   int64   `json:"version"`
	State     string  `json:"state"`
	NextTick  *string `json:"next_tick"`
	UpdatedBy string  `json:"updated_by"`
	NextTicks []struct {
		Local string `json:"local"`
		UTC   string `json:"utc"`
	} `json:"next_ticks"`
}

// scheduleJSON runs a schedules command with --json and parses the schedule it prints.
func scheduleJSON(t *testing.T, d testDB, args ...string) scheduleOut {
	t.Helper()
	code, out, errOut := d.run(t, append([]string{"--json", "schedules"}, args...)...)
	var s scheduleOut
	if err := json.Unmarshal([]byte(out), &s); code != cli.ExitOK || err != nil {
		t.Fatalf("exit %d, %q, %q (%v)", code, out, errOut, err)
	}
	return s
}

// The operator's round: create a schedule, list it, read its next ticks in both zones,
// change it, pause and resume it, trigger and backfill runs, delete it; every change is in
// the audit log under the actor.
func TestScheduleCommands(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	code, out, errOut := d.run(t, "--actor", "alice", "schedules", "create", "report", "--expr", "0 9 * * MON-FRI",
		"--zone", "Europe/Berlin", "--handler", "report", "--args", `{"kind":"weekly"}`, "--overlap", "buffer")
	if code != cli.ExitOK || !strings.Contains(out, `schedule "report" created`) || !strings.Contains(out, "version 1") {
		t.Fatalf("create = %d, %q, %q", code, out, errOut)
	}
	code, out, _ = d.run(t, "schedules", "ls")
	if code != cli.ExitOK || !strings.Contains(out, "NAME") || !strings.Contains(out, "0 9 * * MON-FRI") ||
		!strings.Contains(out, "Europe/Berlin") || !strings.Contains(out, "active") || !strings.Contains(out, ":00:00Z)") {
		t.Fatalf("ls = %d, %q", code, out)
	}
	if code, out, _ = d.run(t, "schedules", "ls", "--prefix", "nope"); code != cli.ExitOK || !strings.Contains(out, "no schedules") {
		t.Fatalf("ls --prefix nope = %d, %q", code, out)
	}
	var list []scheduleOut
	code, out, _ = d.run(t, "--json", "schedules", "list", "--limit", "5")
	if err := json.Unmarshal([]byte(out), &list); code != cli.ExitOK || err != nil || len(list) != 1 ||
		list[0].Overlap != "buffer" || list[0].NextTick == nil {
		t.Fatalf("list --json = %d, %q (%v)", code, out, err)
	}

	// get: five next ticks, each at 09:00 Berlin time on a weekday, also shown in UTC.
	code, out, errOut = d.run(t, "schedules", "get", "report")
	if code != cli.ExitOK || !strings.Contains(out, "next 5:") || strings.Contains(out, "next 6:") {
		t.Fatalf("get = %d, %q, %q", code, out, errOut)
	}
	s := scheduleJSON(t, d, "get", "report")
	if len(s.NextTicks) != 5 || s.Version != 1 || s.UpdatedBy != "alice" {
		t.Fatalf("get --json = %+v", s)
	}
	berlin, _ := time.LoadLocation("Europe/Berlin")
	for _, tk := range s.NextTicks {
		local, err1 := time.Parse(time.RFC3339, tk.Local)
		utc, err2 := time.Parse(time.RFC3339, tk.UTC)
		if err1 != nil || err2 != nil || !local.Equal(utc) || !strings.HasSuffix(tk.UTC, "Z") ||
			local.In(berlin).Hour() != 9 || local.In(berlin).Weekday() == time.Saturday || local.In(berlin).Weekday() == time.Sunday {
			t.Fatalf("next tick %+v", tk)
		}
		if !strings.Contains(out, "09:00:00 CET ("+tk.UTC+")") && !strings.Contains(out, "09:00:00 CEST ("+tk.UTC+")") {
			t.Fatalf("get does not show %s in both zones: %q", tk.UTC, out)
		}
	}

	// update changes only the flags given, and the version.
	s = scheduleJSON(t, d, "update", "report", "--expr", "30 8 * * *")
	if s.Expr != "30 8 * * *" || s.Zone != "Europe/Berlin" || s.Overlap != "buffer" || s.Version != 2 {
		t.Fatalf("update --expr = %+v", s)
	}
	if code, _, errOut = d.run(t, "schedules", "update", "report"); code != cli.ExitUsage || !strings.Contains(errOut, "nothing to change") {
		t.Fatalf("update without flags = %d, %q", code, errOut)
	}

	code, out, _ = d.run(t, "schedules", "pause", "report", "--note", "INC-1")
	if code != cli.ExitOK || !strings.Contains(out, "paused") {
		t.Fatalf("pause = %d, %q", code, out)
	}
	if code, out, _ = d.run(t, "schedules", "get", "report"); !strings.Contains(out, "INC-1") || !strings.Contains(out, "paused at") {
		t.Fatalf("get of a paused schedule = %d, %q", code, out)
	}
	if s = scheduleJSON(t, d, "resume", "report"); s.State != "active" {
		t.Fatalf("resume = %+v", s)
	}

	code, out, _ = d.run(t, "schedules", "trigger", "report")
	if code != cli.ExitOK || !strings.Contains(out, "triggered") || !strings.Contains(out, "pending") {
		t.Fatalf("trigger = %d, %q", code, out)
	}
	// Monday 5 to Friday 9 January 2026: five ticks at 08:30 Berlin time; again, none.
	backfill := []string{"schedules", "backfill", "report", "--from", "2026-01-05T00:00:00Z", "--to", "2026-01-09T23:59:59Z"}
	if code, out, errOut = d.run(t, backfill...); code != cli.ExitOK || !strings.Contains(out, "5 runs recorded") {
		t.Fatalf("backfill = %d, %q, %q", code, out, errOut)
	}
	var bf struct {
		Recorded int64 `json:"recorded"`
	}
	code, out, _ = d.run(t, append([]string{"--json"}, backfill...)...)
	if err := json.Unmarshal([]byte(out), &bf); code != cli.ExitOK || err != nil || bf.Recorded != 0 {
		t.Fatalf("backfill again = %d, %q (%v)", code, out, err)
	}

	code, out, _ = d.run(t, "schedules", "delete", "report", "--dry-run")
	if code != cli.ExitOK || !strings.Contains(out, "nothing changed") {
		t.Fatalf("delete --dry-run = %d, %q", code, out)
	}
	if code, out, _ = d.run(t, "schedules", "delete", "report"); code != cli.ExitOK || !strings.Contains(out, "deleted") {
		t.Fatalf("delete = %d, %q", code, out)
	}
	for _, verb := range [][]string{{"get", "report"}, {"delete", "report"}, {"pause", "report"}, {"update", "report", "--zone", "UTC"}} {
		if code, _, errOut = d.run(t, append([]string{"schedules"}, verb...)...); code != cli.ExitFailure || !strings.Contains(errOut, "no such schedule") {
			t.Fatalf("%v of a deleted schedule = %d, %q", verb, code, errOut)
		}
	}

	var actions []string
	rows, err := d.pool.Query(t.Context(), `SELECT action || ' by ' || actor FROM pgcoord_audit ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var a string
		if err := rows.Scan(&a); err != nil {
			t.Fatal(err)
		}
		actions = append(actions, strings.Fields(a)[0])
		if !strings.HasSuffix(a, " by alice") && !strings.Contains(a, "@") {
			t.Errorf("audit row %q: want the actor alice or the default user@host", a)
		}
	}
	want := "schedule.create schedule.update schedule.pause schedule.resume schedule.trigger schedule.backfill schedule.backfill schedule.delete"
	if got := strings.Join(actions, " "); got != want {
		t.Fatalf("audit = %q, want %q", got, want)
	}
}

// Bad definitions exit 2 with a message that says what is wrong, and write nothing.
func TestScheduleBadInput(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	create := []string{"schedules", "create", "s", "--handler", "h"}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--expr", "0 9 * * FOO"}, "column"},
		{[]string{"--expr", "61 * * * *"}, "column 1"},
		{[]string{"--expr", "0 9 * * *", "--zone", "Mars/Olympus"}, "unknown time zone"},
		{[]string{"--expr", "0 9 * * *", "--starts-at", "2027-02-01T00:00:00Z", "--ends-at", "2027-01-01T00:00:00Z"}, "is not after start"},
		{[]string{"--expr", "0 9 * * *", "--overlap", "forbid"}, "--overlap"},
		{[]string{"--expr", "0 9 * * *", "--catch-up-policy", "some"}, "--catch-up-policy"},
		{[]string{"--expr", "0 9 * * *", "--args", "{"}, "--args"},
		{[]string{"--expr", "0 9 * * *", "--starts-at", "tomorrow"}, "RFC 3339"},
		{[]string{"--expr", "0 9 * * *", "--jitter", "48h"}, "jitter"},
		{[]string{}, "--expr is required"},
	} {
		code, _, errOut := d.run(t, append(create, c.args...)...)
		if code != cli.ExitUsage || !strings.Contains(errOut, c.want) {
			t.Errorf("create %v = %d, %q; want exit %d naming %q", c.args, code, errOut, cli.ExitUsage, c.want)
		}
	}
	// update refuses the same before it writes.
	if code, _, errOut := d.run(t, "schedules", "create", "ok", "--expr", "@daily", "--handler", "h"); code != cli.ExitOK {
		t.Fatalf("create ok = %d, %q", code, errOut)
	}
	if code, _, errOut := d.run(t, "schedules", "update", "ok", "--expr", "0 25 * * *"); code != cli.ExitUsage || !strings.Contains(errOut, "column 3") {
		t.Errorf("update --expr bad = %d, %q", code, errOut)
	}
	if code, _, errOut := d.run(t, "schedules", "backfill", "ok", "--from", "2026-01-02T00:00:00Z", "--to", "2026-01-01T00:00:00Z"); code != cli.ExitUsage {
		t.Errorf("backfill of an empty range = %d, %q", code, errOut)
	}
	var n, audits int
	if err := d.pool.QueryRow(t.Context(), `SELECT (SELECT count(*) FROM pgcoord_schedules WHERE name <> 'ok'),
		(SELECT count(*) FROM pgcoord_audit WHERE action <> 'schedule.create')`).Scan(&n, &audits); err != nil {
		t.Fatal(err)
	}
	if n != 0 || audits != 0 {
		t.Fatalf("bad input wrote %d schedules and %d audit rows", n, audits)
	}
	s := scheduleJSON(t, d, "get", "ok")
	if s.Version != 1 || s.Expr != "@daily" {
		t.Fatalf("a refused update changed the schedule: %+v", s)
	}
}
