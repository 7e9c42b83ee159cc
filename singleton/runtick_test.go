package singleton_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/singleton"
)

// RunTick runs the current tick once and records it; a second call in the same slot finds
// nothing to run.
func TestRunTickRunsATickOnce(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	ctx := t.Context()
	job := singleton.Job{Name: "digest", Every: time.Hour}
	var got []singleton.Run
	fn := func(_ context.Context, run singleton.Run) error { got = append(got, run); return nil }
	if ran, err := singleton.RunTick(ctx, pool, job, fn, &singleton.RunTickOpts{Holder: "pod-1"}); !ran || err != nil {
		t.Fatalf("RunTick = (%v, %v), want (true, nil)", ran, err)
	}
	if ran, err := singleton.RunTick(ctx, pool, job, fn, &singleton.RunTickOpts{Holder: "pod-2"}); ran || err != nil {
		t.Fatalf("a second RunTick in the slot = (%v, %v), want (false, nil)", ran, err)
	}
	if len(got) != 1 || got[0].Attempt != 1 || got[0].Token < 1 || got[0].Holder != "pod-1" {
		t.Fatalf("fn saw %+v, want one run, attempt 1, a positive token, by pod-1", got)
	}
	rs := runs(t, pool, "digest")
	if len(rs) != 1 || rs[0].State != "succeeded" || !rs[0].ScheduledFor.Equal(got[0].ScheduledFor) {
		t.Fatalf("ledger %+v; want the tick succeeded", rs)
	}
}

// fn's error is returned and recorded as the run's failure; a panic is recorded too.
func TestRunTickRecordsFailures(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	ctx := t.Context()
	boom := errors.New("boom")
	ran, err := singleton.RunTick(ctx, pool, singleton.Job{Name: "failing", Every: time.Hour},
		func(context.Context, singleton.Run) error { return boom }, nil)
	if !ran || !errors.Is(err, boom) {
		t.Fatalf("RunTick = (%v, %v), want (true, boom)", ran, err)
	}
	if rs := runs(t, pool, "failing"); len(rs) != 1 || rs[0].State != "failed" || rs[0].Error != "boom" {
		t.Fatalf("ledger %+v; want the run failed with boom", rs)
	}
	if s := status(t, pool, "failing"); s.ConsecutiveFailures != 1 || !s.Overdue(time.Hour) {
		t.Fatalf("status %+v; want one failure, overdue", s)
	}

	func() {
		defer func() {
			if r := recover(); r != "kaboom" {
				t.Errorf("recovered %v, want fn's panic", r)
			}
		}()
		_, _ = singleton.RunTick(ctx, pool, singleton.Job{Name: "panicking", Every: time.Hour},
			func(context.Context, singleton.Run) error { panic("kaboom") }, nil)
	}()
	if rs := runs(t, pool, "panicking"); len(rs) != 1 || rs[0].State != "failed" || rs[0].Error != "panic: kaboom" {
		t.Fatalf("ledger %+v; want the run failed with the panic", rs)
	}
}

// A run that lasts several TTLs is heartbeated: its lease keeps moving and no other
// replica can take the tick over.
func TestRunTickHeartbeatsALongRun(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	ctx := t.Context()
	// Each heartbeat must land within the TTL less its margin: room for a slow round trip
	// through a pooler on a busy machine (300ms once lost the run there).
	const ttl = time.Second
	job := singleton.Job{Name: "long", Every: time.Hour, TTL: ttl}
	ran, err := singleton.RunTick(ctx, pool, job, func(fnCtx context.Context, run singleton.Run) error {
		for range 4 { // work for 4 TTLs, checking on the way
			select {
			case <-fnCtx.Done():
				return context.Cause(fnCtx)
			case <-time.After(ttl):
			}
			if _, err := singleton.ClaimTick(ctx, pool, job, &singleton.ClaimOpts{Holder: "other"}); !errors.Is(err, singleton.ErrNoTick) {
				return errors.New("another replica could claim the tick while it ran: " + errString(err))
			}
		}
		rs := runs(t, pool, "long")
		if len(rs) != 1 || rs[0].State != "running" || rs[0].Token != run.Token || !rs[0].ExpiresAt.After(run.StartedAt.Add(3*ttl)) {
			return errors.New("the lease was not extended")
		}
		return nil
	}, nil)
	if !ran || err != nil {
		t.Fatalf("RunTick = (%v, %v)", ran, err)
	}
	if rs := runs(t, pool, "long"); rs[0].State != "succeeded" || rs[0].Attempt != 1 {
		t.Fatalf("ledger %+v; want one succeeded attempt", rs)
	}
}

func errString(err error) string {
	if err == nil {
		return "<nil>"
	}
	return err.Error()
}

// When a newer tick replaces the run (OverlapReplace), the next heartbeat finds it lost:
// fn's context is cancelled with ErrLost and RunTick says so.
func TestRunTickCancelsFnWhenReplaced(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	clock := pgtest.NewClock(t, pool)
	clock.Freeze(t0)
	ctx := t.Context()
	// The TTL outlasts the slot, so the run is live when the next tick comes.
	job := singleton.Job{Name: "replaced", Every: time.Second, TTL: 3 * time.Second, Overlap: singleton.OverlapReplace}
	started := make(chan singleton.Run, 1)
	var cause error
	result := make(chan outcome, 1)
	go func() {
		ran, err := singleton.RunTick(ctx, pool, job, func(fnCtx context.Context, run singleton.Run) error {
			started <- run
			select {
			case <-fnCtx.Done():
				cause = context.Cause(fnCtx)
				return fnCtx.Err()
			case <-time.After(30 * time.Second):
				return errors.New("fn was never told its run was replaced")
			}
		}, nil)
		result <- outcome{ran, err}
	}()
	run := within(t, 10*time.Second, started, "fn starting")
	// The next slot's claim (the clock moved on to it, so the test need not wait for it)
	// replaces the run.
	clock.Advance(job.Every)
	next, err := singleton.ClaimTick(ctx, pool, job, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !next.ScheduledFor.Equal(run.ScheduledFor.Add(job.Every)) || next.Token <= run.Token {
		t.Fatalf("the next claim %+v after %+v: want the next tick, with a higher token", next, run)
	}
	r := within(t, 10*time.Second, result, "RunTick returning")
	if !r.ran || !errors.Is(r.err, singleton.ErrLost) || !errors.Is(cause, singleton.ErrLost) {
		t.Fatalf("RunTick = (%v, %v), cause %v; want ErrLost", r.ran, r.err, cause)
	}
	rs := runs(t, pool, "replaced")
	if len(rs) != 2 || rs[0].Token != next.Token || rs[0].State != "running" || rs[1].State != "replaced" {
		t.Fatalf("ledger %+v; want the old run replaced, the new one running", rs)
	}
}
