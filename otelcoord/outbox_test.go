package otelcoord_test

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/outbox"
	"github.com/pgcoord/pgcoord/outbox/sink"
)

// A message enqueued with Tracer.Enqueue carries the producer's W3C trace context in its
// headers; a relay with the Tracer delivers it (to a real webhook, which fails once) in
// consumer spans that are children of the enqueue span, one per attempt.
func TestOutboxEnqueueToDelivery(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t)
	r := newRecorder(t)

	var mu sync.Mutex
	var received []string // the traceparent header of each webhook request
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		mu.Lock()
		received = append(received, req.Header.Get("traceparent"))
		first := len(received) == 1
		mu.Unlock()
		if first {
			http.Error(w, "try again", http.StatusServiceUnavailable)
		}
	}))
	defer srv.Close()
	webhook, err := sink.Webhook(srv.URL, nil)
	if err != nil {
		t.Fatal(err)
	}

	// The producer: a business transaction under a span of its own.
	prodCtx, checkout := r.test.Start(ctx, "checkout")
	headers := map[string]string{"content-language": "en"}
	var msg outbox.Message
	err = pgx.BeginFunc(prodCtx, pool, func(tx pgx.Tx) error {
		msg, err = r.tracer.Enqueue(prodCtx, tx, outbox.Message{Topic: "orders", Key: "o-42", Payload: []byte("placed"), Headers: headers})
		return err
	})
	checkout.End()
	if err != nil {
		t.Fatal(err)
	}
	if len(headers) != 1 {
		t.Errorf("Enqueue changed the caller's headers: %v", headers)
	}
	enq := r.one(t, "pgcoord.outbox.enqueue")
	wantChild(t, enq, r.one(t, "checkout"))
	if enq.SpanKind != trace.SpanKindProducer {
		t.Errorf("enqueue span kind %v, want producer", enq.SpanKind)
	}
	wantAttrs(t, enq, map[string]any{"pgcoord.outbox.topic": "orders", "pgcoord.outbox.key": "o-42", "pgcoord.outbox.id": msg.ID})
	wantStatus(t, enq, codes.Unset)

	// What the database stores: the W3C traceparent of the enqueue span, beside the
	// producer's own header.
	stored, err := outbox.Get(ctx, pool, msg.ID)
	if err != nil {
		t.Fatal(err)
	}
	traceID, spanID := enq.SpanContext.TraceID().String(), enq.SpanContext.SpanID().String()
	if want := "00-" + traceID + "-" + spanID + "-01"; stored.Headers["traceparent"] != want {
		t.Errorf("stored traceparent %q, want %q", stored.Headers["traceparent"], want)
	}
	if stored.Headers["content-language"] != "en" {
		t.Errorf("stored headers %v lost the producer's own", stored.Headers)
	}

	// The relay, in a context of its own (as in another process).
	var handlerSpans []trace.SpanContext
	relay, err := outbox.NewRelay(pool, &outbox.Config{
		Handler: outbox.HandlerFunc(func(ctx context.Context, m outbox.Message) error {
			mu.Lock()
			handlerSpans = append(handlerSpans, trace.SpanContextFromContext(ctx))
			mu.Unlock()
			return webhook.Handle(ctx, m)
		}),
		Tracer:       r.tracer,
		Backoff:      time.Millisecond,
		MaxBackoff:   time.Millisecond,
		PollInterval: 20 * time.Millisecond,
		Logger:       slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- relay.Run(runCtx) }()
	deliveries := r.waitSpans(t, "pgcoord.outbox.deliver", 2)
	stop()
	<-done

	for i, d := range deliveries {
		wantChild(t, d, enq) // the delivery continues the producer's trace
		if d.SpanKind != trace.SpanKindConsumer {
			t.Errorf("delivery span kind %v, want consumer", d.SpanKind)
		}
		if !d.Parent.IsRemote() {
			t.Error("delivery span's parent is not the remote context of the message's headers")
		}
		wantAttrs(t, d, map[string]any{"pgcoord.outbox.topic": "orders", "pgcoord.outbox.key": "o-42",
			"pgcoord.outbox.id": msg.ID, "pgcoord.attempt": int64(i + 1)})
		if tok, _ := attr(d, "pgcoord.token"); tok.AsInt64() < 1 {
			t.Errorf("delivery %d: claim token %d", i+1, tok.AsInt64())
		}
		if handlerSpans[i].SpanID() != d.SpanContext.SpanID() {
			t.Errorf("delivery %d: the handler's context carries span %s, want the delivery's %s", i+1, handlerSpans[i].SpanID(), d.SpanContext.SpanID())
		}
	}
	wantStatus(t, deliveries[0], codes.Error) // the webhook answered 503
	wantStatus(t, deliveries[1], codes.Unset)

	// The webhook sink forwards the message's headers: the endpoint sees the producer's trace.
	mu.Lock()
	defer mu.Unlock()
	for i, tp := range received {
		if !strings.HasPrefix(tp, "00-"+traceID+"-") {
			t.Errorf("webhook request %d: traceparent %q, want trace %s", i+1, tp, traceID)
		}
	}
}

// A message enqueued without trace context is delivered in a span that starts a trace
// of its own.
func TestOutboxDeliveryWithoutTraceContext(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t)
	r := newRecorder(t)
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := outbox.Enqueue(ctx, tx, outbox.Message{Topic: "orders", Key: "o-7"})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	relay, err := outbox.NewRelay(pool, &outbox.Config{
		Handler: outbox.HandlerFunc(func(context.Context, outbox.Message) error { return nil }),
		Tracer:  r.tracer,
	})
	if err != nil {
		t.Fatal(err)
	}
	if n, err := relay.RunBatch(ctx); n != 1 || err != nil {
		t.Fatalf("RunBatch = %d, %v", n, err)
	}
	d := r.one(t, "pgcoord.outbox.deliver")
	if d.Parent.IsValid() {
		t.Errorf("delivery span has parent %s, want a root span", d.Parent.SpanID())
	}
	wantStatus(t, d, codes.Unset)
}

// The trace's tracestate travels with traceparent.
func TestOutboxEnqueueCarriesTraceState(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t)
	r := newRecorder(t)
	state, err := trace.ParseTraceState("vendor=blue")
	if err != nil {
		t.Fatal(err)
	}
	remote := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: trace.TraceID{1, 2, 3}, SpanID: trace.SpanID{4, 5, 6}, TraceFlags: trace.FlagsSampled, TraceState: state, Remote: true,
	})
	prodCtx := trace.ContextWithRemoteSpanContext(ctx, remote)
	var msg outbox.Message
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		msg, err = r.tracer.Enqueue(prodCtx, tx, outbox.Message{Topic: "orders", Key: "o-9"})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	stored, err := outbox.Get(ctx, pool, msg.ID)
	if err != nil {
		t.Fatal(err)
	}
	if stored.Headers["tracestate"] != "vendor=blue" || !strings.HasPrefix(stored.Headers["traceparent"], "00-"+remote.TraceID().String()+"-") {
		t.Errorf("stored headers %v, want the trace %s with tracestate vendor=blue", stored.Headers, remote.TraceID())
	}
}
