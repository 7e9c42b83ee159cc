package otelcoord_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.opentelemetry.io/otel/codes"

	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/semaphore"
)

// A semaphore Acquire that waits in line is one span with a wait event per refused
// attempt, ending at its admission with the permit's token; a refused TryAcquire records
// ErrFull.
func TestSemaphoreWaitAndAdmission(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t)
	r := newRecorder(t)
	w := newWatcher(r)

	first, err := semaphore.TryAcquire(ctx, pool, "tenant-7", 1, time.Minute, &semaphore.AcquireOpts{Holder: "a", Tracer: r.tracer})
	if err != nil {
		t.Fatal(err)
	}
	try := r.one(t, "pgcoord.semaphore.try_acquire")
	wantStatus(t, try, codes.Unset)
	wantAttrs(t, try, map[string]any{"pgcoord.semaphore.key": "tenant-7", "pgcoord.semaphore.limit": int64(1),
		"pgcoord.holder": "a", "pgcoord.token": first.Token})

	if _, err := semaphore.TryAcquire(ctx, pool, "tenant-7", 1, time.Minute, &semaphore.AcquireOpts{Tracer: r.tracer}); !errors.Is(err, semaphore.ErrFull) {
		t.Fatalf("TryAcquire of a full key: %v", err)
	}
	refused := r.spans("pgcoord.semaphore.try_acquire")[1]
	wantStatus(t, refused, codes.Error)
	if _, ok := attr(refused, "pgcoord.token"); ok {
		t.Error("a refused TryAcquire has a token attribute")
	}

	callerCtx, caller := r.test.Start(ctx, "caller")
	call := pgtest.Go(func() (semaphore.Permit, error) {
		return semaphore.Acquire(callerCtx, pool, "tenant-7", 1, time.Minute,
			&semaphore.AcquireOpts{Holder: "b", Tracer: w, PollInterval: 50 * time.Millisecond})
	})
	w.waitEvent(t, "pgcoord.wait")
	if err := semaphore.Release(ctx, pool, first); err != nil {
		t.Fatal(err)
	}
	second, err := call.Wait(t)
	if err != nil {
		t.Fatal(err)
	}
	caller.End()

	acq := r.one(t, "pgcoord.semaphore.acquire")
	wantChild(t, acq, r.one(t, "caller"))
	wantStatus(t, acq, codes.Unset)
	wantAttrs(t, acq, map[string]any{"pgcoord.semaphore.key": "tenant-7", "pgcoord.holder": "b", "pgcoord.token": second.Token})
	event(t, acq, "pgcoord.wait")
	if n, _ := attr(acq, "pgcoord.attempts"); n.AsInt64() < 2 {
		t.Errorf("pgcoord.attempts = %d, want at least 2", n.AsInt64())
	}
	if !acq.EndTime.After(acq.Events[0].Time) {
		t.Error("the admission span ended before its wait")
	}
}
