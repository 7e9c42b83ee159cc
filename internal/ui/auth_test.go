package ui_test

import (
	"errors"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/pgcoord/pgcoord/internal/ui"
)

// TestUITokenAuth: with a token, pages and /metrics refuse requests without it (401, or a
// redirect to the login form for browsers), accept the Bearer header, and accept a browser
// after it signs in with the token; the login form and its assets stay public.
func TestUITokenAuth(t *testing.T) {
	t.Parallel()
	d := newDash(t, ui.Config{Token: testToken})
	for _, p := range []string{"/", "/leases", "/jobs", "/schedules", "/semaphores", "/metrics"} {
		if code, _, resp := d.do(t, http.MethodGet, p, nil); code != http.StatusUnauthorized || resp.Header.Get("WWW-Authenticate") == "" {
			t.Errorf("GET %s without token = %d, want 401 with WWW-Authenticate", p, code)
		}
		if code, _, _ := d.do(t, http.MethodGet, p, nil, "Authorization", "Bearer wrong"); code != http.StatusUnauthorized {
			t.Errorf("GET %s with a wrong token = %d, want 401", p, code)
		}
		if code, _, _ := d.do(t, http.MethodGet, p, nil, "Authorization", "Bearer "+testToken); code != http.StatusOK {
			t.Errorf("GET %s with the token = %d, want 200", p, code)
		}
	}
	if code, _, _ := d.do(t, http.MethodPost, "/actions/lease/expire", url.Values{"name": {"x"}}); code != http.StatusUnauthorized {
		t.Errorf("POST action without token = %d, want 401", code)
	}
	if code, _, _ := d.do(t, http.MethodGet, "/static/app.css", nil); code != http.StatusOK {
		t.Errorf("GET /static/app.css = %d, want 200 (the login form needs it)", code)
	}

	// A browser is sent to the login form, and back after signing in.
	code, _, resp := d.do(t, http.MethodGet, "/jobs", nil, "Accept", "text/html")
	if code != http.StatusSeeOther || resp.Header.Get("Location") != "/login?next=%2Fjobs" {
		t.Fatalf("browser GET /jobs = %d to %q, want 303 to the login form", code, resp.Header.Get("Location"))
	}
	contains(t, "login form", d.page(t, "/login?next=/jobs"), `name="token"`, `name="next" value="/jobs"`)
	code, body, _ := d.do(t, http.MethodPost, "/login", url.Values{"name": {"alice"}, "token": {"guess"}, "next": {"/jobs"}})
	if code != http.StatusUnauthorized || !strings.Contains(body, "wrong token") {
		t.Fatalf("login with a wrong token = %d, want 401", code)
	}
	if code, _, _ := d.do(t, http.MethodGet, "/jobs", nil); code != http.StatusUnauthorized {
		t.Fatalf("a failed login let the browser in: %d", code)
	}
	code, _, resp = d.do(t, http.MethodPost, "/login", url.Values{"name": {"alice"}, "token": {testToken}, "next": {"/jobs"}})
	if code != http.StatusSeeOther || resp.Header.Get("Location") != "/jobs" {
		t.Fatalf("login = %d to %q, want 303 to /jobs", code, resp.Header.Get("Location"))
	}
	for _, c := range resp.Cookies() {
		if c.Name == "pgcoord_ui_auth" && (!c.HttpOnly || c.SameSite != http.SameSiteStrictMode || strings.Contains(c.Value, testToken) || c.MaxAge != int(ui.SessionTTL.Seconds())) {
			t.Fatalf("login cookie %+v: want HttpOnly, SameSite=Strict, expiring after SessionTTL, not the token itself", c)
		}
	}
	d.page(t, "/jobs")
	// An open redirect after login is refused.
	_, _, resp = d.do(t, http.MethodPost, "/login", url.Values{"name": {"alice"}, "token": {testToken}, "next": {"//evil.example/"}})
	if loc := resp.Header.Get("Location"); loc != "/" {
		t.Fatalf("login with next=//evil.example/ redirects to %q, want /", loc)
	}
}

// TestUICheckListen: loopback needs no token; anything else needs one; bad addresses fail.
func TestUICheckListen(t *testing.T) {
	t.Parallel()
	for _, addr := range []string{"127.0.0.1:8080", "localhost:0", "[::1]:8080", "127.0.0.2:1"} {
		if err := ui.CheckListen(addr, false); err != nil {
			t.Errorf("CheckListen(%q) = %v, want nil", addr, err)
		}
	}
	for _, addr := range []string{"0.0.0.0:8080", ":8080", "[::]:8080", "192.168.1.5:8080", "example.com:80"} {
		if err := ui.CheckListen(addr, false); !errors.Is(err, ui.ErrNeedsToken) {
			t.Errorf("CheckListen(%q) without token = %v, want ErrNeedsToken", addr, err)
		}
		if err := ui.CheckListen(addr, true); err != nil {
			t.Errorf("CheckListen(%q) with a token = %v, want nil", addr, err)
		}
	}
	for _, addr := range []string{"8080", "127.0.0.1", "127.0.0.1:http-nope", "127.0.0.1:99999"} {
		if err := ui.CheckListen(addr, true); err == nil || errors.Is(err, ui.ErrNeedsToken) {
			t.Errorf("CheckListen(%q) = %v, want a bad-address error", addr, err)
		}
	}
}
