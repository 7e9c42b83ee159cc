package semaphore_test

import (
	"context"
	"testing"
	"time"

	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/semaphore"
)

// A blocked Acquire keeps little of its stack in use, so the garbage collector halves the
// stack its statements grew (8 KiB to 4 KiB): 1,000 parked waiters hold less than 6 KiB of
// stack each. Not parallel, and not under -race (see pgtest.ParkedStacks).
func TestParkedWaitersStacksShrink(t *testing.T) {
	if pgtest.RaceBuild() {
		t.Skip("-race: the stack guard is doubled, so stacks do not shrink to 4 KiB")
	}
	const key = "parked"
	pool := pgtest.Pool(t)
	mustTry(t, pool, key, 1, time.Hour, nil)
	opts := semaphore.AcquireOpts{PollInterval: time.Hour}
	pgtest.ParkedStacks(t, 1000, "semaphore.Acquire(", 6<<10, func(ctx context.Context) error {
		_, err := semaphore.Acquire(ctx, pool, key, 1, time.Minute, &opts)
		return err
	})
}
