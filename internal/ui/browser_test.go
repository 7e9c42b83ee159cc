package ui_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"

	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/internal/ui"
	"github.com/pgcoord/pgcoord/outbox"
	"github.com/pgcoord/pgcoord/semaphore"
	"github.com/pgcoord/pgcoord/singleton"
)

// EnvArtifacts names a directory where the browser test saves its screenshots (under the
// test's name); without it they go to the test's temporary directory.
const EnvArtifacts = "PGCOORD_TEST_ARTIFACTS"

// chromium finds a headless-capable Chromium: Debian's chromium package in CI. Without
// one the test skips with a clear message, except with CI set, where it fails.
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	msg := "no Chromium on PATH: install Debian's package (apt-get install -y chromium) to run the browser test"
	if os.Getenv("CI") != "" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}

// artifacts returns the directory for the test's screenshots.
func artifacts(t *testing.T) string {
	t.Helper()
	dir := os.Getenv(EnvArtifacts)
	if dir == "" {
		return t.TempDir()
	}
	dir = filepath.Join(dir, t.Name())
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// browser starts headless Chromium for the test; it accepts every confirm() dialog, as an
// operator clicking OK.
func browser(t *testing.T) context.Context {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromium(t)), chromedp.NoSandbox, chromedp.DisableGPU, chromedp.WindowSize(1400, 900))
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelCtx := chromedp.NewContext(alloc)
	ctx, cancelTimeout := context.WithTimeout(ctx, 20*pgtest.WaitLimit) // a backstop: each step has its own bound
	t.Cleanup(func() { cancelTimeout(); cancelCtx(); cancelAlloc() })
	dialogs := chromedp.Events(ctx, page.JavascriptDialogOpening) // starts the browser
	go func() {
		for _, err := range dialogs {
			if err != nil {
				return
			}
			_, _ = chromedp.Call(ctx, page.HandleJavaScriptDialog, page.HandleJavaScriptDialogParams{Accept: true})
		}
	}()
	return ctx
}

// css selects the first element matching a CSS selector.
func css(sel string) chromedp.CSS { return chromedp.CSS(sel) }

// EnvReadmeShot names a file where the browser test also saves the README's screenshot
// of the dashboard (docs/img/dashboard.png): the Semaphores page's viewport.
const EnvReadmeShot = "PGCOORD_UI_README_SCREENSHOT"

// TestUIBrowser loads every page and every detail in headless Chromium with realistic
// data, checks that what each is for is visible — the live system (relays and what they
// hold, holders and since when, waiters), the links (key to permits and waiters, job to
// runs, lease to fence register, outbox key to messages), the filters, the trends, the
// payloads opening, a partition group's grid — watches a page refresh itself, and takes
// five actions from their forms, confirming the dialog, and sees their effect; screenshots
// of each step are saved.
func TestUIBrowser(t *testing.T) {
	t.Parallel()
	ctx := browser(t)
	d := newDash(t, ui.Config{AllowActions: true, ShowPayloads: true, Refresh: 300 * time.Millisecond, DoctorEvery: time.Nanosecond})
	dir := artifacts(t)
	seedBrowser(t, d)
	dead := outboxState(t, d.pool)
	busyRelay(t, d.pool, "relay-eu-1")
	idleRelay(t, d.pool, "relay-eu-2")

	shot := func(name string) chromedp.Action[chromedp.Void] {
		return chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
			png, err := chromedp.FullScreenshot(100)(ctx, tg) // 100: PNG
			if err != nil {
				return err
			}
			return os.WriteFile(filepath.Join(dir, name+".png"), png, 0o644)
		})
	}
	do := func(what string, steps ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		step, cancel := context.WithTimeout(ctx, 2*pgtest.WaitLimit)
		defer cancel()
		if err := chromedp.Do(step, steps...); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	// text reads an element's text in one script, so a refresh of the page that replaces
	// the element between finding it and reading it cannot fail the read.
	text := func(sel string) string {
		t.Helper()
		s, err := chromedp.Run(ctx, chromedp.Evaluate[string](fmt.Sprintf(
			`(() => { const e = document.querySelector(%q); return e ? e.innerText.trim() : "(no element)"; })()`, sel)))
		if err != nil {
			t.Fatalf("text of %s: %v", sel, err)
		}
		return s
	}
	// call calls an element's method (click, focus) in one script, for the same reason;
	// a click's confirm() dialog is accepted (browser) before the script returns.
	call := func(sel, method string) chromedp.Action[chromedp.Void] {
		return chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
			ok, err := chromedp.Evaluate[bool](fmt.Sprintf(
				`(() => { const e = document.querySelector(%q); if (!e) return false; e.%s(); return true; })()`, sel, method))(ctx, tg)
			if err == nil && !ok {
				err = fmt.Errorf("no element %s", sel)
			}
			return err
		})
	}
	click := func(sel string) chromedp.Action[chromedp.Void] { return call(sel, "click") }
	visible := func(name, path, sel string, want ...string) {
		t.Helper()
		do("load "+path, chromedp.Navigate(d.url+path), chromedp.WaitVisible(css(sel)), shot(name))
		main := text("main")
		for _, w := range want {
			if !strings.Contains(main, w) {
				t.Errorf("%s: %q not visible in:\n%s", path, w, main)
			}
		}
	}
	visible("overview", "/", "#health", "lease(s) held, 1 expired without release", "replication", "Leases", "Semaphores", "Jobs",
		"Outbox", "Idempotency", "Partitions", "payments/dead-1")
	visible("leases", "/leases", "#leases", "order:42", "worker-a", "job=charge", "held", "expired", "Since")
	visible("leases_filtered", "/leases?prefix=order:4", "#filter", "order:42", "order:43")
	if n := count(t, ctx, "#leases tbody tr"); n != 2 {
		t.Errorf("the filter order:4 lists %d leases, want 2", n)
	}
	visible("lease_detail", "/leases?name=order:42", "#lease-detail", "Lease order:42", "fence register", "behind the newest grant",
		"newest grant", "worker-a")
	visible("semaphores", "/semaphores", "#semaphores", "tenant:big", "2 / 2", "tenant:small", "starved", "Wait p50 / p99")
	visible("semaphore_detail", "/semaphores?key=tenant:big", "#sem-detail", "Semaphore tenant:big", "worker-1", "worker-2",
		"Waiters (first in line first)", "worker-3")
	visible("jobs", "/jobs", "#jobs", "weekly-report", "nightly-export", "failing")
	ticks, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll('tr[data-job="weekly-report"] rect.tick').length`))
	if err != nil || ticks != 6 {
		t.Fatalf("the strip of weekly-report has %d ticks (%v), want 6", ticks, err)
	}
	visible("job_detail", "/jobs?job=nightly-export", "#job-detail", "Job nightly-export", "succeeded 2", "failed 1",
		"boom: upstream refused", "job:nightly-export")
	visible("outbox", "/outbox", "#topics", "orders", "audit", "Delivered per minute", "boom: upstream refused",
		"Enqueued vs delivered per minute", "relay-eu-1", "relay-eu-2", "Retry all dead")
	if n := count(t, ctx, "#trend polyline"); n != 2 {
		t.Errorf("the trend chart has %d lines, want 2", n)
	}
	do("open a payload", click("#dead details summary"), chromedp.WaitVisible(css("#dead details pre")), shot("outbox_payload_open"))
	if p := text("#dead details pre"); !strings.Contains(p, "poison") {
		t.Errorf("the opened payload reads %q", p)
	}
	visible("outbox_key", "/outbox?topic=orders&key=b", "#key-messages", "Messages of key b in topic orders", "dead")
	visible("partitions", "/partitions", "#partition-groups", "orders", "idle")
	visible("partition_detail", "/partitions/orders", "#partition-grid", "Partition group orders", "2 without a live grant",
		"a (6)", "b (0)", "free (2)")
	for sel, want := range map[string]int{"#partition-grid g.partition": 8, "#partition-grid g.partition.moving": 2,
		"#partition-grid g.partition.free": 2, "#partition-grid rect.next": 4, "#partition-members tbody tr": 2} {
		if n := count(t, ctx, sel); n != want {
			t.Errorf("the group's page has %d %s, want %d", n, sel, want)
		}
	}
	visible("idempotency", "/idempotency?prefix=order-&state=completed", "#found", "payments", "order-1", "order-2", "completed",
		"dead-1", "stuck", "reserved")
	if shotPath := os.Getenv(EnvReadmeShot); shotPath != "" {
		do("README screenshot", chromedp.Navigate(d.url+"/semaphores?key=tenant:big"), chromedp.WaitVisible(css("#sem-detail")),
			chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
				png, err := chromedp.CaptureScreenshot()(ctx, tg)
				if err != nil {
					return err
				}
				return os.WriteFile(shotPath, png, 0o644)
			}))
	}

	// The Leases page refreshes itself: a lease granted after it loaded appears.
	do("load /leases", chromedp.Navigate(d.url+"/leases"), chromedp.WaitVisible(css("#leases")))
	holdLease(t, d.pool, "order:44", "worker-c", time.Minute, time.Time{}, nil)
	do("wait for the new lease", chromedp.WaitVisible(css(`tr[data-name="order:44"]`)), shot("leases_refreshed"))

	// Expire order:42 from its button, confirming the dialog.
	do("expire from the page", click(`tr[data-name="order:42"] button`),
		chromedp.WaitVisible(css("p.flash")), shot("leases_after_expire"))
	if flash, badge := text("p.flash"), text(`tr[data-name="order:42"] .badge`); !strings.Contains(flash, `expired lease "order:42"`) || badge != "free" {
		t.Fatalf("after expiring: flash %q, badge %q", flash, badge)
	}
	if leaseInfo(t, d.pool, "order:42").Held() {
		t.Fatal("the lease is still held")
	}

	// Set tenant:big's limit to 7 from its form.
	input := css(`tr[data-key="tenant:big"] input[name=limit]`)
	do("set the limit from the page", chromedp.Navigate(d.url+"/semaphores"), chromedp.WaitVisible(input),
		call(`tr[data-key="tenant:big"] input[name=limit]`, "focus"), chromedp.SetValue(input, "7"), // the page does not refresh under a form being filled in
		click(`tr[data-key="tenant:big"] button`),
		chromedp.WaitVisible(css("p.flash")), shot("semaphores_after_set_limit"))
	held := text(`tr[data-key="tenant:big"] .held`)
	if s, err := semaphore.Get(t.Context(), d.pool, "tenant:big"); err != nil || s.Limit != 7 || !strings.HasPrefix(held, "2 / 7") {
		t.Fatalf("after setting the limit: %d (%v), page shows %q", s.Limit, err, held)
	}
	// Retry the dead message of orders from its button.
	retry := fmt.Sprintf(`tr[data-id="%d"] button`, dead.ID)
	do("retry from the page", chromedp.Navigate(d.url+"/outbox"), chromedp.WaitVisible(css(retry)), click(retry),
		chromedp.WaitVisible(css("p.flash")), shot("outbox_after_retry"))
	if flash := text("p.flash"); !strings.Contains(flash, fmt.Sprintf("outbox message %d (topic orders, key b) is pending again", dead.ID)) {
		t.Fatalf("after retrying: flash %q", flash)
	}
	if m, err := outbox.Get(t.Context(), d.pool, dead.ID); err != nil || m.State != outbox.Pending {
		t.Fatalf("after retrying: %+v, %v; want pending", m, err)
	}
	// Retry all dead messages of topic audit from its button.
	all := `tr[data-topic="audit"] button.retry-topic`
	do("retry a topic from the page", chromedp.WaitVisible(css(all)), click(all),
		chromedp.WaitVisible(css("p.flash")), shot("outbox_after_retry_topic"))
	if flash := text("p.flash"); !strings.Contains(flash, "1 dead message(s) of topic audit are pending again") {
		t.Fatalf("after retrying topic audit: flash %q", flash)
	}
	// Drain member a of partition group orders from its button.
	drain := `tr[data-member="a"] button`
	do("drain from the page", chromedp.Navigate(d.url+"/partitions/orders"), chromedp.WaitVisible(css(drain)), click(drain),
		chromedp.WaitVisible(css("p.flash")), shot("partition_after_drain"))
	if flash, badge := text("p.flash"), text(`tr[data-member="a"] .badge`); !strings.Contains(flash, `drained member "a" of partition group "orders": its 6 partition(s) move`) || badge != "draining" {
		t.Fatalf("after draining: flash %q, badge %q", flash, badge)
	}
	es := auditEntries(t, d.pool)
	if len(es) != 5 || es[0].Action != "partitions.drain" || es[1].Action != "outbox.retry_topic" || es[2].Action != "outbox.retry" ||
		es[3].Action != "semaphore.set_limit" || es[4].Action != "lease.expire" {
		t.Fatalf("audit entries %+v", es)
	}
	t.Logf("screenshots in %s", dir)
}

// count is the number of elements matching a CSS selector.
func count(t *testing.T, ctx context.Context, sel string) int {
	t.Helper()
	n, err := chromedp.Run(ctx, chromedp.Evaluate[int](fmt.Sprintf(`document.querySelectorAll(%q).length`, sel)))
	if err != nil {
		t.Fatalf("count %s: %v", sel, err)
	}
	return n
}

// seedBrowser writes the browser test's data: leases held, expired and fenced; two
// tenants, one at its limit with a waiter and one starved; two jobs with a history; keys
// completed, in flight and stuck; partition groups with partitions held, moving and free.
func seedBrowser(t *testing.T, d *dash) {
	t.Helper()
	now := dbNow(t, d.pool)
	old := holdLease(t, d.pool, "order:42", "worker-z", time.Second, now.Add(-time.Hour), nil)
	fenceWrite(t, d.pool, "order:42", old.Token) // worker-z wrote; worker-a, granted since, has not yet
	holdLease(t, d.pool, "order:42", "worker-a", 10*time.Minute, now.Add(-3*time.Minute), map[string]string{"job": "charge"})
	holdLease(t, d.pool, "order:43", "worker-b", time.Second, now.Add(-time.Hour), nil)
	holdLease(t, d.pool, "invoice:7", "worker-c", 5*time.Minute, time.Time{}, nil)
	permit(t, d.pool, "tenant:big", "worker-1", 2, 10*time.Minute, now.Add(-40*time.Second))
	permit(t, d.pool, "tenant:big", "worker-2", 2, time.Minute, time.Time{})
	waiter(t, d.pool, "tenant:big", "worker-3", 2)
	if err := semaphore.AddDemand(t.Context(), d.pool, "tenant:small", 4, nil); err != nil {
		t.Fatal(err)
	}
	every := 24 * time.Hour
	report := singleton.Job{Name: "weekly-report", Every: every}
	tick(t, d.pool, report, now.Add(-5*every), true, nil)
	tick(t, d.pool, report, now.Add(-2*every), true, errBoom)
	tick(t, d.pool, report, time.Time{}, true, nil)
	export := singleton.Job{Name: "nightly-export", Every: time.Hour}
	for i, err := range []error{nil, nil, errBoom} {
		tick(t, d.pool, export, now.Add(time.Duration(i-3)*time.Hour), true, err)
	}
	beginKey(t, d.pool, "payments", "dead-1", "reserved", true)
	completeKey(t, d.pool, "payments", "order-1", `{"charged":true}`)
	completeKey(t, d.pool, "payments", "order-2", `{"charged":true}`)
	seedPartitions(t, d.pool)
}
