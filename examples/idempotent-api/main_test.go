package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/examples/internal/exampletest"
	"github.com/pgcoord/pgcoord/idempotency"
	"github.com/pgcoord/pgcoord/internal/pgtest"
)

func TestMain(m *testing.M) { exampletest.Main(m, main) }

// newPool returns a pool on a fresh schema with pgcoord and the example's tables.
func newPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool := pgtest.Pool(t)
	if err := createTables(context.Background(), pgtest.Direct(t, pool), "idempotent-api", schema); err != nil {
		t.Fatal(err)
	}
	return pool
}

// newServer serves the API (newHandler) on a test server and returns its URL.
func newServer(t *testing.T, pool *pgxpool.Pool, cfg config) string {
	t.Helper()
	cfg.Logger = slog.New(slog.DiscardHandler)
	h, err := newHandler(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv.URL
}

// response is what a client received.
type response struct {
	Status      int
	ContentType string
	Replayed    bool // Idempotent-Replayed: true
	Body        string
}

// post sends POST /payments with the idempotency key and body.
func post(baseURL, key, body string) (response, error) {
	req, err := http.NewRequest(http.MethodPost, baseURL+"/payments", strings.NewReader(body))
	if err != nil {
		return response{}, err
	}
	req.Header.Set("Idempotency-Key", key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return response{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return response{resp.StatusCode, resp.Header.Get("Content-Type"), resp.Header.Get(idempotency.DefaultReplayHeader) == "true", string(b)}, err
}

// mustPost is post for the test goroutine.
func mustPost(t *testing.T, baseURL, key, body string) response {
	t.Helper()
	r, err := post(baseURL, key, body)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// postUntilDone is a client that retries while the request with its key is in flight
// (409), or while too many requests hold the database's connections (503), as a client
// following Retry-After does, only faster.
func postUntilDone(baseURL, key, body string) (r response, conflicts int, err error) {
	deadline := time.Now().Add(pgtest.WaitLimit)
	for {
		r, err = post(baseURL, key, body)
		if err != nil || (r.Status != http.StatusConflict && r.Status != http.StatusServiceUnavailable) {
			return r, conflicts, err
		}
		conflicts++
		if time.Now().After(deadline) {
			return r, conflicts, fmt.Errorf("still %d after %v", r.Status, pgtest.WaitLimit)
		}
		time.Sleep(10 * time.Millisecond) // the client's pause before it retries
	}
}

// ledger returns how many payments we recorded, and how many charges the provider made
// for how many requests.
func ledger(t *testing.T, pool *pgxpool.Pool) (payments, charges, requests int) {
	t.Helper()
	err := pool.QueryRow(context.Background(), `SELECT (SELECT count(*) FROM payments),
		(SELECT count(*) FROM provider_charges), (SELECT coalesce(sum(requests), 0) FROM provider_charges)`).Scan(&payments, &charges, &requests)
	if err != nil {
		t.Fatal(err)
	}
	return payments, charges, requests
}

// The client retries a request whose answer it lost: the retry gets the first response,
// byte for byte, marked replayed, and nothing runs again: one payment, one charge, one
// request to the provider.
func TestRetryIsReplayed(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	url := newServer(t, pool, config{})

	first := mustPost(t, url, "pay-1", `{"amount_cents": 1500}`)
	if first.Status != http.StatusCreated || first.Replayed || first.ContentType != "application/json" {
		t.Fatalf("first request: %+v, want 201 application/json, not replayed", first)
	}
	retry := mustPost(t, url, "pay-1", `{"amount_cents": 1500}`)
	if !retry.Replayed {
		t.Errorf("the retry is not marked %s: true", idempotency.DefaultReplayHeader)
	}
	if retry.Status != first.Status || retry.ContentType != first.ContentType || retry.Body != first.Body {
		t.Errorf("the retry got %+v, want the first response %+v", retry, first)
	}
	if payments, charges, requests := ledger(t, pool); payments != 1 || charges != 1 || requests != 1 {
		t.Errorf("%d payments, %d charges for %d provider requests; want 1, 1, 1", payments, charges, requests)
	}
}

// A key reused with another body is refused (422), never answered with the first
// request's response, and nothing runs; the first request still replays.
func TestKeyReusedForAnotherRequest(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	url := newServer(t, pool, config{})

	first := mustPost(t, url, "pay-1", `{"amount_cents": 1500}`)
	if first.Status != http.StatusCreated {
		t.Fatalf("first request: %+v, want 201", first)
	}
	other := mustPost(t, url, "pay-1", `{"amount_cents": 9900}`)
	if other.Status != http.StatusUnprocessableEntity || strings.Contains(other.Body, "charge_id") {
		t.Errorf("same key, another body: %+v; want 422 without the first payment", other)
	}
	if again := mustPost(t, url, "pay-1", `{"amount_cents": 1500}`); again.Body != first.Body || !again.Replayed {
		t.Errorf("the first request retried after the refusal: %+v, want its response replayed", again)
	}
	if payments, charges, _ := ledger(t, pool); payments != 1 || charges != 1 {
		t.Errorf("%d payments, %d charges; want 1 and 1", payments, charges)
	}
}

// Sixteen clients send the same request at once (a client that retries impatiently, a
// double-clicked button): one executes; the others get 409 while it runs (or 503 while the
// pool's Atomic share is taken) and then, on their retry, its response. All end with the same 201, and there is one payment.
func TestConcurrentDuplicatesPayOnce(t *testing.T) {
	t.Parallel()
	const clients = 16
	pool := newPool(t)
	url := newServer(t, pool, config{})

	var wg sync.WaitGroup
	results := make([]response, clients)
	errs := make([]error, clients)
	conflicts := make([]int, clients)
	for i := range clients {
		wg.Go(func() { results[i], conflicts[i], errs[i] = postUntilDone(url, "pay-1", `{"amount_cents": 700}`) })
	}
	wg.Wait()
	executed, seen409 := 0, 0
	for i, r := range results {
		if errs[i] != nil {
			t.Fatalf("client %d: %v", i, errs[i])
		}
		if r.Status != http.StatusCreated || r.Body != results[0].Body {
			t.Errorf("client %d got %+v, want 201 with %q", i, r, results[0].Body)
		}
		if !r.Replayed {
			executed++
		}
		seen409 += conflicts[i]
	}
	if executed != 1 {
		t.Errorf("%d responses not replayed, want exactly 1 (the request that executed)", executed)
	}
	if payments, charges, requests := ledger(t, pool); payments != 1 || charges != 1 || requests != 1 {
		t.Errorf("%d payments, %d charges for %d provider requests; want 1, 1, 1", payments, charges, requests)
	}
	t.Logf("%d answers 409 (in flight) or 503 (busy) along the way", seen409)
}

// The provider charges, but its answer is lost (a timeout): the handler answers 502 after
// it wrote the payment. Atomic mode rolls the payment back with the attempt, and nothing
// is stored under the key. The client's retry executes again: the payment is written, and
// the provider, called with the same derived key, returns its first charge instead of
// charging again.
func TestFailureAfterWritingLeavesNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := newPool(t)
	var mu sync.Mutex
	calls := 0
	url := newServer(t, pool, config{Charge: func(ctx context.Context, key string, amountCents int64) (string, error) {
		id, err := providerCharge(ctx, pool, key, amountCents)
		mu.Lock()
		defer mu.Unlock()
		if calls++; calls == 1 && err == nil {
			return "", errors.New("provider: timeout (the charge went through, the answer was lost)")
		}
		return id, err
	}})

	failed := mustPost(t, url, "pay-1", `{"amount_cents": 2500}`)
	if failed.Status != http.StatusBadGateway {
		t.Fatalf("with the provider failing: %+v, want 502", failed)
	}
	if payments, charges, _ := ledger(t, pool); payments != 0 || charges != 1 {
		t.Fatalf("after the failure: %d payments (want 0: rolled back) and %d provider charges (want 1)", payments, charges)
	}
	if _, err := idempotency.Get(ctx, pool, apiScope, "pay-1"); !errors.Is(err, idempotency.ErrNotFound) {
		t.Fatalf("the key after the failure: %v, want %v (nothing stored)", err, idempotency.ErrNotFound)
	}

	retry := mustPost(t, url, "pay-1", `{"amount_cents": 2500}`)
	if retry.Status != http.StatusCreated || retry.Replayed {
		t.Fatalf("the retry: %+v, want 201, executed (not replayed)", retry)
	}
	payments, charges, requests := ledger(t, pool)
	if payments != 1 || charges != 1 || requests != 2 {
		t.Errorf("%d payments, %d charges for %d provider requests; want 1 payment and 1 charge for 2 requests", payments, charges, requests)
	}
	if n := exampletest.Count(t, pool, `SELECT count(*) FROM payments p JOIN provider_charges c USING (charge_id)
		WHERE c.idempotency_key = $1`, idempotency.DerivedKey(apiScope, "pay-1", "charge")); n != 1 {
		t.Errorf("the payment does not record the provider's one charge for the derived key")
	}
	if again := mustPost(t, url, "pay-1", `{"amount_cents": 2500}`); again.Body != retry.Body || !again.Replayed {
		t.Errorf("a third send: %+v, want the successful response replayed", again)
	}
}

// freeAddr returns a local address no one listens on (for the program's ADDR).
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// The program itself: started with PGCOORD_DATABASE_URL and ADDR, it answers a payment
// and replays it to the retry, records one payment, and exits 0 on SIGTERM; without the
// database variable it fails with a message naming it.
func TestMainProgram(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	addr := freeAddr(t)
	p := exampletest.StartMain(t, exampletest.EnvDatabaseURL+"="+exampletest.DatabaseURL(t, pool), "ADDR="+addr)
	url := "http://" + addr
	var first response
	exampletest.WaitFor(t, "the API answers", func(context.Context) (bool, error) {
		var err error
		first, err = post(url, "main-1", `{"amount_cents": 4200}`)
		return err == nil, nil // connection refused until it listens
	})
	if first.Status != http.StatusCreated {
		t.Fatalf("the first request: %+v, want 201", first)
	}
	if retry := mustPost(t, url, "main-1", `{"amount_cents": 4200}`); !retry.Replayed || retry.Body != first.Body {
		t.Errorf("the retry: %+v, want the first response replayed", retry)
	}
	p.Stop(t)
	if n := exampletest.Count(t, pool, `SELECT count(*) FROM payments WHERE charge_id IS NOT NULL`); n != 1 {
		t.Errorf("%d payments, want 1", n)
	}

	code, out := exampletest.RunMain(t)
	if code != 1 || !strings.Contains(out, "PGCOORD_DATABASE_URL is not set") {
		t.Errorf("without PGCOORD_DATABASE_URL: exit code %d, output %q; want 1 and the variable named", code, out)
	}
}

// The program's server disconnects a client that sends its headers a byte at a time
// (slowloris) once the header timeout has passed, instead of holding a connection for it.
func TestServerDisconnectsSlowloris(t *testing.T) {
	saved := headerTimeout
	headerTimeout = 200 * time.Millisecond
	t.Cleanup(func() { headerTimeout = saved })
	ctx, cancel := context.WithCancel(t.Context())
	addr, done := freeAddr(t), make(chan error, 1)
	go func() {
		done <- serve(ctx, addr, http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
			t.Error("the handler ran for a request whose headers never ended")
		}))
	}()
	sent := exampletest.Slowloris(t, addr)
	t.Logf("disconnected after %d header bytes sent one by one", sent)
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
