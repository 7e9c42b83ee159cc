// Package otelcoord traces pgcoord's primitives with OpenTelemetry. It is opt-in: the
// primitives define only the small pgcoord.Tracer interface and import no tracing
// library, so a program that does not import this package links none of OpenTelemetry,
// and a call given no Tracer pays a nil check.
//
// Create a Tracer once and name it in the options of the calls it should trace, as with
// the Metrics values of package metrics:
//
//	tracer := otelcoord.New(nil) // spans go to otel.GetTracerProvider()
//	lease, err := leases.Acquire(ctx, pool, "nightly", time.Minute, &leases.AcquireOpts{Tracer: tracer})
//	permit, err := semaphore.Acquire(ctx, pool, key, 4, time.Minute, &semaphore.AcquireOpts{Tracer: tracer})
//	ran, err := singleton.RunTick(ctx, pool, job, run, &singleton.RunTickOpts{Tracer: tracer})
//	attempt, err := idempotency.Begin(ctx, pool, scope, key, fp, &idempotency.BeginOpts{Tracer: tracer})
//	msg, err := tracer.Enqueue(ctx, tx, outbox.Message{...}) // outbox.Enqueue, traced
//	relay, err := outbox.NewRelay(pool, &outbox.Config{Handler: h, Tracer: tracer})
//
// docs/observability.md lists the spans, their attributes and events.
//
// # Guarantees
//
//   - Every span is a child of the span in the caller's context (a delivery's: of the
//     context its message carries, see below), and the context a primitive hands to the
//     caller's function (leases.Do's fn, singleton.RunTick's fn, the relay's Handler)
//     carries the primitive's span, so the function's own spans are its children.
//   - Tracer.Enqueue writes the W3C trace context of its span (traceparent, and
//     tracestate when there is one) into the message's Headers, in the producer's
//     transaction; a relay with a Tracer starts each delivery span as a child of the
//     context those headers carry, so the delivery continues the producer's trace,
//     whichever process delivers it and however much later.
//   - A span of a call that returned an error records it (an exception event) and has
//     status Error. An outcome that is not an error (no tick to run) is an attribute.
//
// # Failure modes
//
//   - A message enqueued without Tracer.Enqueue (outbox.Enqueue, EnqueueBatch, the SQL
//     API) carries no trace context: its delivery span starts a trace of its own (or
//     continues the relay's context).
//   - Span attributes name leases, keys, jobs and idempotency keys as given: do not put
//     secrets in them.
package otelcoord
