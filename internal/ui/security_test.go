package ui_test

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/pgcoord/pgcoord/internal/base"
	"github.com/pgcoord/pgcoord/internal/ui"
	"github.com/pgcoord/pgcoord/outbox"
	"github.com/pgcoord/pgcoord/pgcoord"
	"github.com/pgcoord/pgcoord/singleton"
)

// DNS rebinding: a page of attacker.example whose name now resolves to 127.0.0.1 sends
// its requests with Host attacker.example. Without a token the dashboard must answer
// nothing to it — no page, no CSRF token, no /metrics, no action — and a POST from that
// origin is refused even with a loopback Host.
func TestUIRefusesRebindingAndForeignOrigins(t *testing.T) {
	t.Parallel()
	d := newDash(t, ui.Config{AllowActions: true, ShowPayloads: true})
	holdLease(t, d.pool, "order:7", "worker-a", time.Minute, time.Time{}, nil)
	port := d.url[strings.LastIndex(d.url, ":")+1:]
	evil := "attacker.example:" + port
	for _, p := range []string{"/", "/leases", "/outbox", "/schedules", "/schedules/nightly", "/metrics", "/static/app.css", "/login"} {
		code, body, _ := d.do(t, http.MethodGet, p, nil, "Host", evil, "Accept", "text/html")
		if code != http.StatusMisdirectedRequest || strings.Contains(body, "csrf") {
			t.Errorf("GET %s with Host %s = %d, want 421 and nothing of the page", p, evil, code)
		}
	}
	page := d.page(t, "/leases")
	form := url.Values{"csrf": {csrf(t, page)}, "name": {"order:7"}, "confirmed": {"yes"}}
	if code, _, _ := d.do(t, http.MethodPost, "/actions/lease/expire", form, "Host", evil, "Origin", "http://"+evil); code != http.StatusMisdirectedRequest {
		t.Errorf("rebound POST = %d, want 421", code)
	}
	if code, _, _ := d.do(t, http.MethodPost, "/actions/lease/expire", form, "Origin", "http://"+evil); code != http.StatusForbidden {
		t.Errorf("POST from origin %s = %d, want 403", evil, code)
	}
	if i := leaseInfo(t, d.pool, "order:7"); !i.Held() {
		t.Fatal("a refused request expired the lease")
	}
	// The dashboard's own names keep working: loopback addresses and localhost.
	for _, host := range []string{"localhost:" + port, "127.0.0.1:" + port} {
		if code, _, _ := d.do(t, http.MethodGet, "/leases", nil, "Host", host); code != http.StatusOK {
			t.Errorf("GET /leases with Host %s = %d, want 200", host, code)
		}
	}
	_, page, _ = d.do(t, http.MethodGet, "/leases", nil, "Host", "localhost:"+port) // its cookies are localhost's
	form.Set("csrf", csrf(t, page))
	if code, body, _ := d.do(t, http.MethodPost, "/actions/lease/expire", form, "Origin", "http://localhost:"+port, "Host", "localhost:"+port); code != http.StatusSeeOther {
		t.Errorf("POST from the dashboard's own origin = %d (%s), want 303", code, body)
	}
}

// With a served port (Config.Addr), a loopback name at another port is another site.
func TestUIHostNeedsTheServedPort(t *testing.T) {
	t.Parallel()
	d := newDash(t, ui.Config{Addr: "127.0.0.1:1"}) // what the server believes it serves
	port := d.url[strings.LastIndex(d.url, ":")+1:]
	if code, _, _ := d.do(t, http.MethodGet, "/", nil, "Host", "localhost:"+port); code != http.StatusMisdirectedRequest {
		t.Errorf("Host localhost:%s for a dashboard served at port 1 = %d, want 421", port, code)
	}
	if code, _, _ := d.do(t, http.MethodGet, "/", nil, "Host", "localhost:1"); code != http.StatusOK {
		t.Errorf("Host localhost:1 for a dashboard served at port 1 = %d, want 200", code)
	}
}

// from returns a client of d's dashboard that connects from the loopback address ip.
func from(d *dash, ip string) *dash {
	c := newDashClient(d)
	dialer := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
	c.client.Transport = &http.Transport{DialContext: dialer.DialContext}
	return c
}

// Login: a strong token is required, guessing is slowed down (the right token is refused
// too while a client is locked out), a login lasts SessionTTL and ends at sign-out for
// good, and a redirect after it never leaves the dashboard.
func TestUILoginDefenses(t *testing.T) {
	t.Parallel()
	if _, err := ui.New(ui.Config{Pool: newDash(t, ui.Config{}).pool, Token: "s3cret"}); !errors.Is(err, pgcoord.ErrInvalidArgument) || !strings.Contains(err.Error(), "openssl rand") {
		t.Fatalf("a 6-character token: %v, want ErrInvalidArgument saying how to make one", err)
	}

	d := newDash(t, ui.Config{Token: testToken, AllowActions: true})
	for i := range 5 {
		if code, _, _ := d.do(t, http.MethodPost, "/login", url.Values{"name": {"mallory"}, "token": {"guess"}}); code != http.StatusUnauthorized {
			t.Fatalf("wrong guess %d = %d, want 401", i+1, code)
		}
	}
	code, body, resp := d.do(t, http.MethodPost, "/login", url.Values{"name": {"mallory"}, "token": {testToken}})
	if code != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" || !strings.Contains(body, "too many") {
		t.Fatalf("login after 5 wrong guesses = %d, want 429 with Retry-After, even with the right token", code)
	}

	for _, next := range []string{"/\t/evil.example", "/%09/evil.example", "//evil.example/", `/\evil.example`, "https://evil.example/", "/\n/evil.example", "/nowhere"} {
		alice := newDashClient(newDash(t, ui.Config{Token: testToken}))
		_, _, resp := alice.do(t, http.MethodPost, "/login", url.Values{"name": {"alice"}, "token": {testToken}, "next": {next}})
		if loc := resp.Header.Get("Location"); loc != "/" {
			t.Errorf("login with next=%q redirects to %q, want /", next, loc)
		}
		code, body, _ := alice.do(t, http.MethodGet, "/login?next="+url.QueryEscape(next), nil)
		if code != http.StatusOK || !strings.Contains(body, `name="next" value="/"`) {
			t.Errorf("login form with next=%q: %d, want it to carry next=/", next, code)
		}
	}

	alice := from(d, "127.0.0.2") // another client address than the locked-out one
	code, _, resp = alice.do(t, http.MethodPost, "/login", url.Values{"name": {"alice"}, "token": {testToken}, "next": {"/jobs?x=1"}})
	if code != http.StatusSeeOther || resp.Header.Get("Location") != "/jobs?x=1" {
		t.Fatalf("login = %d to %q, want 303 to /jobs?x=1", code, resp.Header.Get("Location"))
	}
	var session *http.Cookie
	for _, c := range resp.Cookies() {
		if c.Name == "pgcoord_ui_auth" {
			session = c
		}
	}
	if session == nil || session.MaxAge != int(ui.SessionTTL.Seconds()) {
		t.Fatalf("login cookie %+v, want one expiring after SessionTTL", session)
	}
	page := alice.page(t, "/leases")
	contains(t, "a signed-in page", page, `action="/logout"`)
	if code, _, _ := alice.do(t, http.MethodPost, "/logout", url.Values{"csrf": {csrf(t, page)}}); code != http.StatusSeeOther {
		t.Fatalf("logout = %d, want 303", code)
	}
	// The cookie, replayed as a thief who copied it would, no longer signs anyone in.
	stolen := newDashClient(d)
	if code, _, _ := stolen.do(t, http.MethodGet, "/leases", nil, "Cookie", session.Name+"="+session.Value); code != http.StatusUnauthorized {
		t.Fatalf("GET with the cookie of a signed-out session = %d, want 401", code)
	}
}

// Issue 28, Medium 3: failed logins from many addresses do not lock the operator out.
// 1,000 wrong tokens from 300 client addresses, then the right token from an address that
// has not failed: it signs in (before, a bucket shared by all clients was empty by then,
// and the right token got 429).
func TestUILoginFloodDoesNotLockOutTheOperator(t *testing.T) {
	t.Parallel()
	d := newDash(t, ui.Config{Token: testToken})
	attackers := make([]*dash, 300)
	for i := range attackers {
		attackers[i] = from(d, fmt.Sprintf("127.9.%d.%d", i/200, 1+i%200))
	}
	refused := 0
	for i := range 1000 {
		a := attackers[i%len(attackers)]
		code, _, _ := a.do(t, http.MethodPost, "/login", url.Values{"name": {"mallory"}, "token": {fmt.Sprintf("guess-%d", i)}})
		switch code {
		case http.StatusUnauthorized:
		case http.StatusTooManyRequests:
			refused++
		default:
			t.Fatalf("wrong guess %d = %d, want 401 or 429", i, code)
		}
	}
	for _, a := range attackers {
		a.client.CloseIdleConnections()
	}
	// 300 addresses of 5 tries each: 1,000 guesses are all checked, none limited.
	if refused != 0 {
		t.Errorf("%d of 1,000 guesses from 300 addresses were refused, want none (5 per address)", refused)
	}
	// The first address tried 4 times; its fifth guess ends its burst, and it stays locked
	// out.
	if code, _, _ := attackers[0].do(t, http.MethodPost, "/login", url.Values{"name": {"mallory"}, "token": {"guess"}}); code != http.StatusUnauthorized {
		t.Errorf("an attacker address's fifth guess = %d, want 401", code)
	}
	if code, _, _ := attackers[0].do(t, http.MethodPost, "/login", url.Values{"name": {"mallory"}, "token": {testToken}}); code != http.StatusTooManyRequests {
		t.Errorf("an attacker address past its burst = %d, want 429 even with the right token", code)
	}
	operator := from(d, "127.8.0.1")
	code, body, resp := operator.do(t, http.MethodPost, "/login", url.Values{"name": {"alice"}, "token": {testToken}, "next": {"/leases"}})
	if code != http.StatusSeeOther || resp.Header.Get("Location") != "/leases" {
		t.Fatalf("the operator's right token from a fresh address after the flood = %d, want 303 to /leases: %s", code, body)
	}
	operator.page(t, "/leases")
}

// A link cannot make the dashboard speak: ?msg= and a made-up ?flash= show nothing, while
// an action's own result shows on the page it returns to.
func TestUIMessagesComeFromTheServer(t *testing.T) {
	t.Parallel()
	d := newDash(t, ui.Config{AllowActions: true})
	lie := "Your session expired: call +1 555 0100 to restore access"
	for _, q := range []string{"?msg=", "?flash=", "?flash=0123abcd&msg="} {
		if body := d.page(t, "/leases"+q+url.QueryEscape(lie)); strings.Contains(body, "555 0100") {
			t.Fatalf("GET /leases%s<text> shows the text", q)
		}
	}
	holdLease(t, d.pool, "order:8", "worker-a", time.Minute, time.Time{}, nil)
	page := d.page(t, "/leases")
	_, _, resp := d.do(t, http.MethodPost, "/actions/lease/expire",
		url.Values{"csrf": {csrf(t, page)}, "name": {"order:8"}, "confirmed": {"yes"}})
	contains(t, "the page an action returns to", d.page(t, resp.Header.Get("Location")), `class="flash"`, "order:8")
}

// Issue 28, Medium 6: a token of one repeated character, or a string repeated, is refused
// however long, saying how to make a good one.
func TestUIRefusesWeakTokens(t *testing.T) {
	t.Parallel()
	pool := newDash(t, ui.Config{}).pool
	for _, tok := range []string{strings.Repeat("a", 32), strings.Repeat("a", 64), "0123456789abcdef0123456789abcdef"} {
		_, err := ui.New(ui.Config{Pool: pool, Token: tok})
		if !errors.Is(err, pgcoord.ErrInvalidArgument) || !strings.Contains(err.Error(), "openssl rand -hex 32") {
			t.Errorf("token %q: %v, want ErrInvalidArgument saying `openssl rand -hex 32`", tok, err)
		}
	}
}

// Issue 28, Low: a dashboard with actions on an address beyond loopback without a token
// does not start (the command checks it too: TestUICommandBadListen).
func TestUIActionsBeyondLoopbackNeedAToken(t *testing.T) {
	t.Parallel()
	pool := newDash(t, ui.Config{}).pool
	for _, addr := range []string{"0.0.0.0:8080", ":8080", "192.168.1.5:8080"} {
		if _, err := ui.New(ui.Config{Pool: pool, Addr: addr, AllowActions: true}); !errors.Is(err, pgcoord.ErrInvalidArgument) || !strings.Contains(err.Error(), "token") {
			t.Errorf("Addr %s, actions, no token: %v, want ErrInvalidArgument asking for a token", addr, err)
		}
	}
	if _, err := ui.New(ui.Config{Pool: pool, Addr: "0.0.0.0:8080", AllowActions: true, Token: testToken}); err != nil {
		t.Errorf("Addr 0.0.0.0:8080 with a token: %v", err)
	}
}

// Issue 28, Info: the dashboard refuses to be framed by old browsers too (X-Frame-Options
// beside CSP frame-ancestors), and a client's own X-Forwarded-Proto does not decide the
// cookies' Secure flag unless the dashboard trusts a proxy.
func TestUIFramingAndForwardedProto(t *testing.T) {
	t.Parallel()
	for _, trust := range []bool{false, true} {
		d := newDash(t, ui.Config{Token: testToken, TrustProxy: trust})
		_, _, resp := d.do(t, http.MethodPost, "/login", url.Values{"name": {"alice"}, "token": {testToken}}, "X-Forwarded-Proto", "https")
		if got := resp.Header.Get("X-Frame-Options"); got != "DENY" {
			t.Errorf("X-Frame-Options = %q, want DENY", got)
		}
		var c *http.Cookie
		for _, k := range resp.Cookies() {
			if k.Name == "pgcoord_ui_auth" {
				c = k
			}
		}
		if c == nil {
			t.Fatalf("TrustProxy %v: no login cookie (%d)", trust, resp.StatusCode)
		}
		if c.Secure != trust {
			t.Errorf("TrustProxy %v, X-Forwarded-Proto: https from the client: cookie Secure = %v, want %v", trust, c.Secure, trust)
		}
	}
}

// Issue 28, Info: stored text — a run's error, a dead message's last_error and payload —
// is shown with its control characters visible (\x1b), never raw: html/template escapes
// HTML but not ESC, which a terminal obeys when the page's text is copied into it.
func TestUIShowsControlCharactersVisibly(t *testing.T) {
	t.Parallel()
	d := newDash(t, ui.Config{ShowPayloads: true})
	evil := "boom\x1b]0;pwned\x07\x1b[2J\u202eevil\u009b"
	job := singleton.Job{Name: "nightly", Every: time.Hour}
	tick(t, d.pool, job, time.Time{}, true, errors.New(evil))
	enqueue(t, d.pool, outbox.Message{Topic: "orders", Key: "k", Payload: []byte("poison " + evil)})
	relayOnce(t, d.pool)
	for _, p := range []string{"/jobs", "/jobs?job=nightly", "/outbox", "/outbox?topic=orders&key=k", "/"} {
		body := d.page(t, p)
		if i := strings.IndexFunc(body, func(r rune) bool { return r != '\n' && r != '\t' && base.IsControl(r) }); i >= 0 {
			t.Errorf("GET %s shows a raw control character %q at %d: …%q…", p, body[i], i, body[max(i-40, 0):min(i+40, len(body))])
		}
	}
	contains(t, "the job's runs", d.page(t, "/jobs?job=nightly"), `boom\x1b]0;pwned\x07\x1b[2J\u202eevil\x9b`)
	contains(t, "the dead messages", d.page(t, "/outbox"), `poison boom\x1b]0;pwned`)
}

// Issue 28, Low: a link cannot put its own text on a page. Every detail and filter
// parameter of a GET — a lease, a job, a semaphore key, an idempotency key, an outbox topic
// or key, a schedule, a state, a page — is shown back only when it names something that exists; an
// unknown one is "not found", without its text.
func TestUILinksCannotPutTextOnAPage(t *testing.T) {
	t.Parallel()
	d := newDash(t, ui.Config{})
	outboxState(t, d.pool)
	lie := "Your session expired: call +1 555 0100 to restore access"
	q := url.QueryEscape(lie)
	for _, p := range []string{
		"/leases?name=" + q, "/jobs?job=" + q, "/semaphores?key=" + q,
		"/idempotency?scope=" + q + "&key=" + q, "/idempotency?scope=payments&key=" + q, "/idempotency?state=" + q,
		"/outbox?topic=" + q, "/outbox?topic=orders&key=" + q, "/outbox?key=" + q, "/outbox?after=" + q,
		"/leases?name=job:" + q, "/schedules/" + url.PathEscape(lie), "/schedules?after=" + q,
	} {
		for _, accept := range []string{"text/html", "*/*"} {
			code, body, _ := d.do(t, http.MethodGet, p, nil, "Accept", accept)
			if strings.Contains(body, "555 0100") {
				t.Errorf("GET %s (Accept %s) = %d shows the link's text", p, accept, code)
			}
		}
	}
}

// Issue 28, Medium 3 behind a proxy: every request comes from the proxy's address. With
// TrustProxy the limiter counts the address the proxy appended to X-Forwarded-For, so an
// attacker behind the same proxy does not lock the operator out; without it the header is
// the client's own word, and sending a new one every time does not buy new tries.
func TestUILoginLimiterAndForwardedFor(t *testing.T) {
	t.Parallel()
	for _, trust := range []bool{false, true} {
		d := newDash(t, ui.Config{Token: testToken, TrustProxy: trust})
		for i := range 8 {
			xff := fmt.Sprintf("198.51.100.%d, 203.0.113.9", i) // the client's claim, then the proxy's
			code, _, _ := d.do(t, http.MethodPost, "/login", url.Values{"name": {"mallory"}, "token": {"guess"}}, "X-Forwarded-For", xff)
			if want := http.StatusUnauthorized; i >= 5 && code != http.StatusTooManyRequests || i < 5 && code != want {
				t.Fatalf("TrustProxy %v: guess %d = %d, want 401 for the first 5, then 429", trust, i+1, code)
			}
		}
		code, _, _ := d.do(t, http.MethodPost, "/login", url.Values{"name": {"alice"}, "token": {testToken}}, "X-Forwarded-For", "192.0.2.44")
		if want := map[bool]int{false: http.StatusTooManyRequests, true: http.StatusSeeOther}[trust]; code != want {
			t.Errorf("TrustProxy %v: the operator's token from another forwarded address = %d, want %d", trust, code, want)
		}
	}
}
