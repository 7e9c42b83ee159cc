package ui_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/internal/ui"
	"github.com/pgcoord/pgcoord/leases"
	"github.com/pgcoord/pgcoord/semaphore"
	"github.com/pgcoord/pgcoord/singleton"
)

// TestUIOverview: the Overview shows the checks of `pgcoord doctor` — all healthy on a
// fresh schema; a semaphore over its limit and a failing job need attention — and counts
// each primitive.
func TestUIOverview(t *testing.T) {
	t.Parallel()
	d := newDash(t, ui.Config{DoctorEvery: time.Nanosecond})
	// The checks of the database as a whole (notify, transactions, ...) depend on what else
	// runs on the server: judge only pgcoord's own.
	body := d.page(t, "/")
	contains(t, "empty overview", body, `<tr class="ok" data-check="schema">`, `<tr class="ok" data-check="leases">`,
		`<tr class="ok" data-check="semaphores">`, `<tr class="ok" data-check="jobs">`,
		"Leases", "Semaphores", "Jobs", "<dt>pending migrations</dt><dd>0</dd>")

	now := dbNow(t, d.pool)
	holdLease(t, d.pool, "held", "w1", time.Minute, time.Time{}, nil)
	holdLease(t, d.pool, "dead", "w2", time.Second, now.Add(-time.Hour), nil) // expired long ago, never released
	permit(t, d.pool, "tenant:a", "p1", 2, time.Minute, time.Time{})
	permit(t, d.pool, "tenant:a", "p2", 2, time.Minute, time.Time{})
	if err := semaphore.SetLimit(t.Context(), d.pool, "tenant:a", 1, nil); err != nil {
		t.Fatal(err)
	}
	tick(t, d.pool, singleton.Job{Name: "report", Every: time.Minute}, time.Time{}, true, errBoom)

	body = d.page(t, "/")
	contains(t, "overview", body,
		"check(s) need attention",
		`<tr class="attention" data-check="semaphores">`, "tenant:a (over its limit)",
		`<tr class="attention" data-check="jobs">`, "overdue or failing: report",
		`<tr class="ok" data-check="leases">`, "1 lease(s) held, 1 expired without release",
		"<dt>held</dt><dd>1</dd>", "<dt>expired, not released</dt><dd>1</dd>",
		"<dt>permits held</dt><dd>2</dd>", "<dt>keys over their limit</dt><dd>1</dd>", "<dt>failing</dt><dd>1</dd>")
	if strings.Contains(body, "All healthy") {
		t.Fatal("overview says all healthy with checks needing attention")
	}
}

// TestUIOverviewCachesDoctor: the doctor's checks, which read every row, run at most
// every DoctorEvery however often the Overview refreshes; the counts are always fresh.
func TestUIOverviewCachesDoctor(t *testing.T) {
	t.Parallel()
	d := newDash(t, ui.Config{DoctorEvery: time.Hour})
	contains(t, "first overview", d.page(t, "/"), "0 lease(s) held", "<dt>held</dt><dd>0</dd>")
	holdLease(t, d.pool, "held", "w1", time.Minute, time.Time{}, nil)
	contains(t, "second overview", d.page(t, "/?fragment=1"), "0 lease(s) held", "<dt>held</dt><dd>1</dd>")
}

// TestUILeasesPage: each lease shows its holder, metadata, fence token and time left as a
// bar by the database clock; expired and operator-expired leases say so; the list is
// paginated; the refresh fragment is the content alone.
func TestUILeasesPage(t *testing.T) {
	t.Parallel()
	d := newDash(t, ui.Config{})
	now := dbNow(t, d.pool)
	l := holdLease(t, d.pool, "order:42", "worker-a", time.Minute, time.Time{}, map[string]string{"job": "charge"})
	holdLease(t, d.pool, "order:43", "worker-b", time.Second, now.Add(-time.Hour), nil)
	// order:44's holder renewed with 10s of its 60s grant left (a near miss), 30s ago.
	late := holdLease(t, d.pool, "order:44", "worker-c", time.Minute, now.Add(-80*time.Second), nil)
	pgtest.At(t, d.pool, now.Add(-30*time.Second), func() {
		if _, err := leases.Renew(t.Context(), d.pool, late, time.Minute, nil); err != nil {
			t.Fatal(err)
		}
	})
	holdLease(t, d.pool, "order:45", "worker-d", time.Minute, time.Time{}, nil)
	if _, err := leases.Expire(t.Context(), d.pool, "order:45", "alice"); err != nil {
		t.Fatal(err)
	}
	// The page judges at now, however long the setup took on a loaded machine: the near
	// miss was 30s ago exactly.
	pgtest.NewClock(t, d.pool).Freeze(now)

	body := d.page(t, "/leases")
	contains(t, "leases page", body, `data-name="order:42"`, "worker-a", "job=charge",
		fmt.Sprintf(`<td class="num">%d</td>`, l.Token), `<rect class="fill" width="`, "of 1m</td>",
		`data-name="order:43"`, `<span class="badge expired">expired</span>`, `<td class="left">expired 59m`,
		`data-name="order:44"`, `<td class="num warn" title="latest 30s ago">1</td>`,
		`data-name="order:45"`, `<td class="num">1</td>`, "<td>alice</td>") // a forced expiry
	if strings.Contains(body, "Expire</button>") {
		t.Fatal("actions are disabled, but the page offers Expire")
	}

	frag := d.page(t, "/leases?fragment=1")
	if strings.Contains(frag, "<html") || !strings.Contains(frag, `data-name="order:42"`) {
		t.Fatalf("fragment is not the content alone:\n%s", frag)
	}

	// 51 more leases: the first page holds 50 and links to the next.
	for i := range 51 {
		holdLease(t, d.pool, fmt.Sprintf("p:%03d", i), "w", time.Minute, time.Time{}, nil)
	}
	first := d.page(t, "/leases")
	if n := strings.Count(first, "<tr class="); n != 50 {
		t.Fatalf("first page has %d leases, want 50", n)
	}
	contains(t, "first page", first, `href="?prefix=&amp;after=p%3a045"`) // after the 4 order:* leases
	second := d.page(t, "/leases?after=p:045")
	contains(t, "second page", second, `data-name="p:046"`, `data-name="p:050"`, `href="?prefix="`) // and a link to the first
	if n := strings.Count(second, "<tr class="); n != 5 {
		t.Fatalf("second page has %d leases, want the 5 after p:045", n)
	}
	if strings.Contains(second, `class="next"`) {
		t.Fatal("the last page links to a next page")
	}
}

// TestUISemaphoresPage: per key, permits against the limit as a bar, waiters, demand,
// admitted share against weight, wait p50 / p99 of recent admissions; an over-limit key
// and a starved key stand out.
func TestUISemaphoresPage(t *testing.T) {
	t.Parallel()
	d := newDash(t, ui.Config{})
	permit(t, d.pool, "tenant:big", "w1", 3, time.Minute, time.Time{})
	permit(t, d.pool, "tenant:big", "w2", 3, time.Minute, time.Time{})
	if err := semaphore.SetLimit(t.Context(), d.pool, "tenant:big", 3, &semaphore.SetLimitOpts{Weight: 3}); err != nil {
		t.Fatal(err)
	}
	if err := semaphore.AddDemand(t.Context(), d.pool, "tenant:small", 5, &semaphore.AddDemandOpts{Limit: 2}); err != nil {
		t.Fatal(err)
	}
	body := d.page(t, "/semaphores")
	contains(t, "semaphores page", body,
		`<tr class="ok" data-key="tenant:big">`, `<span class="held">2 / 3</span>`, "weight 3",
		`viewBox="0 0 3 10"`, `<rect class="fill" width="2" height="10"/>`,
		"100% / 75%", // all admissions so far went to tenant:big, which has 3 of the 4 weight
		`<tr class="ok starved" data-key="tenant:small">`, `<span class="held">0 / 2</span>`, "0% / 25%")

	if err := semaphore.SetLimit(t.Context(), d.pool, "tenant:big", 1, nil); err != nil {
		t.Fatal(err)
	}
	contains(t, "semaphores page after lowering the limit", d.page(t, "/semaphores"),
		`<tr class="over_limit" data-key="tenant:big">`, `<rect class="fill over" width="2"`)

	// Admission waits recorded by the database: slow-1 was admitted at once; slow-2 stood
	// in line from now-10s until slow-1's permit expired and it was admitted at now-4s.
	// Its 6 s wait is in the bucket [2^12.5, 2^13) ms, shown as its middle 2^12.75 ms.
	now := dbNow(t, d.pool)
	permit(t, d.pool, "tenant:slow", "slow-1", 1, 2*time.Second, now.Add(-10*time.Second))
	pgtest.At(t, d.pool, now.Add(-10*time.Second), func() {
		if _, err := d.pool.Exec(t.Context(), `SELECT pgcoord_semaphore_acquire('tenant:slow', 'slow-2', 1, interval '1 hour', interval '1 hour')`); err != nil {
			t.Fatal(err)
		}
	})
	permit(t, d.pool, "tenant:slow", "slow-2", 1, time.Hour, now.Add(-4*time.Second))
	contains(t, "semaphores page with recorded waits", d.page(t, "/semaphores"),
		`<span title="2 admissions in the last 5 to 10 minutes">0s / 6.9s</span>`)
}

// TestUIJobsPage: per job the last success and failure, the overdue and failing flags,
// and a strip of the recent ticks with the missed ones.
func TestUIJobsPage(t *testing.T) {
	t.Parallel()
	d := newDash(t, ui.Config{})
	now := dbNow(t, d.pool)
	every := 24 * time.Hour // long slots: the test never straddles a boundary in practice
	ok := singleton.Job{Name: "ok-job", Every: every}
	tick(t, d.pool, ok, now.Add(-3*every), true, nil)
	tick(t, d.pool, ok, now, true, nil)
	failing := singleton.Job{Name: "failing-job", Every: every}
	tick(t, d.pool, failing, time.Time{}, true, errBoom)
	stuck := singleton.Job{Name: "stuck-job", Every: every}
	tick(t, d.pool, stuck, now.Add(-60*every), false, nil) // never finished, never succeeded

	body := d.page(t, "/jobs")
	row := func(job string) string {
		i := strings.Index(body, `data-job="`+job+`"`)
		if i < 0 {
			t.Fatalf("no row for %s:\n%s", job, body)
		}
		return body[i : i+strings.Index(body[i:], "</tr>")]
	}
	okRow := row("ok-job")
	contains(t, "ok-job", okRow, `<span class="badge ok">ok</span>`, "never</td>", // no failure
		`class="tick succeeded"`, `class="tick missed"`)
	if n := strings.Count(okRow, `class="tick `); n != 4 {
		t.Fatalf("ok-job strip has %d ticks, want 4 (from its first tick 3 slots ago)", n)
	}
	if n := strings.Count(okRow, `class="tick missed"`); n != 2 {
		t.Fatalf("ok-job strip has %d missed ticks, want 2", n)
	}
	contains(t, "failing-job", row("failing-job"), `<span class="badge failing">failing</span>`,
		errBoom.Error(), `class="tick failed"`)
	stuckRow := row("stuck-job")
	contains(t, "stuck-job", stuckRow, `<span class="badge overdue">overdue</span>`, "never</td>")
	if n := strings.Count(stuckRow, `class="tick `); n != 30 {
		t.Fatalf("stuck-job strip has %d ticks, want the last 30 slots", n)
	}
}

// TestUIStaticAndUnknown: assets are embedded; unknown paths are 404.
func TestUIStaticAndUnknown(t *testing.T) {
	t.Parallel()
	d := newDash(t, ui.Config{})
	for _, p := range []string{"/static/app.js", "/static/app.css"} {
		code, body, _ := d.do(t, http.MethodGet, p, nil)
		if code != http.StatusOK || len(body) < 100 {
			t.Fatalf("GET %s = %d, %d bytes", p, code, len(body))
		}
	}
	if code, _, _ := d.do(t, http.MethodGet, "/nope", nil); code != http.StatusNotFound {
		t.Fatalf("GET /nope = %d, want 404", code)
	}
	_, _, resp := d.do(t, http.MethodGet, "/", nil)
	if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'self'") {
		t.Fatalf("no CSP: %q", csp)
	}
}
