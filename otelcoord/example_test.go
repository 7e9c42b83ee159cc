package otelcoord_test

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/leases"
	"github.com/pgcoord/pgcoord/otelcoord"
	"github.com/pgcoord/pgcoord/outbox"
)

func ExampleNew() {
	ctx := context.Background()
	pool := pgtest.ExamplePool() // your *pgxpool.Pool, with pgcoord migrated

	// Your OpenTelemetry SDK; here one that keeps the spans in memory. With nil Opts,
	// New uses otel.GetTracerProvider().
	spans := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	defer tp.Shutdown(ctx)
	tracer := otelcoord.New(&otelcoord.Opts{TracerProvider: tp})

	// Name the tracer in the options of the calls to trace.
	lease, err := leases.Acquire(ctx, pool, "nightly", time.Minute, &leases.AcquireOpts{Tracer: tracer})
	if err != nil {
		panic(err)
	}
	leases.Release(ctx, pool, lease, nil)

	// The producer enqueues through the tracer: the message carries its trace context...
	pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := tracer.Enqueue(ctx, tx, outbox.Message{Topic: "orders", Key: "o-42", Payload: []byte("placed")})
		return err
	})
	// ... and a relay with the tracer delivers it in the producer's trace.
	relay, _ := outbox.NewRelay(pool, &outbox.Config{
		Handler: outbox.HandlerFunc(func(ctx context.Context, m outbox.Message) error { return nil }),
		Tracer:  tracer,
	})
	relay.RunBatch(ctx)

	ended := spans.GetSpans()
	for _, s := range ended {
		fmt.Println(s.Name, s.SpanKind)
	}
	enqueue, deliver := ended[1], ended[2]
	fmt.Println("delivery continues the producer's trace:",
		deliver.SpanContext.TraceID() == enqueue.SpanContext.TraceID() && deliver.Parent.SpanID() == enqueue.SpanContext.SpanID())
	// Output:
	// pgcoord.lease.acquire internal
	// pgcoord.outbox.enqueue producer
	// pgcoord.outbox.deliver consumer
	// delivery continues the producer's trace: true
}
