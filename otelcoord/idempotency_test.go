package otelcoord_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/codes"

	"github.com/pgcoord/pgcoord/idempotency"
	"github.com/pgcoord/pgcoord/internal/pgtest"
)

// Begin's span says how the key was found: the first attempt (with its number), in
// flight, a replay (with the replayed status), or reused for another request; refusals
// are recorded as errors.
func TestIdempotencyBeginOutcomes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t)
	r := newRecorder(t)
	opts := &idempotency.BeginOpts{Tracer: r.tracer}
	fp := idempotency.Fingerprint("POST", "/charges", []byte(`{"amount":100}`), nil)
	key := map[string]any{"pgcoord.idempotency.scope": "acct-1", "pgcoord.idempotency.key": "k-1"}

	callerCtx, caller := r.test.Start(ctx, "caller")
	first, err := idempotency.Begin(callerCtx, pool, "acct-1", "k-1", fp, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close(ctx)
	_, err = idempotency.Begin(ctx, pool, "acct-1", "k-1", fp, opts)
	if !errors.Is(err, idempotency.ErrInFlight) {
		t.Fatalf("Begin while in flight: %v", err)
	}
	if err := first.Complete(ctx, idempotency.Response{Status: 201, Body: []byte("charged")}); err != nil {
		t.Fatal(err)
	}
	replay, err := idempotency.Begin(ctx, pool, "acct-1", "k-1", fp, opts)
	if err != nil || replay.Replay() == nil {
		t.Fatalf("Begin after completion: %v, replay %v", err, replay.Replay())
	}
	other := idempotency.Fingerprint("POST", "/charges", []byte(`{"amount":999}`), nil)
	if _, err := idempotency.Begin(ctx, pool, "acct-1", "k-1", other, opts); !errors.Is(err, idempotency.ErrMismatch) {
		t.Fatalf("Begin with another body: %v", err)
	}
	caller.End()

	spans := r.spans("pgcoord.idempotency.begin")
	if len(spans) != 4 {
		t.Fatalf("%d begin spans, want 4", len(spans))
	}
	for _, s := range spans {
		wantAttrs(t, s, key)
	}
	wantChild(t, spans[0], r.one(t, "caller"))
	wantStatus(t, spans[0], codes.Unset)
	wantAttrs(t, spans[0], map[string]any{"pgcoord.idempotency.outcome": "first", "pgcoord.attempt": int64(1)})
	wantStatus(t, spans[1], codes.Error)
	wantAttrs(t, spans[1], map[string]any{"pgcoord.idempotency.outcome": "in_flight"})
	wantStatus(t, spans[2], codes.Unset)
	wantAttrs(t, spans[2], map[string]any{"pgcoord.idempotency.outcome": "replay"})
	if got := eventAttr(event(t, spans[2], "pgcoord.idempotency.replay"), "pgcoord.idempotency.status"); got != int64(201) {
		t.Errorf("replay event status %v, want 201", got)
	}
	wantStatus(t, spans[3], codes.Error)
	wantAttrs(t, spans[3], map[string]any{"pgcoord.idempotency.outcome": "mismatch"})
}

// The attempt that takes over a key whose holder died is a recovery, attempt 2.
func TestIdempotencyBeginRecovery(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t)
	r := newRecorder(t)
	opts := &idempotency.BeginOpts{Tracer: r.tracer}
	fp := idempotency.Fingerprint("POST", "/charges", []byte(`{"amount":100}`), nil)

	a, err := idempotency.Begin(ctx, pool, "acct-1", "k-2", fp, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close(ctx)
	if err := a.Checkpoint(ctx, "charged", nil); err != nil {
		t.Fatal(err)
	}
	// The holder dies: the key is left as a dead process leaves it, its lease lapsed.
	_, err = pool.Exec(ctx, `UPDATE pgcoord_idempotency_keys SET holder = 'dead-process', lease_expires_at = pgcoord_now() - interval '1 second'
		WHERE scope = $1 AND key = $2`, "acct-1", "k-2")
	if err != nil {
		t.Fatal(err)
	}
	b, err := idempotency.Begin(ctx, pool, "acct-1", "k-2", fp, opts)
	if err != nil {
		t.Fatalf("Begin after the holder died: %v", err)
	}
	defer b.Close(ctx)
	spans := r.spans("pgcoord.idempotency.begin")
	if len(spans) != 2 {
		t.Fatalf("%d begin spans, want 2", len(spans))
	}
	wantAttrs(t, spans[1], map[string]any{"pgcoord.idempotency.outcome": "recovery", "pgcoord.attempt": int64(2)})
	wantStatus(t, spans[1], codes.Unset)
}

// A key that GC removed is refused as expired, recorded on the span.
func TestIdempotencyBeginExpired(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t)
	r := newRecorder(t)
	fp := idempotency.Fingerprint("POST", "/charges", nil, nil)
	a, err := idempotency.Begin(ctx, pool, "acct-1", "k-3", fp, &idempotency.BeginOpts{Retention: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Complete(ctx, idempotency.Response{Status: 200}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(pgtest.WaitLimit)
	for { // until the database clock passes the retention and GC removes the key
		n, err := idempotency.GC(ctx, pool, nil)
		if err != nil {
			t.Fatal(err)
		}
		if n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("GC did not remove the key")
		}
		time.Sleep(time.Millisecond)
	}
	_, err = idempotency.Begin(ctx, pool, "acct-1", "k-3", fp, &idempotency.BeginOpts{Tracer: r.tracer})
	if !errors.Is(err, idempotency.ErrExpired) {
		t.Fatalf("Begin after GC: %v", err)
	}
	s := r.one(t, "pgcoord.idempotency.begin")
	wantAttrs(t, s, map[string]any{"pgcoord.idempotency.outcome": "expired"})
	wantStatus(t, s, codes.Error)
}

// The middleware traces each request's Begin (Config.Tracer) under the request's span.
func TestIdempotencyMiddlewareTraced(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	r := newRecorder(t)
	mw, err := idempotency.Middleware(pool, &idempotency.Config{
		Scope:  func(*http.Request) (string, error) { return "api", nil },
		Tracer: r.tracer,
	})
	if err != nil {
		t.Fatal(err)
	}
	app := mw(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusCreated)
	}))
	for range 2 {
		ctx, req := r.test.Start(context.Background(), "request")
		rq := httptest.NewRequestWithContext(ctx, http.MethodPost, "/charges", strings.NewReader(`{"amount":100}`))
		rq.Header.Set("Idempotency-Key", "k-9")
		rec := httptest.NewRecorder()
		app.ServeHTTP(rec, rq)
		req.End()
		if rec.Code != http.StatusCreated {
			t.Fatalf("status %d", rec.Code)
		}
	}
	begins, requests := r.spans("pgcoord.idempotency.begin"), r.spans("request")
	if len(begins) != 2 {
		t.Fatalf("%d begin spans, want 2", len(begins))
	}
	for i, want := range []string{"first", "replay"} {
		wantChild(t, begins[i], requests[i])
		wantAttrs(t, begins[i], map[string]any{"pgcoord.idempotency.scope": "api", "pgcoord.idempotency.key": "k-9",
			"pgcoord.idempotency.outcome": want})
	}
	event(t, begins[1], "pgcoord.idempotency.replay")
}
