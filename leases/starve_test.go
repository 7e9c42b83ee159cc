package leases_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/leases"
)

// Waiters never starve a holder. A pool of 4 connections, 16 callers waiting in Acquire
// (half of them for the holder's own lease, half for leases held by someone else for an
// hour, all polling every 250ms on top of the notifications), and a Do holder with a 3s TTL
// whose function runs for 10s: the holder keeps its lease the whole time, as the database
// sees it, its function's context is never cancelled and Do returns nil. When each waiter
// held a connection of its own (to LISTEN on), four waiters took the whole pool, the
// holder's renewals could not get a connection, and the lease was lost within 3s.
func TestWaitersDoNotStarveAHoldersRenewals(t *testing.T) {
	t.Parallel()
	const (
		waiters = 16
		ttl     = 3 * time.Second
		runFor  = 10 * time.Second
	)
	pool := pgtest.PoolMax(t, 4)
	var schema string
	if err := pool.QueryRow(ctx, `SELECT current_schema()`).Scan(&schema); err != nil {
		t.Fatal(err)
	}
	observer := pgtest.NewPool(t, pgtest.URL(t), schema) // the test's eyes, outside the pool under test
	for i := range 4 {
		mustAcquire(t, pool, fmt.Sprintf("held-%d", i), time.Hour, nil)
	}

	m := &leases.Metrics{}
	var samples, held int
	err := leases.Do(ctx, pool, "holder", ttl, func(fnCtx context.Context, l leases.Lease) error {
		waitCtx, stopWaiters := context.WithCancel(ctx)
		var wg sync.WaitGroup
		errs := make(chan error, waiters)
		for i := range waiters {
			name := "holder"
			if i%2 == 1 {
				name = fmt.Sprintf("held-%d", i/2%4)
			}
			wg.Go(func() {
				_, err := leases.Acquire(waitCtx, pool, name, time.Minute, &leases.AcquireOpts{PollInterval: 250 * time.Millisecond})
				errs <- err
			})
		}
		defer func() {
			stopWaiters()
			wg.Wait()
			close(errs)
			for err := range errs {
				if !errors.Is(err, context.Canceled) {
					t.Errorf("a waiter returned %v before it was stopped, want it still waiting", err)
				}
			}
		}()

		// Watch the lease, by the database clock, for runFor.
		end := time.Now().Add(runFor)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for time.Now().Before(end) {
			select {
			case <-fnCtx.Done():
				return fmt.Errorf("fn's context was cancelled after %v: %w", runFor-time.Until(end), context.Cause(fnCtx))
			case <-tick.C:
			}
			var ok bool
			err := observer.QueryRow(ctx, `SELECT coalesce(bool_and(holder = $1 AND fence_token = $2 AND expires_at > pgcoord_clock()), false)
				FROM pgcoord_leases WHERE name = 'holder'`, l.Holder, l.Token).Scan(&ok)
			if err != nil {
				return err
			}
			samples++
			if ok {
				held++
			}
		}
		if fnCtx.Err() != nil {
			return fmt.Errorf("fn's context was cancelled: %w", context.Cause(fnCtx))
		}
		return nil
	}, &leases.DoOpts{Metrics: m, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatalf("Do: %v (renewals %d, renewal errors %d)", err, m.Renewals.Load(), m.RenewErrors.Load())
	}
	if samples == 0 || held != samples {
		t.Fatalf("the holder held its lease in %d of %d observations over %v", held, samples, runFor)
	}
	if m.Lost.Load() != 0 || m.Renewals.Load() < 3 {
		t.Fatalf("renewals %d, renewal errors %d, lost %d: want the lease kept by renewals", m.Renewals.Load(), m.RenewErrors.Load(), m.Lost.Load())
	}
	t.Logf("%d observations, %d renewals (%d failed, %d near misses)", samples, m.Renewals.Load(), m.RenewErrors.Load(), m.NearMisses.Load())
}
