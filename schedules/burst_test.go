package schedules_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/schedules"
)

// TestBurstLargerThanOneLook: 250 schedules due at the same instant, more than one look
// reads (100), all start at once on one Scheduler that polls only once a minute and whose
// runs do not finish meanwhile: it looks again at once while its looks make progress,
// instead of waiting for its poll or for a run to end.
func TestBurstLargerThanOneLook(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	clock := pgtest.NewClock(t, pool)
	t0 := time.Date(2026, 6, 1, 9, 59, 0, 0, time.UTC)
	clock.Freeze(t0)
	const n = 250
	for i := range n {
		if _, err := schedules.Create(t.Context(), pool, schedules.Schedule{Name: fmt.Sprintf("s%03d", i), Expr: "0 * * * *", Handler: "h"}, nil); err != nil {
			t.Fatal(err)
		}
	}
	clock.Freeze(t0.Add(90 * time.Second)) // 10:00:30: every schedule's 10:00 tick is due
	c := newCalls()
	gate := make(chan struct{})
	s, err := schedules.New(schedules.Config{Pool: pool, PollInterval: time.Minute, MaxRuns: 1000,
		Handlers: map[string]schedules.Handler{"h": func(ctx context.Context, run schedules.Run) error {
			c.record(run)
			<-gate
			return nil
		}}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	defer func() {
		close(gate)
		cancel()
		<-done
	}()
	pgtest.Until(t, "every schedule's tick started", func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return len(c.all) >= n
	})
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.all) != n || len(c.runs) != n {
		t.Errorf("%d runs of %d schedules, want %d of %d", len(c.all), len(c.runs), n, n)
	}
}
