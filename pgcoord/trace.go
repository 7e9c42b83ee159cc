package pgcoord

import "context"

// Tracer traces what pgcoord's calls do, as spans: set it in the options of the calls it
// should trace (leases.AcquireOpts.Tracer, semaphore.AcquireOpts.Tracer,
// singleton.RunTickOpts.Tracer, idempotency.BeginOpts.Tracer, outbox.Config.Tracer, ...).
// Package otelcoord implements it with OpenTelemetry; this package defines only the
// interface, so the primitives depend on no tracing library. A nil Tracer, the default,
// traces nothing: the calls then only compare it with nil. docs/observability.md lists the
// spans and their attributes.
type Tracer interface {
	// Start begins the span of the operation op (e.g. "pgcoord.lease.acquire") as a
	// child of ctx's span, with attrs, and returns ctx carrying it.
	Start(ctx context.Context, op string, attrs ...Attr) (context.Context, Span)
	// Extract returns ctx carrying the remote span context that headers (an outbox
	// message's) carry, if any, so that a span started from it continues that trace.
	Extract(ctx context.Context, headers map[string]string) context.Context
}

// Span is one traced operation, begun by Tracer.Start.
type Span interface {
	// SetAttrs adds attributes to the span.
	SetAttrs(attrs ...Attr)
	// AddEvent records that something happened during the span.
	AddEvent(name string, attrs ...Attr)
	// End ends the span, recording err on it if err is not nil.
	End(err error)
}

// Attr is an attribute of a span or event. Value is a string, an int64 or a bool.
type Attr struct {
	Key   string
	Value any
}
