package otelcoord

import (
	"context"
	"fmt"
	"maps"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/pgcoord/pgcoord/internal/tracing"
	"github.com/pgcoord/pgcoord/outbox"
	"github.com/pgcoord/pgcoord/pgcoord"
)

// ScopeName is the instrumentation scope of the spans.
const ScopeName = "github.com/pgcoord/pgcoord/otelcoord"

// Opts are the options of New. A nil *Opts means the defaults.
type Opts struct {
	// TracerProvider provides the tracer. Default otel.GetTracerProvider().
	TracerProvider trace.TracerProvider
}

// Tracer is a pgcoord.Tracer that reports spans to OpenTelemetry and carries trace
// context in outbox messages' headers in the W3C Trace Context format
// (propagation.TraceContext). It is safe for concurrent use.
type Tracer struct {
	tracer trace.Tracer
	prop   propagation.TextMapPropagator
}

// New returns a Tracer.
func New(opts *Opts) *Tracer {
	var o Opts
	if opts != nil {
		o = *opts
	}
	if o.TracerProvider == nil {
		o.TracerProvider = otel.GetTracerProvider()
	}
	return &Tracer{tracer: o.TracerProvider.Tracer(ScopeName), prop: propagation.TraceContext{}}
}

// Start begins the span op as a child of ctx's span (see pgcoord.Tracer). Enqueues are
// producer spans, deliveries consumer spans, the others internal.
func (t *Tracer) Start(ctx context.Context, op string, attrs ...pgcoord.Attr) (context.Context, pgcoord.Span) {
	kind := trace.SpanKindInternal
	switch op {
	case tracing.OutboxEnqueue:
		kind = trace.SpanKindProducer
	case tracing.OutboxDeliver:
		kind = trace.SpanKindConsumer
	}
	ctx, s := t.tracer.Start(ctx, op, trace.WithSpanKind(kind), trace.WithAttributes(convert(attrs)...))
	return ctx, span{s}
}

// Extract returns ctx carrying the remote span context of headers' traceparent and
// tracestate, or ctx unchanged if they carry none.
func (t *Tracer) Extract(ctx context.Context, headers map[string]string) context.Context {
	return t.prop.Extract(ctx, propagation.MapCarrier(headers))
}

// Enqueue is outbox.Enqueue in a producer span "pgcoord.outbox.enqueue" whose W3C trace
// context (traceparent, tracestate) it adds to the message's headers (a copy: msg's map
// is not changed), so that a relay with this Tracer continues the trace when it delivers
// the message. Those headers count toward outbox.MaxHeaders. Errors are
// outbox.Enqueue's.
func (t *Tracer) Enqueue(ctx context.Context, tx pgx.Tx, msg outbox.Message) (_ outbox.Message, err error) {
	ctx, s := t.Start(ctx, tracing.OutboxEnqueue,
		tracing.Str(tracing.AttrTopic, msg.Topic), tracing.Str(tracing.AttrMsgKey, msg.Key))
	defer func() { s.End(err) }()
	headers := make(map[string]string, len(msg.Headers)+2)
	maps.Copy(headers, msg.Headers)
	t.prop.Inject(ctx, propagation.MapCarrier(headers))
	msg.Headers = headers
	out, err := outbox.Enqueue(ctx, tx, msg)
	if err == nil {
		s.SetAttrs(tracing.Int(tracing.AttrMsgID, out.ID))
	}
	return out, err
}

// span is an OpenTelemetry span as a pgcoord.Span.
type span struct{ s trace.Span }

func (s span) SetAttrs(attrs ...pgcoord.Attr) { s.s.SetAttributes(convert(attrs)...) }

func (s span) AddEvent(name string, attrs ...pgcoord.Attr) {
	s.s.AddEvent(name, trace.WithAttributes(convert(attrs)...))
}

func (s span) End(err error) {
	if err != nil {
		s.s.RecordError(err)
		s.s.SetStatus(codes.Error, err.Error())
	}
	s.s.End()
}

// convert turns pgcoord attributes into OpenTelemetry ones.
func convert(attrs []pgcoord.Attr) []attribute.KeyValue {
	kvs := make([]attribute.KeyValue, len(attrs))
	for i, a := range attrs {
		switch v := a.Value.(type) {
		case string:
			kvs[i] = attribute.String(a.Key, v)
		case int64:
			kvs[i] = attribute.Int64(a.Key, v)
		case bool:
			kvs[i] = attribute.Bool(a.Key, v)
		default:
			kvs[i] = attribute.String(a.Key, fmt.Sprint(v))
		}
	}
	return kvs
}
