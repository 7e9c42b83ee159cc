package schedules_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/schedules"
)

// overlapRig is a schedule every second on a frozen database clock, whose first tick's run
// blocks until released (or until its context ends, which it reports on cancelled).
type overlapRig struct {
	pool      *pgxpool.Pool
	clock     *pgtest.Clock
	c         *calls
	first     time.Time
	release   chan struct{}
	cancelled chan error
}

func newOverlapRig(t *testing.T, overlap schedules.Overlap) *overlapRig {
	t.Helper()
	r := &overlapRig{pool: pgtest.Pool(t), c: newCalls(), release: make(chan struct{}), cancelled: make(chan error, 1)}
	r.clock = pgtest.NewClock(t, r.pool)
	t0 := time.Date(2026, 3, 2, 8, 0, 0, 500_000_000, time.UTC)
	r.first = t0.Add(500 * time.Millisecond)
	r.clock.Freeze(t0)
	if _, err := schedules.Create(t.Context(), r.pool, schedules.Schedule{Name: "o", Expr: "* * * * * *", Handler: "h", Overlap: overlap}, nil); err != nil {
		t.Fatal(err)
	}
	start(t, r.pool, map[string]schedules.Handler{"h": func(ctx context.Context, run schedules.Run) error {
		r.c.record(run)
		if !run.Tick.Equal(r.first) {
			return nil
		}
		select {
		case <-r.release:
			return nil
		case <-ctx.Done():
			r.cancelled <- context.Cause(ctx)
			return ctx.Err()
		}
	}})
	r.next(t, 0, "running") // the first tick runs, and blocks
	return r
}

// next moves the database clock to half a second after tick i and waits for its state.
func (r *overlapRig) next(t *testing.T, i int, state string) {
	t.Helper()
	tick := r.first.Add(time.Duration(i) * time.Second)
	r.clock.Freeze(tick.Add(500 * time.Millisecond))
	r.waitState(t, tick, state)
}

func (r *overlapRig) waitState(t *testing.T, tick time.Time, state string) {
	t.Helper()
	pgtest.Until(t, "tick "+tick.Format(time.TimeOnly)+" is "+state, func() bool {
		states, _ := runStates(t, r.pool, "o")
		return states[tick] == state
	})
}

func (r *overlapRig) ran(tick time.Time) int {
	r.c.mu.Lock()
	defer r.c.mu.Unlock()
	return r.c.runs["o"][tick]
}

// TestOverlapBuffer: of the two ticks due while a run runs, the first waits pending and
// runs once after it, the second is skipped.
func TestOverlapBuffer(t *testing.T) {
	t.Parallel()
	r := newOverlapRig(t, schedules.OverlapBuffer)
	r.next(t, 1, "pending")
	r.next(t, 2, "skipped")
	if n := r.ran(r.first.Add(time.Second)); n != 0 {
		t.Fatalf("the buffered tick ran %d times while the first ran", n)
	}
	close(r.release)
	r.waitState(t, r.first, "succeeded")
	r.waitState(t, r.first.Add(time.Second), "succeeded")
	if n, m := r.ran(r.first.Add(time.Second)), r.ran(r.first.Add(2*time.Second)); n != 1 || m != 0 {
		t.Errorf("the buffered tick ran %d times, the skipped one %d; want 1 and 0", n, m)
	}
}

// TestOverlapReplace: a tick due while a run runs marks that run replaced, cancels its
// handler's context and runs.
func TestOverlapReplace(t *testing.T) {
	t.Parallel()
	r := newOverlapRig(t, schedules.OverlapReplace)
	r.next(t, 1, "succeeded")
	select {
	case err := <-r.cancelled:
		t.Logf("the replaced run's context ended: %v", err)
	case <-time.After(pgtest.WaitLimit):
		t.Fatal("the replaced run's context was not cancelled")
	}
	r.waitState(t, r.first, "replaced")
	if n := r.ran(r.first.Add(time.Second)); n != 1 {
		t.Errorf("the replacing tick ran %d times, want 1", n)
	}
}

// TestOverlapSkip: a tick due while a run runs is skipped, and never runs.
func TestOverlapSkip(t *testing.T) {
	t.Parallel()
	r := newOverlapRig(t, schedules.OverlapSkip)
	r.next(t, 1, "skipped")
	close(r.release)
	r.waitState(t, r.first, "succeeded")
	if n := r.ran(r.first.Add(time.Second)); n != 0 {
		t.Errorf("the skipped tick ran %d times", n)
	}
}
