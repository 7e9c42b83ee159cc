package sink_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/outbox"
	"github.com/pgcoord/pgcoord/outbox/sink"
)

// A relay that POSTs each message to a webhook. The endpoint deduplicates on the
// Idempotency-Key header: a message whose answer was lost is sent again with the same key.
func ExampleWebhook() {
	ctx := context.Background()
	pool := pgtest.ExamplePool() // your *pgxpool.Pool, with pgcoord migrated

	endpoint := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		fmt.Println(r.Method, r.Header.Get(sink.HeaderIdempotencyKey), r.Header.Get(sink.HeaderTopic),
			r.Header.Get(sink.HeaderKey), r.Header.Get("Content-Type"), string(body))
		w.WriteHeader(http.StatusNoContent) // 2xx: delivered
	}))
	defer endpoint.Close()

	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := outbox.Enqueue(ctx, tx, outbox.Message{Topic: "orders", Key: "o-42", JSON: true,
			Payload: []byte(`{"event":"order_placed"}`)})
		return err
	})
	if err != nil {
		panic(err)
	}

	webhook, err := sink.Webhook(endpoint.URL, &sink.WebhookOpts{Timeout: 5 * time.Second})
	if err != nil {
		panic(err)
	}
	relay, err := outbox.NewRelay(pool, &outbox.Config{Handler: webhook})
	if err != nil {
		panic(err)
	}
	if _, err := relay.RunBatch(ctx); err != nil { // or relay.Run(ctx), for the process's life
		panic(err)
	}
	m, _ := outbox.Get(ctx, pool, 1)
	fmt.Println(m.State)
	// Output:
	// POST 1 orders o-42 application/json {"event":"order_placed"}
	// delivered
}

// A relay that writes each message as a line of JSON, as `pgcoord outbox relay --sink
// stdout` does: JSON payloads as they are, others in base64.
func ExampleJSONLines() {
	ctx := context.Background()
	pool := pgtest.ExamplePool()
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := outbox.EnqueueBatch(ctx, tx, []outbox.Message{
			{Topic: "orders", Key: "o-42", JSON: true, Payload: []byte(`{"event":"order_placed"}`)},
			{Topic: "orders", Key: "o-42", Payload: []byte("paid")},
		})
		return err
	})
	if err != nil {
		panic(err)
	}

	var out bytes.Buffer // os.Stdout, a file, a pipe to another program
	relay, err := outbox.NewRelay(pool, &outbox.Config{Handler: sink.JSONLines(&out)})
	if err != nil {
		panic(err)
	}
	if _, err := relay.RunBatch(ctx); err != nil {
		panic(err)
	}

	lines := bufio.NewScanner(&out)
	for lines.Scan() {
		var l sink.Line // also created_at and headers
		if err := json.Unmarshal(lines.Bytes(), &l); err != nil {
			panic(err)
		}
		if l.PayloadBase64 != nil {
			fmt.Println(l.ID, l.Topic, l.Key, "payload_base64", *l.PayloadBase64)
		} else {
			fmt.Println(l.ID, l.Topic, l.Key, "payload", string(l.Payload))
		}
	}
	// Output:
	// 1 orders o-42 payload {"event":"order_placed"}
	// 2 orders o-42 payload_base64 cGFpZA==
}
