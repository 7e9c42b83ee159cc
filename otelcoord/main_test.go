package otelcoord_test

import (
	"context"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/otelcoord"
	"github.com/pgcoord/pgcoord/pgcoord"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// recorder is an OpenTelemetry SDK whose spans land in memory, with a Tracer on it.
type recorder struct {
	exp    *tracetest.InMemoryExporter
	tracer *otelcoord.Tracer
	// test makes spans of the test's own (the callers' parents).
	test trace.Tracer
}

func newRecorder(t *testing.T) *recorder {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return &recorder{exp: exp, tracer: otelcoord.New(&otelcoord.Opts{TracerProvider: tp}), test: tp.Tracer("test")}
}

// spans returns the ended spans named name.
func (r *recorder) spans(name string) []tracetest.SpanStub {
	var out []tracetest.SpanStub
	for _, s := range r.exp.GetSpans() {
		if s.Name == name {
			out = append(out, s)
		}
	}
	return out
}

// one returns the only ended span named name.
func (r *recorder) one(t *testing.T, name string) tracetest.SpanStub {
	t.Helper()
	ss := r.spans(name)
	if len(ss) != 1 {
		t.Fatalf("%d spans %q, want 1; all: %v", len(ss), name, r.names())
	}
	return ss[0]
}

// waitSpans waits, at most pgtest.WaitLimit, until n spans named name have ended.
func (r *recorder) waitSpans(t *testing.T, name string, n int) []tracetest.SpanStub {
	t.Helper()
	deadline := time.Now().Add(pgtest.WaitLimit)
	for {
		if ss := r.spans(name); len(ss) >= n {
			return ss
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d spans %q ended, want %d; all: %v", len(r.spans(name)), name, n, r.names())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (r *recorder) names() []string {
	var out []string
	for _, s := range r.exp.GetSpans() {
		out = append(out, s.Name)
	}
	return out
}

// attr returns the attribute key of s.
func attr(s tracetest.SpanStub, key string) (attribute.Value, bool) {
	for _, kv := range s.Attributes {
		if string(kv.Key) == key {
			return kv.Value, true
		}
	}
	return attribute.Value{}, false
}

// wantAttrs fails t unless s has the attributes want (string, int64 or bool values).
func wantAttrs(t *testing.T, s tracetest.SpanStub, want map[string]any) {
	t.Helper()
	for k, w := range want {
		v, ok := attr(s, k)
		if !ok {
			t.Errorf("span %s: no attribute %s; has %v", s.Name, k, s.Attributes)
			continue
		}
		if got := v.AsInterface(); got != w {
			t.Errorf("span %s: %s = %v (%T), want %v (%T)", s.Name, k, got, got, w, w)
		}
	}
}

// event returns s's event name.
func event(t *testing.T, s tracetest.SpanStub, name string) sdktrace.Event {
	t.Helper()
	for _, e := range s.Events {
		if e.Name == name {
			return e
		}
	}
	t.Fatalf("span %s has no event %s; events: %v", s.Name, name, s.Events)
	return sdktrace.Event{}
}

func eventAttr(e sdktrace.Event, key string) any {
	for _, kv := range e.Attributes {
		if string(kv.Key) == key {
			return kv.Value.AsInterface()
		}
	}
	return nil
}

// wantChild fails t unless child's parent is parent, in parent's trace.
func wantChild(t *testing.T, child, parent tracetest.SpanStub) {
	t.Helper()
	if child.Parent.SpanID() != parent.SpanContext.SpanID() || child.SpanContext.TraceID() != parent.SpanContext.TraceID() {
		t.Errorf("span %s (trace %s, parent %s) is not a child of %s (trace %s, span %s)", child.Name,
			child.SpanContext.TraceID(), child.Parent.SpanID(), parent.Name, parent.SpanContext.TraceID(), parent.SpanContext.SpanID())
	}
}

// wantStatus fails t unless s's status is code, and an error was recorded exactly when
// the status is Error.
func wantStatus(t *testing.T, s tracetest.SpanStub, code codes.Code) {
	t.Helper()
	if s.Status.Code != code {
		t.Errorf("span %s: status %v (%q), want %v", s.Name, s.Status.Code, s.Status.Description, code)
	}
	recorded := false
	for _, e := range s.Events {
		recorded = recorded || e.Name == "exception"
	}
	if recorded != (code == codes.Error) {
		t.Errorf("span %s: error recorded %v with status %v", s.Name, recorded, code)
	}
}

// watcher is a pgcoord.Tracer that forwards to the recorder's and reports the events of
// the spans it starts as they happen, so a test can wait for a call to be waiting.
type watcher struct {
	*otelcoord.Tracer
	events chan string
}

func newWatcher(r *recorder) *watcher {
	return &watcher{Tracer: r.tracer, events: make(chan string, 100)}
}

func (w *watcher) Start(ctx context.Context, op string, attrs ...pgcoord.Attr) (context.Context, pgcoord.Span) {
	ctx, s := w.Tracer.Start(ctx, op, attrs...)
	return ctx, watched{Span: s, events: w.events}
}

// waitEvent waits, at most pgtest.WaitLimit, for an event named name.
func (w *watcher) waitEvent(t *testing.T, name string) {
	t.Helper()
	timeout := time.After(pgtest.WaitLimit)
	for {
		select {
		case e := <-w.events:
			if e == name {
				return
			}
		case <-timeout:
			t.Fatalf("no event %s within %v", name, pgtest.WaitLimit)
		}
	}
}

type watched struct {
	pgcoord.Span
	events chan string
}

func (s watched) AddEvent(name string, attrs ...pgcoord.Attr) {
	s.Span.AddEvent(name, attrs...)
	select {
	case s.events <- name:
	default:
	}
}
