package ui_test

import (
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/pgcoord/pgcoord/internal/ui"
	"github.com/pgcoord/pgcoord/ratelimit"
)

// TestUIRatelimitsPage: the policies with their mode (an unlogged one marked) and shadow count, a key's state on
// request, and the audited reset of a key.
func TestUIRatelimitsPage(t *testing.T) {
	t.Parallel()
	d := newDash(t, ui.Config{AllowActions: true})
	ctx := t.Context()
	for _, p := range []ratelimit.Policy{
		{Name: "api", Rate: 10, Period: time.Second, Burst: 20},
		{Name: "tenant", Rate: 1, Period: time.Hour, Burst: 1, Shadow: true},
		{Name: "fast", Rate: 1, Period: time.Second, Burst: 1, Unlogged: true},
	} {
		if _, err := ratelimit.Set(ctx, d.pool, p); err != nil {
			t.Fatal(err)
		}
	}
	for range 2 {
		if _, err := ratelimit.Allow(ctx, d.pool, 1, []ratelimit.Limit{{Policy: "tenant", Key: "t1"}}, nil); err != nil {
			t.Fatal(err)
		}
	}
	contains(t, "rate limits page", d.page(t, "/ratelimits"),
		`<tr data-policy="api">`, `<span class="badge ok">enforce</span>`,
		`<tr data-policy="tenant">`, `<span class="badge shadow">shadow</span>`, `<td class="num">1</td>`,
		`<tr data-policy="fast">`, `>unlogged</span>`)
	contains(t, "overview", d.page(t, "/"), "Rate limits")

	page := d.page(t, "/ratelimits?policy=tenant&key=t1")
	contains(t, "a key's state", page, `id="key-state"`, "<dt>remaining</dt><dd>0</dd>", `action="/actions/ratelimit/reset"`)
	code, _, resp := d.do(t, http.MethodPost, "/actions/ratelimit/reset",
		url.Values{"csrf": {csrf(t, page)}, "policy": {"tenant"}, "key": {"t1"}, "confirmed": {"yes"}}, "Origin", d.url)
	if code != http.StatusSeeOther || !strings.HasPrefix(resp.Header.Get("Location"), "/ratelimits?flash=") {
		t.Fatalf("POST reset = %d to %q", code, resp.Header.Get("Location"))
	}
	if st, err := ratelimit.State(ctx, d.pool, ratelimit.Limit{Policy: "tenant", Key: "t1"}); err != nil || st.Remaining != 1 {
		t.Fatalf("after the reset: %+v, %v", st, err)
	}
	if es := auditEntries(t, d.pool); len(es) != 1 || es[0].Action != "ratelimit.reset" || es[0].Target != "tenant t1" {
		t.Fatalf("audit = %+v", es)
	}
	contains(t, "an unknown policy", d.page(t, "/ratelimits?policy=nope&key=k"), `class="error"`, "no such policy")
}
