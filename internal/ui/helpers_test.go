package ui_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/idempotency"
	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/internal/ui"
	"github.com/pgcoord/pgcoord/internal/ui/audit"
	"github.com/pgcoord/pgcoord/leases"
	"github.com/pgcoord/pgcoord/outbox"
	"github.com/pgcoord/pgcoord/semaphore"
	"github.com/pgcoord/pgcoord/singleton"
)

// dash is a dashboard on a fresh migrated schema, served by httptest, with a browser-like
// client: it keeps cookies and does not follow redirects.
type dash struct {
	pool   *pgxpool.Pool
	url    string
	client *http.Client
}

// testToken is a dashboard token of the minimum strength (128 bits, as `openssl rand -hex 16` prints).
const testToken = "5e1f0c9a27d84b36a0f2c7e19d4b8a63"

func newDash(t *testing.T, cfg ui.Config) *dash {
	t.Helper()
	pool := pgtest.Pool(t)
	cfg.Pool = pool
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(t.Output(), nil))
	}
	srv, err := ui.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv)
	t.Cleanup(hs.Close)
	jar, _ := cookiejar.New(nil)
	return &dash{pool: pool, url: hs.URL, client: &http.Client{
		Jar: jar, Timeout: pgtest.WaitLimit,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}}
}

// do sends a request with the given headers (pairs) and returns the status, body and
// response.
func (d *dash) do(t *testing.T, method, path string, form url.Values, headers ...string) (int, string, *http.Response) {
	t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequestWithContext(t.Context(), method, d.url+path, body)
	if err != nil {
		t.Fatal(err)
	}
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	for i := 0; i+1 < len(headers); i += 2 {
		if headers[i] == "Host" { // what a browser sends for a name resolved to this server
			req.Host = headers[i+1]
			continue
		}
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := d.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b), resp
}

// page GETs path as a browser does and fails unless it answers 200.
func (d *dash) page(t *testing.T, path string) string {
	t.Helper()
	code, body, _ := d.do(t, http.MethodGet, path, nil, "Accept", "text/html")
	if code != http.StatusOK {
		t.Fatalf("GET %s = %d: %s", path, code, body)
	}
	return body
}

var csrfField = regexp.MustCompile(`name="csrf" value="([0-9a-f]+)"`)

// csrf reads the CSRF token from a page's forms.
func csrf(t *testing.T, body string) string {
	t.Helper()
	m := csrfField.FindStringSubmatch(body)
	if m == nil {
		t.Fatal("no CSRF token in the page (are actions enabled?)")
	}
	return m[1]
}

// contains fails the test unless body contains every want.
func contains(t *testing.T, what, body string, want ...string) {
	t.Helper()
	for _, w := range want {
		if !strings.Contains(body, w) {
			t.Errorf("%s lacks %q", what, w)
		}
	}
	if t.Failed() {
		t.Logf("%s:\n%s", what, body)
		t.FailNow()
	}
}

func holdLease(t *testing.T, pool *pgxpool.Pool, name, holder string, ttl time.Duration, now time.Time, meta map[string]string) leases.Lease {
	t.Helper()
	var l leases.Lease
	var err error
	pgtest.At(t, pool, now, func() {
		l, err = leases.TryAcquire(t.Context(), pool, name, ttl, &leases.AcquireOpts{Holder: holder, Metadata: meta})
	})
	if err != nil {
		t.Fatalf("acquire %s: %v", name, err)
	}
	return l
}

func leaseInfo(t *testing.T, pool *pgxpool.Pool, name string) leases.Info {
	t.Helper()
	i, err := leases.Get(t.Context(), pool, name)
	if err != nil {
		t.Fatal(err)
	}
	return i
}

func permit(t *testing.T, pool *pgxpool.Pool, key, holder string, limit int, ttl time.Duration, now time.Time) {
	t.Helper()
	var err error
	pgtest.At(t, pool, now, func() {
		_, err = semaphore.TryAcquire(t.Context(), pool, key, limit, ttl, &semaphore.AcquireOpts{Holder: holder})
	})
	if err != nil {
		t.Fatalf("acquire %s for %s: %v", key, holder, err)
	}
}

// tick claims job's tick as of at and finishes it with runErr (it stays running when
// finish is false).
func tick(t *testing.T, pool *pgxpool.Pool, job singleton.Job, at time.Time, finish bool, runErr error) {
	t.Helper()
	var run singleton.Run
	var err error
	pgtest.At(t, pool, at, func() { run, err = singleton.ClaimTick(t.Context(), pool, job, nil) })
	if err != nil {
		t.Fatalf("claim %s at %v: %v", job.Name, at, err)
	}
	if finish {
		if err := singleton.FinishTick(t.Context(), pool, run, runErr); err != nil {
			t.Fatalf("finish %s: %v", job.Name, err)
		}
	}
}

func auditEntries(t *testing.T, pool *pgxpool.Pool) []audit.Entry {
	t.Helper()
	es, err := audit.List(context.Background(), pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	return es
}

var errBoom = errors.New("boom: upstream refused")

// dbNow is the database clock.
func dbNow(t *testing.T, pool *pgxpool.Pool) time.Time {
	t.Helper()
	var now time.Time
	if err := pool.QueryRow(t.Context(), "SELECT now()").Scan(&now); err != nil {
		t.Fatal(err)
	}
	return now
}

// newDashClient is another browser on the same dashboard: no cookies.
func newDashClient(d *dash) *dash {
	jar, _ := cookiejar.New(nil)
	c := *d.client
	c.Jar = jar
	return &dash{pool: d.pool, url: d.url, client: &c}
}

// enqueue writes msgs in one committed transaction (outbox.Enqueue) and returns them.
func enqueue(t *testing.T, pool *pgxpool.Pool, msgs ...outbox.Message) []outbox.Message {
	t.Helper()
	var out []outbox.Message
	err := pgx.BeginFunc(t.Context(), pool, func(tx pgx.Tx) error {
		for _, m := range msgs {
			got, err := outbox.Enqueue(t.Context(), tx, m)
			if err != nil {
				return err
			}
			out = append(out, got)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// relayOnce runs one batch of a relay (MaxAttempts 1) whose handler fails the messages
// whose payload starts with "poison" with errBoom — they go dead — and delivers the rest.
func relayOnce(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	r, err := outbox.NewRelay(pool, &outbox.Config{MaxAttempts: 1, Handler: outbox.HandlerFunc(func(_ context.Context, m outbox.Message) error {
		if strings.HasPrefix(string(m.Payload), "poison") {
			return errBoom
		}
		return nil
	})})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.RunBatch(t.Context()); err != nil {
		t.Fatal(err)
	}
	// Its share of the keys goes to the next relayOnce's relay at once, not in ClaimTTL.
	if err := r.Leave(t.Context()); err != nil {
		t.Fatal(err)
	}
}

// beginKey starts an idempotency attempt on (scope, key) that commits the recovery point
// and holds the key until the test ends; with dead, its backend is then terminated, so
// the key is stuck: in flight, held by nobody.
func beginKey(t *testing.T, pool *pgxpool.Pool, scope, key, point string, dead bool) {
	t.Helper()
	ctx := context.Background()
	a, err := idempotency.Begin(ctx, pool, scope, key, []byte("fingerprint"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close(ctx) })
	if err := a.Checkpoint(ctx, point, nil); err != nil {
		t.Fatal(err)
	}
	if !dead {
		return
	}
	// The attempt dies: its key is left as a dead process leaves it, its lease lapsed.
	if _, err := pool.Exec(ctx, `UPDATE pgcoord_idempotency_keys SET holder = 'dead-process', lease_expires_at = pgcoord_now() - interval '1 second'
		WHERE scope = $1 AND key = $2`, scope, key); err != nil {
		t.Fatal(err)
	}
	k, err := idempotency.Get(ctx, pool, scope, key)
	if err != nil || !k.Stuck() {
		t.Fatalf("%s/%s after killing its holder: %+v, %v; want stuck", scope, key, k, err)
	}
}

// completeKey stores a response for (scope, key).
func completeKey(t *testing.T, pool *pgxpool.Pool, scope, key string, body string) {
	t.Helper()
	ctx := t.Context()
	a, err := idempotency.Begin(ctx, pool, scope, key, []byte("fingerprint"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Complete(ctx, idempotency.Response{Status: 201, Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(body)}); err != nil {
		t.Fatal(err)
	}
}
