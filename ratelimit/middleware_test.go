package ratelimit_test

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/ratelimit"
)

func serve(t *testing.T, db *pgxpool.Pool, cfg ratelimit.MiddlewareConfig) *httptest.Server {
	t.Helper()
	mw, err := ratelimit.Middleware(db, cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(mw(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "ok")
	})))
	t.Cleanup(srv.Close)
	return srv
}

func get(t *testing.T, url, apiKey string) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, url, nil)
	if apiKey != "" {
		req.Header.Set("X-Api-Key", apiKey)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp, string(body)
}

var byAPIKey = func(r *http.Request) ([]ratelimit.Limit, error) {
	k := r.Header.Get("X-Api-Key")
	if k == "" {
		return nil, errors.New("X-Api-Key is required")
	}
	return []ratelimit.Limit{{Policy: "api", Key: k}}, nil
}

// Within the burst a request passes with the draft's headers; past it, 429 with
// Retry-After and a problem document, and the handler does not run.
func TestMiddleware(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	clock := pgtest.NewClock(t, pool)
	clock.Freeze(t0)
	mustSet(t, pool, ratelimit.Policy{Name: "api", Rate: 1, Period: 10 * time.Second, Burst: 2})
	srv := serve(t, pool, ratelimit.MiddlewareConfig{Limits: byAPIKey})

	resp, body := get(t, srv.URL, "k1")
	if resp.StatusCode != 200 || body != "ok" ||
		resp.Header.Get("RateLimit-Policy") != `"api";q=2;w=20` || resp.Header.Get("RateLimit") != `"api";r=1;t=10` {
		t.Fatalf("first request: %d %q, headers %v", resp.StatusCode, body, resp.Header)
	}
	get(t, srv.URL, "k1")
	resp, body = get(t, srv.URL, "k1")
	var p struct {
		Status int    `json:"status"`
		Detail string `json:"detail"`
	}
	if resp.StatusCode != 429 || resp.Header.Get("Retry-After") != "10" ||
		resp.Header.Get("Content-Type") != "application/problem+json" || json.Unmarshal([]byte(body), &p) != nil ||
		p.Status != 429 || resp.Header.Get("RateLimit") != `"api";r=0;t=20` {
		t.Fatalf("past the burst: %d %q, headers %v", resp.StatusCode, body, resp.Header)
	}
	// Another key is not limited by k1's calls.
	if resp, _ := get(t, srv.URL, "k2"); resp.StatusCode != 200 {
		t.Fatalf("another key: %d", resp.StatusCode)
	}
	if resp, body := get(t, srv.URL, ""); resp.StatusCode != 400 || !regexp.MustCompile(`X-Api-Key is required`).MatchString(body) {
		t.Fatalf("no key: %d %q", resp.StatusCode, body)
	}
	// A request naming a policy that does not exist is a misconfiguration: 500.
	srv2 := serve(t, pool, ratelimit.MiddlewareConfig{Limits: func(*http.Request) ([]ratelimit.Limit, error) {
		return []ratelimit.Limit{{Policy: "gone", Key: "k"}}, nil
	}, FailOpen: true})
	if resp, _ := get(t, srv2.URL, ""); resp.StatusCode != 500 {
		t.Fatalf("unknown policy: %d, want 500 even with FailOpen", resp.StatusCode)
	}
}

// When the database cannot answer, requests are refused with 503 (or, with FailOpen,
// let through).
func TestMiddlewareDatabaseDown(t *testing.T) {
	t.Parallel()
	dead, err := pgxpool.New(t.Context(), "postgres://nobody@127.0.0.1:1/none?connect_timeout=1")
	if err != nil {
		t.Fatal(err)
	}
	defer dead.Close()
	if resp, _ := get(t, serve(t, dead, ratelimit.MiddlewareConfig{Limits: byAPIKey}).URL, "k"); resp.StatusCode != 503 || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("database down: %d, want 503 with Retry-After", resp.StatusCode)
	}
	if resp, body := get(t, serve(t, dead, ratelimit.MiddlewareConfig{Limits: byAPIKey, FailOpen: true}).URL, "k"); resp.StatusCode != 200 || body != "ok" {
		t.Fatalf("database down with FailOpen: %d %q", resp.StatusCode, body)
	}
}

// A policy name outside printable ASCII is percent-encoded in the headers (an sf-string
// holds printable ASCII only), and '"' and '\' are escaped.
func TestMiddlewareHeaderNames(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	for name, want := range map[string]string{`é%`: `"%C3%A9%25"`, `a"b\c`: `"a\"b\\c"`} {
		mustSet(t, pool, ratelimit.Policy{Name: name, Rate: 1, Period: time.Second, Burst: 1})
		srv := serve(t, pool, ratelimit.MiddlewareConfig{Limits: func(*http.Request) ([]ratelimit.Limit, error) {
			return []ratelimit.Limit{{Policy: name, Key: "k"}}, nil
		}})
		resp, _ := get(t, srv.URL, "")
		if got := resp.Header.Get("RateLimit-Policy"); got != want+";q=1;w=1" {
			t.Errorf("RateLimit-Policy of %q = %q, want %s;q=1;w=1", name, got, want)
		}
	}
}
