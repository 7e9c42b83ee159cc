// Command idempotent-api is a payments API that a client may retry as often as it likes
// without paying twice.
//
// The incident: a mobile client sends POST /payments, the network drops the answer, the
// client retries, and the customer is charged twice. The client cannot know whether the
// first request went through; only the server can, if the client names the request. So
// every POST carries an Idempotency-Key header, and the API is wrapped in
// idempotency.Middleware:
//
//   - The first request with a key runs the handler; its response is stored, then sent. A
//     retry with the same key and the same body gets that response again, byte for byte,
//     with Idempotent-Replayed: true, and the handler does not run. The same key with
//     another body is refused (422); a retry while the first is still running gets 409.
//   - Atomic mode: the handler writes the payment with idempotency.Tx(r.Context()), the
//     key's own transaction, so the payment and the stored response commit together or
//     not at all. A handler that fails after writing (the provider is down: 502) leaves
//     neither, and the retry executes.
//   - The payment provider is outside our transaction: a charge it made stays made even
//     if our transaction rolls back. So it gets an idempotency key of its own, derived
//     from the request's (Attempt.DerivedKey): every retry sends the provider the same
//     key, and the provider charges once (createPayment).
//
// Run it with PGCOORD_DATABASE_URL=postgres://... go run ./examples/idempotent-api and see
// README.md for the requests to send it.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/idempotency"
	"github.com/pgcoord/pgcoord/pgcoord"
)

// schema is the application's tables. provider_charges stands in for the payment
// provider's own database (Stripe's, say), which keeps one charge per idempotency key.
const schema = `
CREATE TABLE IF NOT EXISTS payments (
	id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	amount_cents bigint NOT NULL,
	charge_id    text,  -- set once the provider has charged, in the same transaction
	created_at   timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS provider_charges (
	idempotency_key text PRIMARY KEY,
	charge_id       text NOT NULL DEFAULT gen_random_uuid()::text,
	amount_cents    bigint NOT NULL,
	requests        int NOT NULL DEFAULT 1
);`

type config struct {
	Addr string // where the API listens
	// Charge calls the payment provider. Default: providerCharge, on the pool. (The test
	// injects a provider that fails.)
	Charge func(ctx context.Context, key string, amountCents int64) (chargeID string, err error)
	Logger *slog.Logger
}

// payment is the body of POST /payments and of its answer.
type payment struct {
	ID          int64  `json:"id,omitempty"`
	AmountCents int64  `json:"amount_cents"`
	ChargeID    string `json:"charge_id,omitempty"`
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := start(ctx); err != nil {
		slog.Error("idempotent-api", "err", err)
		os.Exit(1)
	}
}

func start(ctx context.Context) error {
	pool, err := connect(ctx, "idempotent-api", schema)
	if err != nil {
		return err
	}
	defer pool.Close()
	addr := os.Getenv("ADDR")
	if addr == "" {
		addr = "127.0.0.1:8080"
	}
	return run(ctx, pool, config{Addr: addr, Logger: slog.Default()})
}

// run serves the API on cfg.Addr until ctx ends (then it returns nil) or the server fails.
func run(ctx context.Context, pool *pgxpool.Pool, cfg config) error {
	h, err := newHandler(pool, cfg)
	if err != nil {
		return err
	}
	cfg.Logger.Info("listening", "addr", cfg.Addr)
	return serve(ctx, cfg.Addr, h)
}

// apiScope is the scope of every idempotency key of this API (see newHandler).
const apiScope = "api"

// newHandler returns the API: POST /payments, behind the idempotency middleware.
func newHandler(pool *pgxpool.Pool, cfg config) (http.Handler, error) {
	if cfg.Charge == nil {
		cfg.Charge = func(ctx context.Context, key string, amountCents int64) (string, error) {
			return providerCharge(ctx, pool, key, amountCents)
		}
	}
	mw, err := idempotency.Middleware(pool, &idempotency.Config{
		Atomic: true, // the handler writes with idempotency.Tx(r.Context())
		// Keys are unique per scope. This example has no authentication, so its clients are
		// one principal and share one scope; an API with authentication scopes keys by
		// client (return "account:" + accountOf(r)), or two clients that send the same key
		// would get one stored response — the first one's.
		Scope:  func(*http.Request) (string, error) { return apiScope, nil },
		Logger: cfg.Logger,
	})
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("POST /payments", mw(createPayment(cfg)))
	return mux, nil
}

// createPayment records the payment and charges it. It runs once per idempotency key: a
// retry is answered by the middleware with the stored response.
func createPayment(cfg config) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		var p payment
		if err := json.NewDecoder(r.Body).Decode(&p); err != nil || p.AmountCents <= 0 {
			// A 4xx is stored like a success: the same request retried gets the same answer.
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": `want {"amount_cents": N} with N > 0`})
			return
		}
		// The key's transaction: what we write with it commits with the stored response.
		tx := idempotency.Tx(ctx)
		if err := tx.QueryRow(ctx, `INSERT INTO payments (amount_cents) VALUES ($1) RETURNING id`, p.AmountCents).Scan(&p.ID); err != nil {
			cfg.Logger.Error("insert payment", "err", err)
			writeJSON(w, http.StatusInternalServerError, map[string]string{"error": "internal error"}) // 5xx: rolled back
			return
		}
		// The provider's key is derived from ours, for this step: the same in every retry of
		// this request, and different for every other request.
		chargeID, err := cfg.Charge(ctx, idempotency.FromContext(ctx).DerivedKey("charge"), p.AmountCents)
		if err != nil {
			// The payment row above rolls back with the 5xx; the client retries with the same
			// key, and the provider, seeing its key again, does not charge twice.
			cfg.Logger.Warn("provider failed", "err", err)
			writeJSON(w, http.StatusBadGateway, map[string]string{"error": "payment provider unavailable, retry"})
			return
		}
		p.ChargeID = chargeID
		if _, err := tx.Exec(ctx, `UPDATE payments SET charge_id = $2 WHERE id = $1`, p.ID, chargeID); err != nil {
			cfg.Logger.Error("record charge", "err", err)
			writeJSON(w, http.StatusInternalServerError, map[string]string{"error": "internal error"})
			return
		}
		cfg.Logger.Info("paid", "payment", p.ID, "charge", chargeID, "key", idempotency.FromContext(ctx).Key())
		writeJSON(w, http.StatusCreated, p)
	}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v) // the middleware buffers the body: no write fails here
}

// providerCharge stands in for the provider's API (POST /charges with an Idempotency-Key
// header): the first request with a key charges, a repeat returns the first charge. It
// runs on a connection of its own, outside the handler's transaction, as a call to another
// system does: a rollback of ours does not undo it.
func providerCharge(ctx context.Context, db pgcoord.DBTX, key string, amountCents int64) (chargeID string, err error) {
	err = db.QueryRow(ctx, `INSERT INTO provider_charges (idempotency_key, amount_cents) VALUES ($1, $2)
		ON CONFLICT (idempotency_key) DO UPDATE SET requests = provider_charges.requests + 1
		RETURNING charge_id`, key, amountCents).Scan(&chargeID)
	return chargeID, err
}

// headerTimeout is how long a client may take to send a request's headers (a variable for
// the tests).
var headerTimeout = 10 * time.Second

// serve serves h on addr until ctx ends, then shuts down gracefully: the requests in flight
// finish, and their responses are stored and sent.
func serve(ctx context.Context, addr string, h http.Handler) error {
	// Bounded against slow and greedy clients (slowloris): headers within 10 s, the whole
	// request within 30 s, idle keep-alive connections closed after 2 minutes, at most
	// 64 KiB of headers.
	srv := &http.Server{Addr: addr, Handler: h, ReadHeaderTimeout: headerTimeout, ReadTimeout: 3 * headerTimeout,
		IdleTimeout: 2 * time.Minute, MaxHeaderBytes: 64 << 10}
	failed := make(chan error, 1)
	go func() { failed <- srv.ListenAndServe() }()
	select {
	case err := <-failed:
		return err
	case <-ctx.Done():
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(ctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
