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
	ctx, cancelTimeout := context.WithTimeout(ctx, 4*pgtest.WaitLimit)
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

// TestUIBrowser loads every page in headless Chromium, checks that its key content is
// visible, watches a page refresh itself, and takes the three actions from their forms —
// confirming the dialog — and sees their effect; screenshots of each step are saved.
func TestUIBrowser(t *testing.T) {
	t.Parallel()
	ctx := browser(t)
	d := newDash(t, ui.Config{AllowActions: true, Refresh: 300 * time.Millisecond, DoctorEvery: time.Nanosecond})
	dir := artifacts(t)
	now := dbNow(t, d.pool)
	holdLease(t, d.pool, "order:42", "worker-a", 10*time.Minute, time.Time{}, map[string]string{"job": "charge"})
	holdLease(t, d.pool, "order:43", "worker-b", time.Second, now.Add(-time.Hour), nil)
	permit(t, d.pool, "tenant:big", "w1", 3, time.Minute, time.Time{})
	permit(t, d.pool, "tenant:big", "w2", 3, time.Minute, time.Time{})
	if err := semaphore.AddDemand(t.Context(), d.pool, "tenant:small", 4, nil); err != nil {
		t.Fatal(err)
	}
	every := 24 * time.Hour
	report := singleton.Job{Name: "weekly-report", Every: every}
	tick(t, d.pool, report, now.Add(-5*every), true, nil)
	tick(t, d.pool, report, now.Add(-2*every), true, errBoom)
	tick(t, d.pool, report, time.Time{}, true, nil)
	dead := outboxState(t, d.pool)
	beginKey(t, d.pool, "payments", "dead-1", "reserved", true)

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
		if err := chromedp.Do(ctx, steps...); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	text := func(sel string) string {
		t.Helper()
		s, err := chromedp.Run(ctx, chromedp.Text(css(sel)))
		if err != nil {
			t.Fatalf("text of %s: %v", sel, err)
		}
		return s
	}
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
	visible("overview", "/", "#health", "1 lease(s) held, 1 expired without release", "replication", "Leases", "Semaphores", "Jobs",
		"Outbox", "Idempotency", "payments/dead-1")
	visible("leases", "/leases", "#leases", "order:42", "worker-a", "job=charge", "held", "expired")
	visible("semaphores", "/semaphores", "#semaphores", "tenant:big", "2 / 3", "tenant:small", "starved")
	visible("jobs", "/jobs", "#jobs", "weekly-report", "ok")
	ticks, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll('tr[data-job="weekly-report"] rect.tick').length`))
	if err != nil || ticks != 6 {
		t.Fatalf("the strip of weekly-report has %d ticks (%v), want 6", ticks, err)
	}

	visible("outbox", "/outbox", "#topics", "orders", "audit", "Delivered per minute", "boom: upstream refused")
	visible("idempotency", "/idempotency", "#inflight", "payments", "dead-1", "stuck", "reserved")

	// The Leases page refreshes itself: a lease granted after it loaded appears.
	do("load /leases", chromedp.Navigate(d.url+"/leases"), chromedp.WaitVisible(css("#leases")))
	holdLease(t, d.pool, "order:44", "worker-c", time.Minute, time.Time{}, nil)
	do("wait for the new lease", chromedp.WaitVisible(css(`tr[data-name="order:44"]`)), shot("leases_refreshed"))

	// Expire order:42 from its button, confirming the dialog.
	do("expire from the page", chromedp.Click(css(`tr[data-name="order:42"] button`)),
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
		chromedp.Click(input), chromedp.SetValue(input, "7"), // the page does not refresh under a form being filled in
		chromedp.Click(css(`tr[data-key="tenant:big"] button`)),
		chromedp.WaitVisible(css("p.flash")), shot("semaphores_after_set_limit"))
	held := text(`tr[data-key="tenant:big"] .held`)
	if s, err := semaphore.Get(t.Context(), d.pool, "tenant:big"); err != nil || s.Limit != 7 || held != "2 / 7" {
		t.Fatalf("after setting the limit: %d (%v), page shows %q", s.Limit, err, held)
	}
	// Retry the dead message of orders from its button.
	retry := css(fmt.Sprintf(`tr[data-id="%d"] button`, dead.ID))
	do("retry from the page", chromedp.Navigate(d.url+"/outbox"), chromedp.WaitVisible(retry), chromedp.Click(retry),
		chromedp.WaitVisible(css("p.flash")), shot("outbox_after_retry"))
	if flash := text("p.flash"); !strings.Contains(flash, fmt.Sprintf("outbox message %d (topic orders, key b) is pending again", dead.ID)) {
		t.Fatalf("after retrying: flash %q", flash)
	}
	if m, err := outbox.Get(t.Context(), d.pool, dead.ID); err != nil || m.State != outbox.Pending {
		t.Fatalf("after retrying: %+v, %v; want pending", m, err)
	}
	es := auditEntries(t, d.pool)
	if len(es) != 3 || es[0].Action != "outbox.retry" || es[1].Action != "semaphore.set_limit" || es[2].Action != "lease.expire" {
		t.Fatalf("audit entries %+v", es)
	}
	t.Logf("screenshots in %s", dir)
}
