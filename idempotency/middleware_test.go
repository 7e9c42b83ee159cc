package idempotency_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgcoord/pgcoord/idempotency"
	"github.com/pgcoord/pgcoord/internal/pgtest"
)

// orderHandler creates an order: it counts its runs, answers 201 with a body that differs
// on every run (so a replay is told from a second run), a Location and a header that is
// not stored.
func orderHandler(runs *atomic.Int64) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		n := runs.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", fmt.Sprintf("/orders/%d", n))
		w.Header().Set("X-Run", fmt.Sprint(n))
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"order":%d,"note":"bytes \u00e9\n"}`, n)
	}
}

// Every row of the semantics table, over HTTP on loopback.
func TestMiddlewareSemantics(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	var runs atomic.Int64
	srv := serve(t, pool, nil, orderHandler(&runs))
	url := srv.URL + "/orders"

	// The first request executes and its response is stored.
	first := send(t, "POST", url, "k-1", `{"amount":10}`)
	if first.status != http.StatusCreated || runs.Load() != 1 || first.header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("first = %+v after %d runs; want 201 from one run, not marked replayed", first, runs.Load())
	}
	// A repeat gets the stored response byte for byte, marked, without running again.
	again := send(t, "POST", url, "k-1", `{"amount":10}`)
	if again.status != first.status || again.body != first.body || runs.Load() != 1 {
		t.Fatalf("repeat = %+v after %d runs; want the first response %+v replayed", again, runs.Load(), first)
	}
	for _, h := range []string{"Content-Type", "Location"} {
		if again.header.Get(h) != first.header.Get(h) {
			t.Errorf("replayed %s = %q, want the stored %q", h, again.header.Get(h), first.header.Get(h))
		}
	}
	if again.header.Get("Idempotent-Replayed") != "true" || again.header.Get("X-Run") != "" {
		t.Errorf("replay headers %v: want Idempotent-Replayed: true and no header outside StoreHeaders", again.header)
	}
	// The key in the IETF draft's Structured Fields form is the same key.
	if quoted := send(t, "POST", url, `"k-1"`, `{"amount":10}`); quoted.body != first.body || runs.Load() != 1 {
		t.Errorf("the quoted key \"k-1\" got %+v: want the replay of k-1", quoted)
	}
	// A different request with the key is refused, never answered with the old response.
	for _, other := range []struct{ method, path, body string }{
		{"POST", "/orders", `{"amount":99}`},
		{"POST", "/orders?dry=1", `{"amount":10}`},
		{"PATCH", "/orders", `{"amount":10}`},
	} {
		r := send(t, other.method, srv.URL+other.path, "k-1", other.body)
		if r.status != http.StatusUnprocessableEntity || strings.Contains(r.body, `"order"`) || r.header.Get("Content-Type") != "application/problem+json" {
			t.Errorf("%s %s %s with k-1 = %+v; want a 422 problem, not the stored body", other.method, other.path, other.body, r)
		}
	}
	// A missing key on a method that requires one: 400, nothing run.
	if r := send(t, "POST", url, "", `{}`); r.status != http.StatusBadRequest || !strings.Contains(r.body, "Idempotency-Key") {
		t.Errorf("POST without a key = %+v, want 400 naming the header", r)
	}
	// Methods the middleware does not cover pass through, key or not.
	if r := send(t, "GET", url, "", ""); r.status != http.StatusCreated || runs.Load() != 2 {
		t.Errorf("GET = %+v after %d runs; want it passed through to the handler", r, runs.Load())
	}
	if r := send(t, "PUT", url, "k-1", ""); r.status != http.StatusCreated || runs.Load() != 3 {
		t.Errorf("PUT with a key = %+v; want it passed through", r)
	}
	// Bad keys: 400, nothing stored, nothing run.
	for _, bad := range []string{strings.Repeat("x", idempotency.MaxKeyLen+1), "tab\tkey", "caf\u00e9", `""`} {
		if r := send(t, "POST", url, bad, `{}`); r.status != http.StatusBadRequest || !strings.Contains(r.body, "invalid") {
			t.Errorf("key %q = %+v, want 400 invalid key", bad, r)
		}
	}
	if r := send(t, "POST", url, strings.Repeat("x", idempotency.MaxKeyLen), `{}`); r.status != http.StatusCreated {
		t.Errorf("a key of exactly %d bytes = %+v, want it accepted", idempotency.MaxKeyLen, r)
	}
	if runs.Load() != 4 || keys(t, pool) != 2 {
		t.Errorf("%d runs and %d keys stored; want 4 runs, the keys k-1 and the 255-byte one", runs.Load(), keys(t, pool))
	}
}

// A response over MaxResponseBytes is not sent nor stored, the handler's writes roll back,
// and the key is free for a retry; a request body over MaxRequestBytes is refused before
// anything is stored.
func TestMiddlewareSizeLimits(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	exec(t, pool, `CREATE TABLE effects (n int)`)
	var size atomic.Int64
	size.Store(101)
	var runs atomic.Int64
	srv := serve(t, pool, &idempotency.Config{Atomic: true, MaxResponseBytes: 100, MaxRequestBytes: 50}, func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		if _, err := idempotency.Tx(r.Context()).Exec(r.Context(), `INSERT INTO effects VALUES (1)`); err != nil {
			t.Error(err)
		}
		w.Write([]byte(strings.Repeat("a", int(size.Load()))))
	})
	r := send(t, "POST", srv.URL, "big", "{}")
	if r.status != http.StatusInternalServerError || !strings.Contains(r.body, "exceeds 100 bytes") || strings.Contains(r.body, "aaaa") {
		t.Fatalf("oversize response = %+v; want 500 saying it exceeds the limit, without the body", r)
	}
	if n := queryInt(t, pool, `SELECT count(*) FROM effects`); n != 0 || keys(t, pool) != 0 {
		t.Fatalf("after the oversize response: %d effects, %d keys; want both rolled back", n, keys(t, pool))
	}
	size.Store(100)
	if r := send(t, "POST", srv.URL, "big", "{}"); r.status != http.StatusOK || len(r.body) != 100 || runs.Load() != 2 {
		t.Fatalf("retry = %d, %d bytes after %d runs; want it executed and stored", r.status, len(r.body), runs.Load())
	}
	if r := send(t, "POST", srv.URL, "huge", strings.Repeat("b", 51)); r.status != http.StatusRequestEntityTooLarge || runs.Load() != 2 {
		t.Fatalf("oversize request = %+v; want 413 before the handler runs", r)
	}
	if keys(t, pool) != 1 {
		t.Fatalf("%d keys stored, want only the one that succeeded", keys(t, pool))
	}
}

// A repeat while the first request is in flight is answered 409 at once; with Wait it
// waits and gets the first one's response.
func TestMiddlewareInFlight(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	release := make(chan struct{})
	started := make(chan struct{}, 1)
	var runs atomic.Int64
	slow := func(w http.ResponseWriter, r *http.Request) {
		started <- struct{}{}
		<-release
		orderHandler(&runs)(w, r)
	}
	noWait := serve(t, pool, nil, slow)
	waiting := serve(t, pool, &idempotency.Config{Wait: pgtest.WaitLimit}, slow)

	first := pgtest.Go(func() (reply, error) { return send(t, "POST", noWait.URL, "k", "{}"), nil })
	<-started
	r := send(t, "POST", noWait.URL, "k", "{}")
	if r.status != http.StatusConflict || r.header.Get("Retry-After") == "" {
		t.Fatalf("repeat in flight = %+v, want 409 with Retry-After", r)
	}
	if r := send(t, "POST", noWait.URL, "k", `{"other":1}`); r.status != http.StatusUnprocessableEntity {
		t.Errorf("a different request while in flight = %+v; want 422 (the key is claimed with its fingerprint)", r)
	}
	// The waiting server shares the store: its request waits for the first.
	second := pgtest.Go(func() (reply, error) { return send(t, "POST", waiting.URL, "k", "{}"), nil })
	close(release)
	got1, _ := first.Wait(t)
	got2, _ := second.Wait(t)
	if got1.status != http.StatusCreated || got2.status != got1.status || got2.body != got1.body || got2.header.Get("Idempotent-Replayed") != "true" || runs.Load() != 1 {
		t.Fatalf("first %+v, waiting repeat %+v, %d runs; want one run and its response replayed", got1, got2, runs.Load())
	}
}

// Many concurrent requests with one key: the side effect happens once and every client
// gets the same response.
func TestMiddlewareConcurrentDuplicates(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	exec(t, pool, `CREATE TABLE payments (id serial PRIMARY KEY, amount int)`)
	srv := serve(t, pool, &idempotency.Config{Atomic: true, Wait: pgtest.WaitLimit}, func(w http.ResponseWriter, r *http.Request) {
		var id int
		if err := idempotency.Tx(r.Context()).QueryRow(r.Context(), `INSERT INTO payments (amount) VALUES (10) RETURNING id`).Scan(&id); err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		time.Sleep(20 * time.Millisecond) // widen the window in which duplicates arrive
		fmt.Fprintf(w, `{"payment":%d}`, id)
	})
	const clients = 32
	var wg sync.WaitGroup
	replies := make([]reply, clients)
	for i := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			replies[i] = send(t, "POST", srv.URL, "pay-42", `{"amount":10}`)
		}()
	}
	wg.Wait()
	replayed := 0
	for i, r := range replies {
		if r.status != http.StatusOK || r.body != replies[0].body {
			t.Errorf("client %d got %+v, client 0 %+v: want the same response", i, r, replies[0])
		}
		if r.header.Get("Idempotent-Replayed") == "true" {
			replayed++
		}
	}
	if n := queryInt(t, pool, `SELECT count(*) FROM payments`); n != 1 || replayed != clients-1 {
		t.Fatalf("%d payments, %d replays; want 1 payment and %d replays", n, replayed, clients-1)
	}
}

// Atomic mode: a handler that fails after writing (5xx or panic) leaves neither its writes
// nor a stored response, and the next attempt executes.
func TestMiddlewareAtomicRollback(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	exec(t, pool, `CREATE TABLE payments (key text, attempt int)`)
	var attempt atomic.Int64
	srv := serve(t, pool, &idempotency.Config{Atomic: true}, func(w http.ResponseWriter, r *http.Request) {
		n := attempt.Add(1)
		tx := idempotency.Tx(r.Context())
		if _, err := tx.Exec(r.Context(), `INSERT INTO payments VALUES ($1, $2)`, idempotency.FromContext(r.Context()).Key(), n); err != nil {
			t.Error(err)
		}
		if err := tx.Commit(r.Context()); err == nil {
			t.Error("the handler committed the attempt's transaction itself")
		}
		switch n {
		case 1:
			http.Error(w, "provider down", http.StatusBadGateway)
		case 2:
			panic(http.ErrAbortHandler) // the server drops the connection
		default:
			fmt.Fprintf(w, "paid on attempt %d", n)
		}
	})
	if r := send(t, "POST", srv.URL, "p", "{}"); r.status != http.StatusBadGateway {
		t.Fatalf("attempt 1 = %+v, want the handler's 502 passed on", r)
	}
	if n := queryInt(t, pool, `SELECT count(*) FROM payments`); n != 0 || keys(t, pool) != 0 {
		t.Fatalf("after a 502: %d payments, %d keys; want the writes and the key rolled back", n, keys(t, pool))
	}
	req, _ := http.NewRequest("POST", srv.URL, strings.NewReader("{}"))
	req.Header.Set("Idempotency-Key", "p")
	// A fresh connection: Go's transport retries a request carrying an Idempotency-Key
	// when a reused connection drops, which would hide the panic behind attempt 3.
	fresh := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	if resp, err := fresh.Do(req); err == nil {
		resp.Body.Close()
		t.Fatalf("attempt 2 panicked but the client got %d", resp.StatusCode)
	}
	if n := queryInt(t, pool, `SELECT count(*) FROM payments`); n != 0 || keys(t, pool) != 0 {
		t.Fatalf("after a panic: %d payments, %d keys; want the writes and the key rolled back", n, keys(t, pool))
	}
	r := send(t, "POST", srv.URL, "p", "{}")
	if r.status != http.StatusOK || r.body != "paid on attempt 3" {
		t.Fatalf("attempt 3 = %+v, want it executed", r)
	}
	if n := queryInt(t, pool, `SELECT count(*) FROM payments WHERE attempt = 3`); n != 1 || queryInt(t, pool, `SELECT count(*) FROM payments`) != 1 {
		t.Fatal("want exactly the third attempt's write committed")
	}
	if r := send(t, "POST", srv.URL, "p", "{}"); r.body != "paid on attempt 3" || attempt.Load() != 3 {
		t.Fatalf("repeat = %+v after %d attempts; want the replay", r, attempt.Load())
	}
}

// An expired key removed by GC is refused while its tombstone lasts, then usable again.
func TestMiddlewareExpiredKeyTombstone(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	var runs atomic.Int64
	srv := serve(t, pool, &idempotency.Config{Retention: time.Hour}, orderHandler(&runs))
	clock := pgtest.NewClock(t, pool)
	first := send(t, "POST", srv.URL, "old", "{}")
	// Two hours later, by the database clock:
	clock.Run(2 * time.Hour)
	n, err := idempotency.GC(t.Context(), pool, &idempotency.GCOpts{Tombstone: 24 * time.Hour})
	if err != nil || n != 1 {
		t.Fatalf("GC = %d, %v; want the expired key deleted", n, err)
	}
	r := send(t, "POST", srv.URL, "old", "{}")
	if r.status != http.StatusUnprocessableEntity || !strings.Contains(r.body, "expired") || strings.Contains(r.body, first.body) || runs.Load() != 1 {
		t.Fatalf("late retry = %+v after %d runs; want 422 expired, not executed", r, runs.Load())
	}
	var p map[string]any
	if err := json.Unmarshal([]byte(r.body), &p); err != nil || p["status"] != float64(422) {
		t.Errorf("the refusal is not a problem document: %q", r.body)
	}
	// After the tombstone expires, GC removes it and the key is new again.
	clock.Run(27 * time.Hour)
	if _, err := idempotency.GC(t.Context(), pool, nil); err != nil {
		t.Fatal(err)
	}
	if r := send(t, "POST", srv.URL, "old", "{}"); r.status != http.StatusCreated || runs.Load() != 2 {
		t.Fatalf("after the tombstone expired: %+v after %d runs; want a new execution", r, runs.Load())
	}
}

// Scopes keep clients apart; configured statuses and header names apply.
func TestMiddlewareConfig(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	var runs atomic.Int64
	srv := serve(t, pool, &idempotency.Config{
		Header:         "X-Request-Id",
		ReplayHeader:   "X-Replayed",
		Scope:          func(r *http.Request) (string, error) { return "user:" + r.URL.Query().Get("user"), nil },
		MismatchStatus: http.StatusBadRequest,
		Methods:        []string{"POST"},
	}, orderHandler(&runs))
	sendAs := func(user, key, body string) reply {
		req, _ := http.NewRequest("POST", srv.URL+"/?user="+user, strings.NewReader(body))
		req.Header.Set("X-Request-Id", key)
		return do(t, req)
	}
	a := sendAs("alice", "same", "{}")
	b := sendAs("bob", "same", "{}")
	if a.status != http.StatusCreated || b.status != http.StatusCreated || runs.Load() != 2 {
		t.Fatalf("alice %+v, bob %+v, %d runs: one key in two scopes must run twice", a, b, runs.Load())
	}
	if r := sendAs("alice", "same", "{}"); r.header.Get("X-Replayed") != "true" || r.body != a.body {
		t.Errorf("alice's repeat = %+v; want her response replayed with X-Replayed", r)
	}
	if r := sendAs("alice", "same", `{"x":1}`); r.status != http.StatusBadRequest {
		t.Errorf("mismatch = %d, want the configured 400", r.status)
	}
	if _, err := idempotency.Middleware(pool, &idempotency.Config{Scope: oneScope, InFlightStatus: 200}); err == nil {
		t.Error("Middleware accepted a 200 as the in-flight status")
	}
	if _, err := idempotency.Middleware(nil, nil); err == nil {
		t.Error("Middleware accepted a nil pool")
	}
}
