package leases_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/leases"
)

// A blocked Acquire, or Do, keeps little of its stack in use, so the garbage collector
// halves the stack its statement grew (8 KiB to 4 KiB): 1,000 parked waiters hold less than
// 6 KiB of stack each. Not parallel, and not under -race (see pgtest.ParkedStacks).
func TestParkedWaitersStacksShrink(t *testing.T) {
	if pgtest.RaceBuild() {
		t.Skip("-race: the stack guard is doubled, so stacks do not shrink to 4 KiB")
	}
	opts := leases.AcquireOpts{PollInterval: time.Hour}
	for name, wait := range map[string]func(ctx context.Context, pool *pgxpool.Pool, name string) error{
		"Acquire": func(ctx context.Context, pool *pgxpool.Pool, name string) error {
			_, err := leases.Acquire(ctx, pool, name, time.Minute, &opts)
			return err
		},
		"Do": func(ctx context.Context, pool *pgxpool.Pool, name string) error {
			return leases.Do(ctx, pool, name, time.Minute, func(context.Context, leases.Lease) error { return nil },
				&leases.DoOpts{AcquireOpts: opts})
		},
	} {
		t.Run(name, func(t *testing.T) {
			pool := pgtest.Pool(t)
			mustAcquire(t, pool, "parked", time.Hour, nil)
			pgtest.ParkedStacks(t, 1000, "leases.(*acquisition).run(", 6<<10,
				func(ctx context.Context) error { return wait(ctx, pool, "parked") })
		})
	}
}
