package otelcoord_test

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/leases"
)

// An Acquire that waits for another holder is one span, a child of the caller's, with an
// event per refused attempt naming the holder it waits for, and the token it got.
func TestLeaseAcquireWaits(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t)
	r := newRecorder(t)
	w := newWatcher(r)

	first, err := leases.TryAcquire(ctx, pool, "report", time.Minute, &leases.AcquireOpts{Holder: "a", Tracer: r.tracer})
	if err != nil {
		t.Fatal(err)
	}
	try := r.one(t, "pgcoord.lease.try_acquire")
	wantAttrs(t, try, map[string]any{"pgcoord.lease.name": "report", "pgcoord.holder": "a", "pgcoord.token": first.Token})
	wantStatus(t, try, codes.Unset)

	callerCtx, caller := r.test.Start(ctx, "caller")
	call := pgtest.Go(func() (leases.Lease, error) {
		return leases.Acquire(callerCtx, pool, "report", time.Minute,
			&leases.AcquireOpts{Holder: "b", Tracer: w, PollInterval: 50 * time.Millisecond})
	})
	w.waitEvent(t, "pgcoord.wait")
	if err := leases.Release(ctx, pool, first, nil); err != nil {
		t.Fatal(err)
	}
	second, err := call.Wait(t)
	if err != nil {
		t.Fatal(err)
	}
	caller.End()

	acq := r.one(t, "pgcoord.lease.acquire")
	wantChild(t, acq, r.one(t, "caller"))
	wantStatus(t, acq, codes.Unset)
	wantAttrs(t, acq, map[string]any{"pgcoord.lease.name": "report", "pgcoord.holder": "b", "pgcoord.token": second.Token})
	if second.Token != first.Token+1 {
		t.Errorf("token %d after %d", second.Token, first.Token)
	}
	if n, _ := attr(acq, "pgcoord.attempts"); n.AsInt64() < 2 {
		t.Errorf("pgcoord.attempts = %d, want at least 2 (one refused while a held the lease)", n.AsInt64())
	}
	if by := eventAttr(event(t, acq, "pgcoord.wait"), "pgcoord.held_by"); by != "a" {
		t.Errorf("wait event held_by %v, want a", by)
	}

	// A refused TryAcquire records ErrHeld.
	if _, err := leases.TryAcquire(ctx, pool, "report", time.Minute, &leases.AcquireOpts{Tracer: r.tracer}); !errors.Is(err, leases.ErrHeld) {
		t.Fatalf("TryAcquire of a held lease: %v", err)
	}
	wantStatus(t, r.spans("pgcoord.lease.try_acquire")[1], codes.Error)
}

// Do is a span holding the acquisition and the renewals; fn's context carries it, and a
// lost lease is an event on it, with the error recorded.
func TestLeaseDoRenewAndLoss(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t)
	r := newRecorder(t)

	var fnSpan trace.SpanContext
	var token int64
	err := leases.Do(ctx, pool, "sync", 5*time.Second, func(ctx context.Context, l leases.Lease) error {
		fnSpan, token = trace.SpanContextFromContext(ctx), l.Token
		r.waitSpans(t, "pgcoord.lease.renew", 1) // a renewal succeeded
		if _, err := leases.Expire(ctx, pool, "sync", "operator"); err != nil {
			return err
		}
		<-ctx.Done() // the next renewal finds the lease lost
		return ctx.Err()
	}, &leases.DoOpts{AcquireOpts: leases.AcquireOpts{Tracer: r.tracer}, RenewEvery: 50 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	if !errors.Is(err, leases.ErrLost) {
		t.Fatalf("Do = %v, want ErrLost", err)
	}

	do := r.one(t, "pgcoord.lease.do")
	wantStatus(t, do, codes.Error)
	wantAttrs(t, do, map[string]any{"pgcoord.lease.name": "sync", "pgcoord.token": token})
	if fnSpan.SpanID() != do.SpanContext.SpanID() {
		t.Errorf("fn's context carries span %s, want Do's %s", fnSpan.SpanID(), do.SpanContext.SpanID())
	}
	lost := event(t, do, "pgcoord.lease.lost")
	if got := eventAttr(lost, "pgcoord.token"); got != token {
		t.Errorf("lost event token %v, want %d", got, token)
	}
	if cause, _ := eventAttr(lost, "pgcoord.cause").(string); cause == "" {
		t.Error("lost event without a cause")
	}
	wantChild(t, r.one(t, "pgcoord.lease.acquire"), do)

	renewals := r.spans("pgcoord.lease.renew")
	if len(renewals) < 2 {
		t.Fatalf("%d renewals, want at least 2", len(renewals))
	}
	holder, _ := attr(do, "pgcoord.holder")
	for _, s := range renewals {
		wantChild(t, s, do)
		wantAttrs(t, s, map[string]any{"pgcoord.lease.name": "sync", "pgcoord.token": token, "pgcoord.holder": holder.AsString()})
	}
	wantStatus(t, renewals[0], codes.Unset)
	wantStatus(t, renewals[len(renewals)-1], codes.Error) // ErrLost
}

// An Elector's term is a lease.do span, whose context reaches OnStartedLeading.
func TestElectorTermIsTraced(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	r := newRecorder(t)
	elected := make(chan trace.SpanContext, 1)
	e, err := leases.NewElector(pool, &leases.ElectorConfig{
		Name: "relay-leader",
		OnStartedLeading: func(ctx context.Context, l leases.Lease) {
			elected <- trace.SpanContextFromContext(ctx)
			<-ctx.Done()
		},
		Tracer: r.tracer,
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, resign := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	var term trace.SpanContext
	select {
	case term = <-elected:
	case <-time.After(pgtest.WaitLimit):
		t.Fatal("not elected")
	}
	resign()
	<-done
	do := r.one(t, "pgcoord.lease.do")
	wantAttrs(t, do, map[string]any{"pgcoord.lease.name": "relay-leader", "pgcoord.token": int64(1)})
	if term.SpanID() != do.SpanContext.SpanID() {
		t.Errorf("OnStartedLeading's context carries span %s, want the term's %s", term.SpanID(), do.SpanContext.SpanID())
	}
	wantChild(t, r.one(t, "pgcoord.lease.acquire"), do)
}
