package otelcoord_test

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/leases"
	"github.com/pgcoord/pgcoord/otelcoord"
)

// New(nil) reports to the global TracerProvider; a call given no Tracer is not traced,
// even with a global provider set. Not parallel: it sets the global provider.
func TestGlobalProviderAndUntracedCalls(t *testing.T) {
	ctx := context.Background()
	pool := pgtest.Pool(t)
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	defer tp.Shutdown(ctx)
	prev := otel.GetTracerProvider()
	otel.SetTracerProvider(tp)
	defer otel.SetTracerProvider(prev)

	l, err := leases.TryAcquire(ctx, pool, "untraced", time.Minute, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := leases.Release(ctx, pool, l, nil); err != nil {
		t.Fatal(err)
	}
	if n := len(exp.GetSpans()); n != 0 {
		t.Fatalf("a call without a Tracer made %d spans", n)
	}
	if _, err := leases.TryAcquire(ctx, pool, "traced", time.Minute, &leases.AcquireOpts{Tracer: otelcoord.New(nil)}); err != nil {
		t.Fatal(err)
	}
	spans := exp.GetSpans()
	if len(spans) != 1 || spans[0].Name != "pgcoord.lease.try_acquire" || spans[0].InstrumentationScope.Name != otelcoord.ScopeName {
		t.Fatalf("spans %v, want one pgcoord.lease.try_acquire of scope %s", spans, otelcoord.ScopeName)
	}
}

// The primitives do not import OpenTelemetry: only this package does.
func TestPrimitivesImportNoOpenTelemetry(t *testing.T) {
	t.Parallel()
	pkgs := []string{"leases", "fenced", "semaphore", "singleton", "dedupe", "idempotency", "outbox", "outbox/sink",
		"outbox/inbox", "ratelimit", "metrics", "pgcoord"}
	for i, p := range pkgs {
		pkgs[i] = "github.com/pgcoord/pgcoord/" + p
	}
	out, err := exec.Command("go", append([]string{"list", "-deps"}, pkgs...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	if strings.Contains(string(out), "go.opentelemetry.io") {
		t.Errorf("a primitive imports OpenTelemetry:\n%s", out)
	}
	if !strings.Contains(string(out), "github.com/pgcoord/pgcoord/leases\n") {
		t.Errorf("go list did not list the packages:\n%s", out)
	}
}
