package otelcoord_test

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel/codes"

	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/schedules"
)

// A Scheduler's claim of a due tick and the run are spans, as RunTick's are; the handler's
// context carries the run's span.
func TestScheduleClaimAndRun(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	r := newRecorder(t)
	if _, err := schedules.Create(t.Context(), pool, schedules.Schedule{Name: "every-second", Expr: "* * * * * *", Handler: "h"}, nil); err != nil {
		t.Fatal(err)
	}
	ran := make(chan schedules.Run, 1)
	s, err := schedules.New(schedules.Config{Pool: pool, Holder: "replica-1", Tracer: r.tracer,
		Handlers: map[string]schedules.Handler{"h": func(ctx context.Context, run schedules.Run) error {
			select {
			case ran <- run:
			default:
			}
			return nil
		}}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	run := <-ran
	runs := r.waitSpans(t, "pgcoord.tick.run", 1)
	cancel()
	<-done
	wantStatus(t, runs[0], codes.Unset)
	wantAttrs(t, runs[0], map[string]any{"pgcoord.job.name": "every-second", "pgcoord.holder": "replica-1"})
	var claimed bool
	for _, c := range r.spans("pgcoord.tick.claim") {
		wantAttrs(t, c, map[string]any{"pgcoord.job.name": "every-second", "pgcoord.holder": "replica-1"})
		if v, ok := attr(c, "pgcoord.job.claimed"); ok && v.AsBool() {
			claimed = true
		}
	}
	if !claimed {
		t.Errorf("no claim span says it claimed the run of tick %s", run.Tick)
	}
}
