package cli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pgcoord/pgcoord/internal/cli"
	"github.com/pgcoord/pgcoord/internal/pgtest"
)

// syncBuffer is a bytes.Buffer safe for a server writing while the test reads.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

var listeningOn = regexp.MustCompile(`listening on (http://[^/ ]+)/`)

// served is a pgcoord server command running in the background.
type served struct {
	url    string
	stderr *syncBuffer
	stop   func() int // interrupts it and returns its exit code
}

// serve runs a server command (ui, metrics) on 127.0.0.1:0 against d's schema and waits
// until it says where it listens.
func serve(t *testing.T, d testDB, args ...string) served {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	var errOut syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- cli.Run(ctx, append(slices.Clone(d.flags), args...), io.Discard, &errOut)
	}()
	var base string
	waitFor(t, pgtest.WaitLimit, "the server to listen", func() bool {
		select {
		case code := <-done:
			t.Fatalf("pgcoord %v exited with %d: %s", args, code, errOut.String())
		default:
		}
		if m := listeningOn.FindStringSubmatch(errOut.String()); m != nil {
			base = m[1]
			return true
		}
		return false
	})
	stopped := false
	stop := func() int {
		cancel()
		stopped = true
		select {
		case code := <-done:
			return code
		case <-time.After(pgtest.WaitLimit):
			t.Fatal("the server did not stop")
			return -1
		}
	}
	t.Cleanup(func() {
		if !stopped {
			stop()
		}
	})
	return served{url: base, stderr: &errOut, stop: stop}
}

// get fetches url with the given headers (pairs).
func get(t *testing.T, url string, headers ...string) (int, string) {
	t.Helper()
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, url, nil)
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestUICommandServes: `pgcoord ui` says where it listens and that actions are off, serves
// the pages and /metrics, and exits 0 when interrupted.
func TestUICommandServes(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	grant(t, d.pool, "order:1", "worker-a", time.Minute, time.Time{})
	s := serve(t, d, "ui", "--listen", "127.0.0.1:0")
	if msg := s.stderr.String(); !strings.Contains(msg, "actions disabled") || !strings.Contains(msg, "no token") {
		t.Fatalf("start message %q does not say actions are disabled and no token is needed", msg)
	}
	code, body := get(t, s.url+"/leases")
	if code != http.StatusOK || !strings.Contains(body, `data-name="order:1"`) || !strings.Contains(body, "worker-a") {
		t.Fatalf("GET /leases = %d:\n%s", code, body)
	}
	if code, body := get(t, s.url+"/metrics"); code != http.StatusOK || !strings.Contains(body, "pgcoord_leases_held 1") {
		t.Fatalf("GET /metrics = %d:\n%s", code, body)
	}
	if code, _ := get(t, s.url+"/actions/lease/expire"); code != http.StatusMethodNotAllowed {
		t.Fatalf("GET on an action = %d, want 405", code)
	}
	if code := s.stop(); code != cli.ExitOK {
		t.Fatalf("exit %d after interrupt, want 0: %s", code, s.stderr.String())
	}
}

// TestUICommandToken: with a token the dashboard may listen beyond loopback,
// says a token is required, and refuses requests without it.
func TestUICommandToken(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	s := serve(t, d, "ui", "--listen", "0.0.0.0:0", "--auth-token", strongToken, "--allow-actions")
	if msg := s.stderr.String(); !strings.Contains(msg, "actions ENABLED") || !strings.Contains(msg, "token required") {
		t.Fatalf("start message %q", msg)
	}
	if msg := s.stderr.String(); !strings.Contains(msg, "warning: --auth-token shows in `ps`") || !strings.Contains(msg, "--auth-token-file or $PGCOORD_UI_TOKEN") {
		t.Fatalf("start message %q does not warn that a token given as a flag shows in ps", msg)
	}
	local := strings.Replace(s.url, "0.0.0.0", "127.0.0.1", 1)
	if code, _ := get(t, local+"/"); code != http.StatusUnauthorized {
		t.Fatalf("GET / without the token = %d, want 401", code)
	}
	if code, _ := get(t, local+"/", "Authorization", "Bearer "+strongToken); code != http.StatusOK {
		t.Fatalf("GET / with the token = %d, want 200", code)
	}
}

// TestUICommandBadListen: a bad --listen, or a non-loopback one without a token, fails
// before connecting, with exit 2 and a clear message.
func TestUICommandBadListen(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"ui", "--listen", "0.0.0.0:8080"}, "needs an auth token"},
		{[]string{"ui", "--listen", ":8080"}, "(--auth-token, or $PGCOORD_UI_TOKEN)"},
		{[]string{"ui", "--listen", "0.0.0.0:8080", "--allow-actions"}, "needs an auth token"},
		{[]string{"ui", "--auth-token", strongToken, "--auth-token-file", "/dev/null"}, "give one"},
		{[]string{"ui", "--auth-token-file", "/nonexistent/token"}, "--auth-token-file"},
		{[]string{"metrics", "--auth-token-file", "/dev/null"}, "empty"},
		{[]string{"ui", "--listen", "8080"}, "want host:port"},
		{[]string{"ui", "--refresh", "10ms"}, "--refresh"},
		{[]string{"metrics", "--listen", "192.168.0.1:9190"}, "(--auth-token, or $PGCOORD_METRICS_TOKEN)"},
		{[]string{"metrics", "--max-rows", "0"}, "--max-rows"},
	} {
		// An unreachable database: the check must fail before any connection.
		code, _, errOut := run(t, append([]string{"--database-url", "postgres://nobody@127.0.0.1:1/none"}, c.args...)...)
		if code != cli.ExitUsage || !strings.Contains(errOut, c.want) {
			t.Errorf("pgcoord %v = %d %q, want exit 2 mentioning %q", c.args, code, errOut, c.want)
		}
	}
}

// TestMetricsCommandServes: `pgcoord metrics` serves /metrics alone, and with a token
// requires it of every scrape.
func TestMetricsCommandServes(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	semGrant(t, d.pool, "tenant:1", "w", 4, time.Minute, time.Time{})
	s := serve(t, d, "metrics", "--listen", "127.0.0.1:0")
	code, body := get(t, s.url+"/metrics")
	if code != http.StatusOK || !strings.Contains(body, `pgcoord_semaphore_limit{key="tenant:1"} 4`) ||
		!strings.Contains(body, `pgcoord_semaphore_permits{key="tenant:1"} 1`) {
		t.Fatalf("GET /metrics = %d:\n%s", code, body)
	}
	if code, _ := get(t, s.url+"/leases"); code != http.StatusNotFound {
		t.Fatalf("GET /leases on the metrics server = %d, want 404 (no dashboard)", code)
	}
	s.stop()

	// The token from a file (its first line), as Prometheus's credentials_file holds it.
	file := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(file, []byte(strongToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s = serve(t, d, "metrics", "--listen", "127.0.0.1:0", "--auth-token-file", file)
	if strings.Contains(s.stderr.String(), "warning") {
		t.Fatalf("a token from a file warned: %s", s.stderr.String())
	}
	if code, _ := get(t, s.url+"/metrics"); code != http.StatusUnauthorized {
		t.Fatalf("scrape without the token = %d, want 401", code)
	}
	if code, _ := get(t, s.url+"/metrics", "Authorization", "Bearer "+strongToken); code != http.StatusOK {
		t.Fatalf("scrape with the token = %d, want 200", code)
	}
}

// strongToken is a token as `openssl rand -hex 16` prints.
const strongToken = "9b2e4f71c0a83d56e1f7b24c8a0d3e95"

// Issue 28, Medium 6: `pgcoord metrics` answers only loopback names without a token, as
// the dashboard does: a page of rebind.attacker.example, a name pointed at 127.0.0.1
// (DNS rebinding), cannot read /metrics from a browser.
func TestMetricsCommandRefusesRebinding(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	s := serve(t, d, "metrics", "--listen", "127.0.0.1:0")
	port := s.url[strings.LastIndex(s.url, ":")+1:]
	for host, want := range map[string]int{
		"rebind.attacker.example":         http.StatusMisdirectedRequest,
		"rebind.attacker.example:" + port: http.StatusMisdirectedRequest,
		"localhost:" + port:               http.StatusOK,
		"127.0.0.1:" + port:               http.StatusOK,
	} {
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, s.url+"/metrics", nil)
		req.Host = host
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != want || (want != http.StatusOK && strings.Contains(string(body), "pgcoord_up")) {
			t.Errorf("GET /metrics with Host %s = %d, want %d", host, resp.StatusCode, want)
		}
	}
}

// Issue 28, Medium 6: a weak token — 32 × 'a', a string repeated, too short — is refused
// by both servers before they connect, saying how to make a good one.
func TestServerCommandsRefuseWeakTokens(t *testing.T) {
	t.Parallel()
	file := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(file, []byte(strings.Repeat("a", 32)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, cmd := range []string{"ui", "metrics"} {
		for _, tok := range [][]string{
			{"--auth-token", strings.Repeat("a", 32)}, {"--auth-token", "0123456789abcdef0123456789abcdef"},
			{"--auth-token", "scrape-me"}, {"--auth-token-file", file},
		} {
			args := append([]string{"--database-url", "postgres://nobody@127.0.0.1:1/none", cmd}, tok...)
			code, _, errOut := run(t, args...)
			if code != cli.ExitUsage || !strings.Contains(errOut, "openssl rand -hex 32") {
				t.Errorf("pgcoord %v = %d %q, want exit 2 saying how to make a token", args[2:], code, errOut)
			}
		}
	}
}

// TestUIActionAuditedAndListed: an action taken in `pgcoord ui --allow-actions` (expire a
// lease, from the page's form) is listed by `pgcoord audit list` with who, from where and
// what.
func TestUIActionAuditedAndListed(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	grant(t, d.pool, "order:9", "worker-z", time.Minute, time.Time{})
	s := serve(t, d, "--actor", "ops-on-call", "ui", "--listen", "127.0.0.1:0", "--allow-actions")
	jar, _ := cookiejar.New(nil)
	client := &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := client.Get(s.url + "/leases")
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	m := regexp.MustCompile(`name="csrf" value="([0-9a-f]+)"`).FindSubmatch(page)
	if m == nil {
		t.Fatalf("no action form on /leases:\n%s", page)
	}
	resp, err = client.PostForm(s.url+"/actions/lease/expire", url.Values{"csrf": {string(m[1])}, "name": {"order:9"}, "confirmed": {"yes"}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("POST expire = %d, want 303", resp.StatusCode)
	}
	if getInfo(t, d.pool, "order:9").Held() {
		t.Fatal("the lease is still held after the action")
	}
	code, out, errOut := d.run(t, "--json", "audit", "list")
	var entries []struct {
		Actor, RemoteAddr, Action, Target string
		Details                           map[string]any
	}
	if err := json.Unmarshal([]byte(out), &entries); code != cli.ExitOK || err != nil {
		t.Fatalf("audit list = %d %v: %s %s", code, err, out, errOut)
	}
	if len(entries) != 1 || entries[0].Actor != "ops-on-call" || entries[0].Action != "lease.expire" ||
		entries[0].Target != "order:9" || entries[0].Details["holder"] != "worker-z" {
		t.Fatalf("audit entries %+v", entries)
	}
}
