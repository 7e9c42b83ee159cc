package ui_test

import (
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/pgcoord/pgcoord/internal/ui"
	"github.com/pgcoord/pgcoord/semaphore"
)

// TestUIActionsDisabledByDefault: without AllowActions every action of the dashboard's
// table is refused with 403, even a well-formed POST, and changes nothing.
func TestUIActionsDisabledByDefault(t *testing.T) {
	t.Parallel()
	d := newDash(t, ui.Config{})
	holdLease(t, d.pool, "order:1", "w", time.Minute, time.Time{}, nil)
	d.page(t, "/leases") // gets the CSRF cookie
	paths := ui.ActionPaths()
	if len(paths) < 3 {
		t.Fatalf("the table lists actions %v, want expire, set-limit and retry at least", paths)
	}
	for _, path := range paths {
		code, body, _ := d.do(t, http.MethodPost, path, url.Values{"name": {"order:1"}, "key": {"k"}, "limit": {"2"}, "id": {"1"}, "confirmed": {"yes"}})
		if code != http.StatusForbidden || !strings.Contains(body, "--allow-actions") {
			t.Fatalf("POST %s = %d %q, want 403 naming --allow-actions", path, code, body)
		}
	}
	if !leaseInfo(t, d.pool, "order:1").Held() {
		t.Fatal("a refused action expired the lease")
	}
	if es := auditEntries(t, d.pool); len(es) != 0 {
		t.Fatalf("refused actions were audited: %+v", es)
	}
}

// TestUIExpireLeaseAction: the Expire button's POST, with the page's CSRF token and the
// confirmation, expires the lease through leases.Expire and writes one audit row saying
// who, from where and what, in the same transaction.
func TestUIExpireLeaseAction(t *testing.T) {
	t.Parallel()
	d := newDash(t, ui.Config{AllowActions: true})
	l := holdLease(t, d.pool, "order:7", "worker-a", time.Minute, time.Time{}, nil)
	page := d.page(t, "/leases")
	contains(t, "leases page with actions", page, `action="/actions/lease/expire"`, `data-confirm="Expire lease order:7`)

	code, _, resp := d.do(t, http.MethodPost, "/actions/lease/expire",
		url.Values{"csrf": {csrf(t, page)}, "name": {"order:7"}, "confirmed": {"yes"}}, "Origin", d.url)
	if code != http.StatusSeeOther || !strings.HasPrefix(resp.Header.Get("Location"), "/leases?flash=") {
		t.Fatalf("POST expire = %d to %q, want 303 back to /leases", code, resp.Header.Get("Location"))
	}
	i := leaseInfo(t, d.pool, "order:7")
	if i.Held() || i.ExpiredBy != "local via pgcoord-ui" {
		t.Fatalf("lease after the action: held %v, expired by %q", i.Held(), i.ExpiredBy)
	}
	es := auditEntries(t, d.pool)
	if len(es) != 1 {
		t.Fatalf("%d audit rows, want 1", len(es))
	}
	e := es[0]
	if e.Actor != "local" || e.Action != "lease.expire" || e.Target != "order:7" || !strings.HasPrefix(e.RemoteAddr, "127.0.0.1:") ||
		e.Details["holder"] != "worker-a" || e.Details["fence_token"] != float64(l.Token) || e.At.IsZero() {
		t.Fatalf("audit row %+v", e)
	}
	contains(t, "page after the action", d.page(t, resp.Header.Get("Location")),
		`<p class="flash" role="status">expired lease &#34;order:7&#34;: it was held by worker-a`)
	// The entry records the dashboard's login role beside the operator's name, and the
	// lease's detail shows both.
	var login string
	if err := d.pool.QueryRow(t.Context(), "SELECT session_user").Scan(&login); err != nil {
		t.Fatal(err)
	}
	if e.SessionRole != login {
		t.Fatalf("audit row session role %q, want the dashboard's login %q", e.SessionRole, login)
	}
	contains(t, "lease detail after the action", d.page(t, "/leases?name=order:7"),
		`<th>Who</th><th>Login</th>`, `<td>local</td><td>`+login+`</td><td>lease.expire</td>`)

	// Expiring it again changes nothing, is refused with 409 and is not audited.
	code, body, _ := d.do(t, http.MethodPost, "/actions/lease/expire",
		url.Values{"csrf": {csrf(t, page)}, "name": {"order:7"}, "confirmed": {"yes"}})
	if code != http.StatusConflict || !strings.Contains(body, "not held") {
		t.Fatalf("second expire = %d %q, want 409 not held", code, body)
	}
	if n := len(auditEntries(t, d.pool)); n != 1 {
		t.Fatalf("%d audit rows after a refused action, want 1", n)
	}
}

// TestUISetLimitAction: the set-limit form changes the key's limit through
// semaphore.SetLimit and audits the old and new limits; bad limits are refused.
func TestUISetLimitAction(t *testing.T) {
	t.Parallel()
	d := newDash(t, ui.Config{AllowActions: true, Token: testToken})
	permit(t, d.pool, "tenant:9", "w", 2, time.Minute, time.Time{})
	auth := []string{"Authorization", "Bearer " + testToken}
	_, page, _ := d.do(t, http.MethodGet, "/semaphores", nil, auth...)
	token := csrf(t, page)
	post := func(limit string) (int, string) {
		code, body, _ := d.do(t, http.MethodPost, "/actions/semaphore/set-limit",
			url.Values{"csrf": {token}, "key": {"tenant:9"}, "limit": {limit}, "confirmed": {"yes"}}, auth...)
		return code, body
	}
	for _, bad := range []string{"0", "-1", "x", ""} {
		if code, body := post(bad); code != http.StatusBadRequest || !strings.Contains(body, "at least 1") {
			t.Fatalf("limit %q = %d %q, want 400", bad, code, body)
		}
	}
	if code, _ := post("5"); code != http.StatusSeeOther {
		t.Fatalf("set limit 5 = %d, want 303", code)
	}
	s, err := semaphore.Get(t.Context(), d.pool, "tenant:9")
	if err != nil || s.Limit != 5 {
		t.Fatalf("limit after the action = %d (%v), want 5", s.Limit, err)
	}
	es := auditEntries(t, d.pool)
	if len(es) != 1 || es[0].Action != "semaphore.set_limit" || es[0].Target != "tenant:9" ||
		!strings.HasPrefix(es[0].Actor, "bearer token:") || es[0].Details["limit"] != float64(5) || es[0].Details["previous_limit"] != float64(2) {
		t.Fatalf("audit rows %+v", es)
	}
	code, body, _ := d.do(t, http.MethodPost, "/actions/semaphore/set-limit",
		url.Values{"csrf": {token}, "key": {"tenant:none"}, "limit": {"3"}, "confirmed": {"yes"}}, auth...)
	if code != http.StatusNotFound || !strings.Contains(body, "no such semaphore") {
		t.Fatalf("set limit of an unknown key = %d %q, want 404", code, body)
	}
}

// TestUICSRFRefusals: an action without the CSRF cookie, without or with a wrong token,
// from another Origin, or without confirmation is refused and changes nothing.
func TestUICSRFRefusals(t *testing.T) {
	t.Parallel()
	d := newDash(t, ui.Config{AllowActions: true})
	holdLease(t, d.pool, "order:5", "w", time.Minute, time.Time{}, nil)
	page := d.page(t, "/leases")
	good := csrf(t, page)
	form := func(csrf, confirmed string) url.Values {
		return url.Values{"csrf": {csrf}, "name": {"order:5"}, "confirmed": {confirmed}}
	}
	cases := []struct {
		name    string
		form    url.Values
		headers []string
		status  int
		want    string
	}{
		{"no token", form("", "yes"), nil, http.StatusForbidden, "CSRF"},
		{"wrong token", form(strings.Repeat("0", 64), "yes"), nil, http.StatusForbidden, "CSRF"},
		{"other origin", form(good, "yes"), []string{"Origin", "https://evil.example"}, http.StatusForbidden, "another site"},
		{"not confirmed", form(good, ""), nil, http.StatusBadRequest, "not confirmed"},
	}
	for _, c := range cases {
		code, body, _ := d.do(t, http.MethodPost, "/actions/lease/expire", c.form, c.headers...)
		if code != c.status || !strings.Contains(body, c.want) {
			t.Errorf("%s: %d %q, want %d mentioning %q", c.name, code, body, c.status, c.want)
		}
	}
	// Another browser (no cookie) replaying this browser's token is refused too.
	other := newDashClient(d)
	code, body, _ := other.do(t, http.MethodPost, "/actions/lease/expire", form(good, "yes"))
	if code != http.StatusForbidden || !strings.Contains(body, "no CSRF cookie") {
		t.Errorf("token without its cookie: %d %q, want 403", code, body)
	}
	if !leaseInfo(t, d.pool, "order:5").Held() {
		t.Fatal("a refused action expired the lease")
	}
	if es := auditEntries(t, d.pool); len(es) != 0 {
		t.Fatalf("refused actions were audited: %+v", es)
	}
	// A GET cannot act.
	if code, _, _ := d.do(t, http.MethodGet, "/actions/lease/expire?name=order:5&confirmed=yes&csrf="+good, nil); code != http.StatusMethodNotAllowed {
		t.Fatalf("GET on an action = %d, want 405", code)
	}
}
