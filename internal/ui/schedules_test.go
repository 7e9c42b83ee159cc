package ui_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/internal/base"
	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/internal/ui"
	"github.com/pgcoord/pgcoord/schedules"
	"github.com/pgcoord/pgcoord/singleton"
)

// monday is a Monday 08:30 UTC (09:30 in Berlin, in winter time until the 29th).
var monday = time.Date(2026, 3, 2, 8, 30, 0, 0, time.UTC)

// seedSchedules freezes the database clock at monday and writes: weekly-report (weekdays
// at 09:00 Berlin time) with a failed triggered run, a pending trigger and a backfill of
// two ticks; nightly (02:30 New York time), paused by ops with a note.
func seedSchedules(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	ctx := t.Context()
	pgtest.NewClock(t, pool).Freeze(monday)
	for _, s := range []schedules.Schedule{
		{Name: "weekly-report", Expr: "0 9 * * MON-FRI", Zone: "Europe/Berlin", Handler: "report"},
		{Name: "nightly", Expr: "30 2 * * *", Zone: "America/New_York", Handler: "export"},
	} {
		if _, err := schedules.Create(ctx, pool, s, nil); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := schedules.Pause(ctx, pool, "nightly", "deploy freeze until Thursday", &schedules.ChangeOpts{Actor: "ops"}); err != nil {
		t.Fatal(err)
	}
	failed := runTriggered(t, pool, "weekly-report", errBoom)
	if failed.State != "failed" || failed.Error != errBoom.Error() {
		t.Fatalf("the triggered run: %+v, want failed with %v", failed, errBoom)
	}
	if _, err := schedules.Trigger(ctx, pool, "weekly-report", &schedules.ChangeOpts{Actor: "ops"}); err != nil {
		t.Fatal(err)
	}
	// Friday 27 February and Monday 2 March, 08:00 UTC.
	if n, err := schedules.Backfill(ctx, pool, "weekly-report", monday.Add(-4*24*time.Hour), monday, nil); err != nil || n != 2 {
		t.Fatalf("backfill: %d, %v; want 2 ticks", n, err)
	}
}

// runTriggered triggers a run of name, runs it with a Scheduler whose handler returns
// runErr, and returns the run once it finished.
func runTriggered(t *testing.T, pool *pgxpool.Pool, name string, runErr error) singleton.RunInfo {
	t.Helper()
	info, err := schedules.Get(t.Context(), pool, name)
	if err != nil {
		t.Fatal(err)
	}
	s, err := schedules.New(schedules.Config{Pool: pool, RunTTL: 3 * time.Second, PollInterval: 100 * time.Millisecond,
		Handlers: map[string]schedules.Handler{info.Handler: func(context.Context, schedules.Run) error { return runErr }}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("the scheduler's Run returned %v", err)
		}
	}()
	run, err := schedules.Trigger(t.Context(), pool, name, nil)
	if err != nil {
		t.Fatal(err)
	}
	var got singleton.RunInfo
	pgtest.Until(t, "the triggered run finished", func() bool {
		runs, err := singleton.ListRuns(t.Context(), pool, name, nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range runs {
			if r.ScheduledFor.Equal(run.Tick) && !r.FinishedAt.IsZero() {
				got = r
				return true
			}
		}
		return false
	})
	return got
}

// TestUISchedulesPages: the list shows each schedule's definition, state (who paused it
// and why), next tick in its zone and in UTC, outcomes and failures in a row, filtered and
// linked from the navigation and the Overview; a schedule's page shows its definition, its
// next five fire times in both zones and its runs with their causes and notes.
func TestUISchedulesPages(t *testing.T) {
	t.Parallel()
	d := newDash(t, ui.Config{})
	seedSchedules(t, d.pool)

	list := d.page(t, "/schedules")
	contains(t, "the schedules page", list,
		`<a href="/schedules" class="current" aria-current="page">Schedules</a>`,
		`<tr class="active" data-schedule="weekly-report">`, `<a href="/schedules/weekly-report">weekly-report</a>`,
		`<td><code>0 9 * * MON-FRI</code></td>`, `<td>Europe/Berlin</td>`, `<td>report</td>`, `<span class="badge ok">active</span>`,
		`<td>Tue 2026-03-03 09:00:00 CET</td>`, `<td>2026-03-03 08:00:00.000Z</td>`,
		`ago: <span class="error-text">boom: upstream refused</span>`, `<td class="num warn">1</td>`,
		`<tr class="paused" data-schedule="nightly">`, `<td>America/New_York</td>`, `<span class="badge warn">paused</span>`,
		`by ops 0s ago: <q class="note">deploy freeze until Thursday</q>`)
	if strings.Contains(list, "/actions/schedule/") {
		t.Error("a read-only dashboard shows schedule actions")
	}
	filtered := d.page(t, "/schedules?prefix=week")
	if !strings.Contains(filtered, `data-schedule="weekly-report"`) || strings.Contains(filtered, `data-schedule="nightly"`) {
		t.Errorf("the filter week lists:\n%s", filtered)
	}
	// Schedules are jobs of the ledger too: the Jobs page shows their expression and
	// zone, linked to the schedule's page.
	contains(t, "the jobs page", d.page(t, "/jobs"), `data-job="weekly-report"`,
		`<td><a href="/schedules/weekly-report">0 9 * * MON-FRI (Europe/Berlin)</a></td>`)
	contains(t, "overview", d.page(t, "/"), `<h3><a href="/schedules">Schedules</a></h3>`,
		"<dt>schedules</dt><dd>2</dd><dt>paused</dt><dd>1</dd><dt>failing</dt><dd>1</dd>")
	contains(t, "the jobs page", d.page(t, "/jobs"), `<tr class="failing" data-job="weekly-report">`) // a schedule is a job

	page := d.page(t, "/schedules/weekly-report")
	contains(t, "the schedule's page", page,
		`<title>Schedule · pgcoord</title>`, `class="current" aria-current="page">Schedules</a>`,
		`<h3>Schedule weekly-report`, `<code>0 9 * * MON-FRI</code> in Europe/Berlin`, "window 1h, policy latest",
		"2 bytes of JSON (shown with --show-payloads)", `<span id="failures">1 failure(s) in a row</span>`,
		`<a href="/jobs?job=weekly-report">`, `<a href="/leases?name=job:weekly-report">`)
	for _, day := range []string{"Tue 2026-03-03", "Wed 2026-03-04", "Thu 2026-03-05", "Fri 2026-03-06", "Mon 2026-03-09"} {
		contains(t, "the next fire times", page, "<tr><td>"+day+" 09:00:00 CET</td><td>"+day[4:]+" 08:00:00.000Z</td></tr>")
	}
	if n := strings.Count(between(t, page, `id="next-ticks"`, "</table>"), "<tr><td>"); n != 5 {
		t.Errorf("%d next fire times, want 5", n)
	}
	runs := between(t, page, `id="runs"`, "</table>")
	contains(t, "the runs", runs,
		`<span class="badge failed">failed</span></td><td>trigger</td><td class="num">1</td>`, `<td class="error-text">boom: upstream refused</td>`,
		`<span class="badge pending">pending</span></td><td>trigger</td>`, `<td>triggered by ops</td>`,
		`<tr class="pending"><td title="Fri 2026-02-27 09:00:00 CET">2026-02-27 08:00:00.000Z</td><td><span class="badge pending">pending</span></td><td>backfill</td>`,
		`<td title="Mon 2026-03-02 09:00:00 CET">2026-03-02 08:00:00.000Z</td>`)
	if n := strings.Count(runs, "<tr class="); n != 4 {
		t.Errorf("%d runs, want 4 (failed, pending trigger, 2 backfilled)", n)
	}

	paused := d.page(t, "/schedules/nightly")
	contains(t, "the paused schedule's page", paused, `by ops 0s ago: <q class="note">deploy freeze until Thursday</q>`,
		"none while paused", "Paused: none of these runs until it is resumed.", "<tr><td>Tue 2026-03-03 02:30:00 EST</td><td>2026-03-03 07:30:00.000Z</td></tr>",
		"No runs yet.")
	if code, body, _ := d.do(t, http.MethodGet, "/schedules/nope", nil, "Accept", "text/html"); code != http.StatusNotFound || !strings.Contains(body, "no schedule of that name") {
		t.Errorf("an unknown schedule = %d, want 404 saying so:\n%s", code, body)
	}
}

// between returns the part of body from the first from to the next to after it.
func between(t *testing.T, body, from, to string) string {
	t.Helper()
	i := strings.Index(body, from)
	if i < 0 {
		t.Fatalf("no %q in:\n%s", from, body)
	}
	j := strings.Index(body[i:], to)
	if j < 0 {
		t.Fatalf("no %q after %q", to, from)
	}
	return body[i : i+j]
}

// TestUIScheduleActions: with --allow-actions the signed-in operator pauses (with a
// note), resumes and triggers a schedule from its page; each action writes exactly one
// audit row, the schedules API's, with the operator as its actor, and the schedule records
// the operator too. Actions that would change nothing, bad notes and unknown schedules are
// refused and not audited.
func TestUIScheduleActions(t *testing.T) {
	t.Parallel()
	d := newDash(t, ui.Config{AllowActions: true, Token: testToken})
	ctx := t.Context()
	if _, err := schedules.Create(ctx, d.pool, schedules.Schedule{Name: "weekly-report", Expr: "0 9 * * MON-FRI", Zone: "Europe/Berlin", Handler: "report"}, nil); err != nil {
		t.Fatal(err)
	}
	if code, _, _ := d.do(t, http.MethodPost, "/login", url.Values{"name": {"alice"}, "token": {testToken}}); code != http.StatusSeeOther {
		t.Fatalf("sign-in = %d", code)
	}
	page := d.page(t, "/schedules/weekly-report")
	contains(t, "the schedule's actions", page, `action="/actions/schedule/pause"`, `name="note"`, `action="/actions/schedule/trigger"`,
		`data-confirm="Pause schedule weekly-report?`)
	token := csrf(t, page)
	post := func(action string, form url.Values) (int, string, string) {
		t.Helper()
		form.Set("csrf", token)
		form.Set("confirmed", "yes")
		code, body, resp := d.do(t, http.MethodPost, "/actions/schedule/"+action, form)
		return code, body, resp.Header.Get("Location")
	}
	// The creation wrote the first row; each action one more.
	audited := func(n int, action string) {
		t.Helper()
		es := auditEntries(t, d.pool)
		if len(es) != n || es[0].Action != action || es[0].Target != "weekly-report" ||
			!strings.HasPrefix(es[0].Actor, "alice (token:") {
			t.Fatalf("audit rows %+v, want %d, the newest %s of weekly-report by alice", es, n, action)
		}
	}

	code, _, loc := post("pause", url.Values{"name": {"weekly-report"}, "note": {"waiting for the new template"}})
	if code != http.StatusSeeOther || !strings.HasPrefix(loc, "/schedules/weekly-report?flash=") {
		t.Fatalf("pause = %d to %q, want 303 back to the schedule's page", code, loc)
	}
	audited(2, "schedule.pause")
	actor := auditEntries(t, d.pool)[0].Actor
	if i, err := schedules.Get(ctx, d.pool, "weekly-report"); err != nil || !i.Paused || i.PausedBy != actor || i.PausedNote != "waiting for the new template" {
		t.Fatalf("after the pause: %+v, %v; want paused by %s with the note", i, err, actor)
	}
	if e := auditEntries(t, d.pool)[0]; e.Details["note"] != "waiting for the new template" {
		t.Errorf("the pause's audit details %v, want the note", e.Details)
	}
	page = d.page(t, loc)
	contains(t, "the page after the pause", page, `<p class="flash" role="status">paused schedule &#34;weekly-report&#34;`,
		`<span class="badge warn">paused</span>`, "waiting for the new template", `action="/actions/schedule/resume"`)
	if code, body, _ := post("pause", url.Values{"name": {"weekly-report"}, "note": {"again"}}); code != http.StatusConflict || !strings.Contains(body, "paused already") {
		t.Errorf("pausing a paused schedule = %d %q, want 409", code, body)
	}

	if code, _, loc = post("resume", url.Values{"name": {"weekly-report"}}); code != http.StatusSeeOther || !strings.HasPrefix(loc, "/schedules/weekly-report?flash=") {
		t.Fatalf("resume = %d to %q", code, loc)
	}
	audited(3, "schedule.resume")
	contains(t, "the page after the resume", d.page(t, loc), `resumed schedule &#34;weekly-report&#34;: its next tick is `, `<span class="badge ok">active</span>`)
	if code, body, _ := post("resume", url.Values{"name": {"weekly-report"}}); code != http.StatusConflict || !strings.Contains(body, "not paused") {
		t.Errorf("resuming an active schedule = %d %q, want 409", code, body)
	}

	if code, _, loc = post("trigger", url.Values{"name": {"weekly-report"}}); code != http.StatusSeeOther || !strings.HasPrefix(loc, "/schedules/weekly-report?flash=") {
		t.Fatalf("trigger = %d to %q", code, loc)
	}
	audited(4, "schedule.trigger")
	contains(t, "the page after the trigger", d.page(t, loc), "triggered schedule &#34;weekly-report&#34;",
		`<span class="badge pending">pending</span></td><td>trigger</td>`, "<td>triggered by alice (token:")

	for _, c := range []struct {
		action string
		form   url.Values
		status int
		want   string
	}{
		{"pause", url.Values{"name": {"weekly-report"}}, http.StatusBadRequest, "needs a note"},
		{"pause", url.Values{"name": {"weekly-report"}, "note": {strings.Repeat("x", schedules.MaxNoteLen+1)}}, http.StatusBadRequest, "needs a note"},
		{"pause", url.Values{"name": {"weekly-report"}, "note": {"bell\a"}}, http.StatusBadRequest, "control characters"},
		{"pause", url.Values{"name": {"nope"}, "note": {"x"}}, http.StatusNotFound, "no schedule"},
		{"resume", url.Values{"name": {"nope"}}, http.StatusNotFound, "no schedule"},
		{"trigger", url.Values{"name": {"nope"}}, http.StatusNotFound, "no schedule"},
		{"trigger", url.Values{"name": {""}}, http.StatusBadRequest, "empty"},
	} {
		if code, body, _ := post(c.action, c.form); code != c.status || !strings.Contains(body, c.want) {
			t.Errorf("%s %v = %d %q, want %d mentioning %q", c.action, c.form, code, body, c.status, c.want)
		}
	}
	if n := len(auditEntries(t, d.pool)); n != 4 {
		t.Errorf("%d audit rows after refused actions, want 4", n)
	}
}

// TestUIScheduleActionsRefused: without --allow-actions, without the CSRF token or by GET,
// a schedule action is refused, changes nothing and writes no audit row.
func TestUIScheduleActionsRefused(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	create := func(d *dash) {
		if _, err := schedules.Create(ctx, d.pool, schedules.Schedule{Name: "nightly", Expr: "@daily", Handler: "h"}, nil); err != nil {
			t.Fatal(err)
		}
	}
	unchanged := func(d *dash, what string) {
		t.Helper()
		i, err := schedules.Get(ctx, d.pool, "nightly")
		if err != nil {
			t.Fatal(err)
		}
		runs, err := singleton.ListRuns(ctx, d.pool, "nightly", nil)
		if err != nil {
			t.Fatal(err)
		}
		if i.Paused || len(runs) != 0 {
			t.Errorf("%s: paused %v, %d run(s): a refused action changed the schedule", what, i.Paused, len(runs))
		}
		if es := auditEntries(t, d.pool); len(es) != 1 || es[0].Action != "schedule.create" {
			t.Errorf("%s: audit rows %+v, want the creation's only", what, es)
		}
	}
	actions := []string{"pause", "resume", "trigger"}

	ro := newDash(t, ui.Config{})
	create(ro)
	page := ro.page(t, "/schedules/nightly")
	if strings.Contains(page, "/actions/schedule/") {
		t.Error("a read-only dashboard shows schedule actions")
	}
	for _, a := range actions {
		code, body, _ := ro.do(t, http.MethodPost, "/actions/schedule/"+a, url.Values{"csrf": {"00"}, "name": {"nightly"}, "note": {"n"}, "confirmed": {"yes"}})
		if code != http.StatusForbidden || !strings.Contains(body, "--allow-actions") {
			t.Errorf("%s without --allow-actions = %d %q, want 403", a, code, body)
		}
	}
	unchanged(ro, "without --allow-actions")

	d := newDash(t, ui.Config{AllowActions: true})
	create(d)
	good := csrf(t, d.page(t, "/schedules/nightly"))
	for _, a := range actions {
		for _, tok := range []string{"", strings.Repeat("0", 64)} {
			code, body, _ := d.do(t, http.MethodPost, "/actions/schedule/"+a, url.Values{"csrf": {tok}, "name": {"nightly"}, "note": {"n"}, "confirmed": {"yes"}})
			if code != http.StatusForbidden || !strings.Contains(body, "CSRF") {
				t.Errorf("%s with CSRF token %q = %d %q, want 403", a, tok, code, body)
			}
		}
		if code, _, _ := d.do(t, http.MethodPost, "/actions/schedule/"+a, url.Values{"csrf": {good}, "name": {"nightly"}, "note": {"n"}}); code != http.StatusBadRequest {
			t.Errorf("%s not confirmed = %d, want 400", a, code)
		}
		if code, _, _ := d.do(t, http.MethodGet, "/actions/schedule/"+a+"?name=nightly&note=n&confirmed=yes&csrf="+good, nil); code != http.StatusMethodNotAllowed {
			t.Errorf("GET %s = %d, want 405", a, code)
		}
	}
	unchanged(d, "refused requests")
}

// TestUISchedulesEscape: names, handlers, notes and actors come from users: the pages
// escape them for HTML, show their control characters visibly, and link a name of any
// characters to its own page.
func TestUISchedulesEscape(t *testing.T) {
	t.Parallel()
	d := newDash(t, ui.Config{AllowActions: true})
	ctx := t.Context()
	evil := `<script>alert("name")</script>/x?y#z`
	if _, err := schedules.Create(ctx, d.pool, schedules.Schedule{Name: evil, Expr: "@hourly", Handler: `<b onmouseover=alert(1)>h</b>`}, nil); err != nil {
		t.Fatal(err)
	}
	note := "\"><img src=x onerror=alert('note')>\x1b]0;pwned\x07"
	if _, err := schedules.Pause(ctx, d.pool, evil, note, &schedules.ChangeOpts{Actor: "<i>eve</i>"}); err != nil {
		t.Fatal(err)
	}
	if _, err := schedules.Create(ctx, d.pool, schedules.Schedule{Name: "..", Expr: "@hourly", Handler: "h"}, nil); err != nil {
		t.Fatal(err)
	}
	link := "/schedules/%3Cscript%3Ealert%28%22name%22%29%3C%2Fscript%3E%2Fx%3Fy%23z"
	list := d.page(t, "/schedules")
	detail := d.page(t, link)
	for what, body := range map[string]string{"list": list, "detail": detail} {
		for _, raw := range []string{"<script>alert", "<img src", "<b onmouseover", "<i>eve", "\x1b"} {
			if strings.Contains(body, raw) {
				t.Errorf("the %s page holds %q raw", what, raw)
			}
		}
		if i := strings.IndexFunc(body, func(r rune) bool { return r != '\n' && r != '\t' && base.IsControl(r) }); i >= 0 {
			t.Errorf("the %s page shows a raw control character at %d", what, i)
		}
		contains(t, "the "+what+" page", body, `&lt;script&gt;alert(&#34;name&#34;)&lt;/script&gt;/x?y#z`,
			`&lt;b onmouseover=alert(1)&gt;h&lt;/b&gt;`, `by &lt;i&gt;eve&lt;/i&gt;`,
			`&#34;&gt;&lt;img src=x onerror=alert(&#39;note&#39;)&gt;\x1b]0;pwned\x07`)
	}
	contains(t, "the list", list, `<a href="`+link+`">`, `<a href="/schedules/%2E%2E">..</a>`)
	contains(t, "the detail", detail, `<input type="hidden" name="name" value="&lt;script&gt;alert(&#34;name&#34;)&lt;/script&gt;/x?y#z">`,
		`data-confirm="Resume schedule &lt;script&gt;alert(&#34;name&#34;)&lt;/script&gt;/x?y#z?`)
	contains(t, "the schedule named ..", d.page(t, "/schedules/%2E%2E"), "<h3>Schedule ..")

	// Its actions find it by the name the page's form holds, and return to its page.
	code, _, resp := d.do(t, http.MethodPost, "/actions/schedule/resume",
		url.Values{"csrf": {csrf(t, detail)}, "name": {evil}, "confirmed": {"yes"}})
	if loc := resp.Header.Get("Location"); code != http.StatusSeeOther || !strings.HasPrefix(loc, link+"?flash=") {
		t.Fatalf("resume = %d to %q, want 303 to %s", code, loc, link)
	}
	if i, err := schedules.Get(ctx, d.pool, evil); err != nil || i.Paused {
		t.Fatalf("after the resume: %+v, %v", i, err)
	}
}

// TestUISchedulesPaging: the list shows 50 schedules a page in name order, with a link to
// the next page that keeps the filter.
func TestUISchedulesPaging(t *testing.T) {
	t.Parallel()
	d := newDash(t, ui.Config{})
	for i := range 51 {
		if _, err := schedules.Create(t.Context(), d.pool, schedules.Schedule{Name: fmt.Sprintf("s-%02d", i), Expr: "@daily", Handler: "h"}, nil); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := schedules.Create(t.Context(), d.pool, schedules.Schedule{Name: "t-00", Expr: "@daily", Handler: "h"}, nil); err != nil {
		t.Fatal(err)
	}
	first := d.page(t, "/schedules?prefix=s-")
	contains(t, "the first page", first, `data-schedule="s-00"`, `data-schedule="s-49"`, `<a class="next" href="?prefix=s-&amp;after=s-49">`)
	if n := strings.Count(first, "data-schedule="); n != 50 {
		t.Errorf("the first page lists %d schedules, want 50", n)
	}
	second := d.page(t, "/schedules?prefix=s-&after=s-49")
	if n := strings.Count(second, "data-schedule="); n != 1 || !strings.Contains(second, `data-schedule="s-50"`) || strings.Contains(second, `class="next"`) {
		t.Errorf("the second page lists %d schedules, want s-50 alone and no next page:\n%s", n, second)
	}
}
