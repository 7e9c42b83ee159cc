// Command outbox-webhook is an order service that tells another service about every order it
// takes, by webhook, exactly once in effect: never an order that does not exist, never an
// order missed, never an order shipped twice.
//
// The incident: the service inserts the order, commits, then POSTs order.created to the
// shipping service. The process dies between the two: the order exists and is never
// shipped. Or the POST goes first and the transaction rolls back: an order that does not
// exist is shipped. Three pieces close the gaps:
//
//   - The outbox: the order and its order.created message are written in one transaction
//     (outbox.Enqueue, in insertOrder). Both commit or neither does.
//   - The relay (outbox.NewRelay, in run) delivers committed messages to the webhook with
//     sink.Webhook, and retries each until the endpoint answers 2xx: at least once. Every
//     request carries the message id in an Idempotency-Key header, the same on every
//     redelivery.
//   - The inbox, on the receiving side (receive): the shipping service records the message
//     id with inbox.Claim in the transaction that creates the shipment. A redelivery — the
//     receiver shipped the order but its answer was lost — finds the record and is
//     acknowledged without shipping again.
//
// The shipping service would have its own database; here it shares the order service's
// (and this process) to keep the example in one program. WEBHOOK_URL points the relay at
// another receiver.
//
// Run it with PGCOORD_DATABASE_URL=postgres://... go run ./examples/outbox-webhook and see
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
	"strconv"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/outbox"
	"github.com/pgcoord/pgcoord/outbox/inbox"
	"github.com/pgcoord/pgcoord/outbox/sink"
)

// schema is the tables of both services: orders is the order service's, shipments the
// shipping service's.
const schema = `
CREATE TABLE IF NOT EXISTS orders (
	id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	customer     text NOT NULL,
	amount_cents bigint NOT NULL,
	created_at   timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS shipments (
	id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	order_id   bigint NOT NULL, -- no UNIQUE: the inbox is what ships each order once
	message_id bigint NOT NULL,
	customer   text NOT NULL
);`

const (
	topic    = "order.created" // the outbox topic of the order service's messages
	consumer = "shipping"      // the inbox's name for the shipping service's effect
)

type config struct {
	Addr       string        // where the order API and the webhook receiver listen
	WebhookURL string        // where the relay POSTs order.created messages
	Backoff    time.Duration // the wait before redelivering a failed message (doubling after)
	Poll       time.Duration // how often an idle relay looks for messages due for a retry
	Logger     *slog.Logger
}

// order is an order, and the payload of its order.created message.
type order struct {
	ID          int64  `json:"id"`
	Customer    string `json:"customer"`
	AmountCents int64  `json:"amount_cents"`
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := start(ctx); err != nil {
		slog.Error("outbox-webhook", "err", err)
		os.Exit(1)
	}
}

func start(ctx context.Context) error {
	pool, err := connect(ctx, "outbox-webhook", schema)
	if err != nil {
		return err
	}
	defer pool.Close()
	cfg := config{Addr: os.Getenv("ADDR"), WebhookURL: os.Getenv("WEBHOOK_URL"),
		Backoff: time.Second, Poll: time.Second, Logger: slog.Default()}
	if cfg.Addr == "" {
		cfg.Addr = "127.0.0.1:8081"
	}
	if cfg.WebhookURL == "" {
		cfg.WebhookURL = "http://" + cfg.Addr + "/webhooks/orders" // our own receiver
	}
	return run(ctx, pool, cfg)
}

// run serves the order API and the webhook receiver on cfg.Addr and relays the outbox's
// order.created messages to cfg.WebhookURL, until ctx ends (then it returns nil) or the
// server fails.
func run(ctx context.Context, pool *pgxpool.Pool, cfg config) error {
	webhook, err := sink.Webhook(cfg.WebhookURL, &sink.WebhookOpts{Timeout: 5 * time.Second})
	if err != nil {
		return err
	}
	relay, err := outbox.NewRelay(pool, &outbox.Config{
		Handler:      webhook,
		Topics:       []string{topic},
		Concurrency:  4, // four customers' orders in flight at once; each customer's in order
		Backoff:      cfg.Backoff,
		PollInterval: cfg.Poll,
		Logger:       cfg.Logger,
	})
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.Handle("POST /orders", createOrder(pool, cfg.Logger))
	mux.Handle("POST /webhooks/orders", receive(pool, cfg.Logger))

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	relayed := make(chan error, 1)
	go func() { relayed <- relay.Run(ctx) }() // retries database errors itself; returns when ctx ends
	cfg.Logger.Info("listening", "addr", cfg.Addr, "webhook", cfg.WebhookURL)
	err = serve(ctx, cfg.Addr, mux)
	cancel() // the server failed, or ctx ended: stop the relay too
	return errors.Join(err, <-relayed)
}

// insertOrder writes the order and its order.created message in tx: the message exists for
// the relay if and only if the order commits.
func insertOrder(ctx context.Context, tx pgx.Tx, o order) (order, error) {
	err := tx.QueryRow(ctx, `INSERT INTO orders (customer, amount_cents) VALUES ($1, $2) RETURNING id`,
		o.Customer, o.AmountCents).Scan(&o.ID)
	if err != nil {
		return o, err
	}
	payload, err := json.Marshal(o)
	if err != nil {
		return o, err
	}
	// Key: the customer. A customer's messages are delivered one at a time, in commit order;
	// different customers' flow in parallel.
	_, err = outbox.Enqueue(ctx, tx, outbox.Message{Topic: topic, Key: o.Customer, Payload: payload, JSON: true})
	return o, err
}

// createOrder is POST /orders of the order service: {"customer": "acme", "amount_cents": 4200}.
func createOrder(pool *pgxpool.Pool, logger *slog.Logger) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var o order
		if err := json.NewDecoder(r.Body).Decode(&o); err != nil || o.Customer == "" || o.AmountCents <= 0 {
			http.Error(w, `want {"customer": "...", "amount_cents": N} with N > 0`, http.StatusBadRequest)
			return
		}
		err := pgx.BeginFunc(r.Context(), pool, func(tx pgx.Tx) (err error) {
			o, err = insertOrder(r.Context(), tx, o)
			return err
		})
		if err != nil {
			logger.Error("create order", "err", err)
			http.Error(w, "internal error", http.StatusInternalServerError)
			return
		}
		logger.Info("order created", "order", o.ID, "customer", o.Customer)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_ = json.NewEncoder(w).Encode(o) // the client may have gone: nothing to do about it
	}
}

// receive is the shipping service's webhook endpoint: it ships each order once, however
// many times the relay delivers its message. The relay retries anything but a 2xx.
func receive(pool *pgxpool.Pool, logger *slog.Logger) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		messageID, err := strconv.ParseInt(r.Header.Get(sink.HeaderIdempotencyKey), 10, 64)
		var o order
		if err == nil {
			err = json.NewDecoder(r.Body).Decode(&o)
		}
		if err != nil {
			http.Error(w, "want an order.created message: "+err.Error(), http.StatusBadRequest)
			return
		}
		var first bool
		err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			// The record of the message and the shipment commit together, or neither does.
			var err error
			if first, err = inbox.Claim(ctx, tx, consumer, messageID); err != nil || !first {
				return err // !first: shipped by an earlier delivery, whose answer was lost
			}
			_, err = tx.Exec(ctx, `INSERT INTO shipments (order_id, message_id, customer) VALUES ($1, $2, $3)`,
				o.ID, messageID, o.Customer)
			return err
		})
		if err != nil {
			logger.Error("ship order", "order", o.ID, "err", err)
			http.Error(w, "internal error", http.StatusInternalServerError) // the relay retries
			return
		}
		logger.Info("order.created received", "order", o.ID, "message", messageID, "shipped", first,
			"attempt", r.Header.Get(sink.HeaderAttempt))
		w.WriteHeader(http.StatusNoContent) // 2xx, also for a duplicate: the relay stops sending it
	}
}

// headerTimeout is how long a client may take to send a request's headers (a variable for
// the tests).
var headerTimeout = 10 * time.Second

// serve serves h on addr until ctx ends, then shuts down gracefully: the requests in flight
// finish.
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
