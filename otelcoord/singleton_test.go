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
	"github.com/pgcoord/pgcoord/singleton"
)

// RunTick's claim and run are two spans; the run's context reaches fn, fn's error is
// recorded, and a claim that finds no tick to run is no error.
func TestTickClaimAndRun(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t)
	r := newRecorder(t)
	job := singleton.Job{Name: "weekly-report", Every: time.Hour}
	opts := &singleton.RunTickOpts{Holder: "replica-1", Tracer: r.tracer}

	boom := errors.New("smtp down")
	var fnSpan trace.SpanContext
	var run singleton.Run
	callerCtx, caller := r.test.Start(ctx, "caller")
	ran, err := singleton.RunTick(callerCtx, pool, job, func(ctx context.Context, rn singleton.Run) error {
		fnSpan, run = trace.SpanContextFromContext(ctx), rn
		return boom
	}, opts)
	caller.End()
	if !ran || !errors.Is(err, boom) {
		t.Fatalf("RunTick = %v, %v", ran, err)
	}
	tick := run.ScheduledFor.UTC().Format(time.RFC3339Nano)
	want := map[string]any{"pgcoord.job.name": "weekly-report", "pgcoord.job.tick": tick,
		"pgcoord.token": run.Token, "pgcoord.attempt": int64(1), "pgcoord.holder": "replica-1"}

	claim := r.one(t, "pgcoord.tick.claim")
	wantStatus(t, claim, codes.Unset)
	wantAttrs(t, claim, want)
	wantAttrs(t, claim, map[string]any{"pgcoord.job.claimed": true})
	runSpan := r.one(t, "pgcoord.tick.run")
	wantStatus(t, runSpan, codes.Error)
	wantAttrs(t, runSpan, want)
	if fnSpan.SpanID() != runSpan.SpanContext.SpanID() {
		t.Errorf("fn's context carries span %s, want the run's %s", fnSpan.SpanID(), runSpan.SpanContext.SpanID())
	}
	wantChild(t, claim, r.one(t, "caller"))
	wantChild(t, runSpan, r.one(t, "caller"))

	// The tick already ran: the next claim finds nothing, which is no error.
	ran, err = singleton.RunTick(ctx, pool, job, func(context.Context, singleton.Run) error { return nil }, opts)
	if ran || err != nil {
		t.Fatalf("second RunTick = %v, %v", ran, err)
	}
	claims := r.spans("pgcoord.tick.claim")
	if len(claims) != 2 {
		t.Fatalf("%d claim spans, want 2", len(claims))
	}
	wantStatus(t, claims[1], codes.Unset)
	wantAttrs(t, claims[1], map[string]any{"pgcoord.job.claimed": false})
	if n := len(r.spans("pgcoord.tick.run")); n != 1 {
		t.Errorf("%d run spans, want 1 (no run without a tick)", n)
	}
}

// A run lost while fn runs (here: finished behind its back, so the next heartbeat finds
// it no longer current) is an event on the run's span.
func TestTickLost(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t)
	r := newRecorder(t)
	job := singleton.Job{Name: "sweep", Every: time.Hour, TTL: 300 * time.Millisecond}
	ran, err := singleton.RunTick(ctx, pool, job, func(ctx context.Context, run singleton.Run) error {
		if err := singleton.FinishTick(ctx, pool, run, nil); err != nil {
			return err
		}
		<-ctx.Done()
		return ctx.Err()
	}, &singleton.RunTickOpts{Tracer: r.tracer, Logger: slog.New(slog.DiscardHandler)})
	if !ran || !errors.Is(err, singleton.ErrLost) {
		t.Fatalf("RunTick = %v, %v; want a lost run", ran, err)
	}
	run := r.one(t, "pgcoord.tick.run")
	wantStatus(t, run, codes.Error)
	if cause, _ := eventAttr(event(t, run, "pgcoord.tick.lost"), "pgcoord.cause").(string); cause == "" {
		t.Error("lost event without a cause")
	}
}

// Schedule traces each tick it claims and runs.
func TestScheduleTraced(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	r := newRecorder(t)
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- singleton.Schedule(ctx, pool, singleton.Job{Name: "every-200ms", Every: 200 * time.Millisecond},
			func(context.Context, singleton.Run) error { return nil },
			&singleton.ScheduleOpts{Tracer: r.tracer, Logger: slog.New(slog.DiscardHandler)})
	}()
	run := r.waitSpans(t, "pgcoord.tick.run", 1)[0]
	stop()
	<-done
	wantAttrs(t, run, map[string]any{"pgcoord.job.name": "every-200ms", "pgcoord.attempt": int64(1)})
	wantStatus(t, run, codes.Unset)
	var claimed bool
	for _, c := range r.spans("pgcoord.tick.claim") {
		if v, _ := attr(c, "pgcoord.job.claimed"); v.AsBool() {
			claimed = true
		}
	}
	if !claimed {
		t.Error("no claim span with pgcoord.job.claimed true")
	}
}
