package leases_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/leases"
)

// Do keeps its lease alive past the TTL while fn runs, and releases it after.
func TestDoRenewsWhileFnRunsAndReleasesAfter(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	m := &leases.Metrics{}
	var token int64
	const ttl = 2 * time.Second
	err := leases.Do(ctx, pool, "long-job", ttl, func(fnCtx context.Context, l leases.Lease) error {
		token = l.Token
		// Work until the grant's first TTL has passed and renewals have kept it: judged by
		// progress, not by a guess of how fast renewals come on a busy machine.
		start := time.Now()
		deadline := start.Add(pgtest.WaitLimit)
		for time.Since(start) < ttl+100*time.Millisecond || m.Renewals.Load() < 2 {
			select {
			case <-fnCtx.Done():
				return context.Cause(fnCtx)
			case <-time.After(20 * time.Millisecond):
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("only %d renewals in %v", m.Renewals.Load(), pgtest.WaitLimit)
			}
		}
		info, err := leases.Get(ctx, pool, "long-job")
		if err != nil || !info.Held() || info.Token != l.Token || info.Holder != l.Holder || !info.ExpiresAt.After(l.ExpiresAt) {
			t.Errorf("past its first TTL the lease is %+v (%v), want still held by fn, renewed", info, err)
		}
		return nil
	}, &leases.DoOpts{Metrics: m})
	if err != nil {
		t.Fatalf("Do: %v", err)
	}
	if m.Renewals.Load() < 2 || m.Lost.Load() != 0 {
		t.Fatalf("renewals %d, lost %d", m.Renewals.Load(), m.Lost.Load())
	}
	info, err := leases.Get(ctx, pool, "long-job")
	if err != nil || info.Held() || info.Holder != "" || info.Token != token {
		t.Fatalf("after Do the lease is %+v (%v), want released", info, err)
	}
}

func TestDoReturnsFnErrorAndReleases(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	boom := errors.New("boom")
	err := leases.Do(ctx, pool, "failing", time.Minute, func(context.Context, leases.Lease) error { return boom }, nil)
	if !errors.Is(err, boom) {
		t.Fatalf("Do returned %v, want fn's error", err)
	}
	if info, err := leases.Get(ctx, pool, "failing"); err != nil || info.Held() {
		t.Fatalf("a failed fn left the lease %+v (%v)", info, err)
	}
}

// An operator's forced expiry reaches the running function: its context is cancelled with
// ErrLost at the next renewal.
func TestDoCancelsFnWhenTheLeaseIsTakenAway(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	m := &leases.Metrics{}
	started := make(chan struct{})
	result := make(chan error, 1)
	go func() {
		result <- leases.Do(ctx, pool, "expired-by-op", 600*time.Millisecond, func(fnCtx context.Context, l leases.Lease) error {
			close(started)
			select {
			case <-fnCtx.Done():
				return nil // stops as asked; Do reports the loss
			case <-time.After(30 * time.Second):
				return errors.New("fn was never told the lease was lost")
			}
		}, &leases.DoOpts{Metrics: m})
	}()
	<-started
	if _, err := leases.Expire(ctx, pool, "expired-by-op", "test"); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-result:
		if !errors.Is(err, leases.ErrLost) || m.Lost.Load() != 1 {
			t.Fatalf("Do = %v (lost %d), want ErrLost", err, m.Lost.Load())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Do did not notice the forced expiry")
	}
}

// When renewals cannot get through (here: blocked on a row lock, as on a stalled network),
// fn's context is cancelled at the trust deadline, before the database would let anyone
// else take the lease.
func TestDoStopsTrustingAtTheTrustDeadline(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	var stillGranted bool
	// A safety margin of a second between the holder's trust deadline and the database's
	// expiry: room for the check below on a busy machine.
	err := leases.Do(ctx, pool, "stalled", 3*time.Second, func(fnCtx context.Context, l leases.Lease) error {
		blocker, err := pool.Begin(ctx)
		if err != nil {
			return err
		}
		defer blocker.Rollback(ctx)
		if _, err := blocker.Exec(ctx, `SELECT 1 FROM pgcoord_leases WHERE name = 'stalled' FOR UPDATE`); err != nil {
			return err
		}
		select {
		case <-fnCtx.Done():
		case <-time.After(10 * time.Second):
			return errors.New("fn kept running with no successful renewal")
		}
		if time.Now().Before(l.TrustUntil) {
			t.Errorf("cancelled %v before the trust deadline", time.Until(l.TrustUntil))
		}
		// No renewal got through, and the database still had the grant when the holder
		// stopped trusting it.
		var expires time.Time
		if err := blocker.QueryRow(ctx, `SELECT expires_at FROM pgcoord_leases WHERE name = 'stalled'`).Scan(&expires); err != nil {
			return err
		}
		stillGranted = expires.Equal(l.ExpiresAt) && time.Now().Before(expires)
		return nil
	}, &leases.DoOpts{AcquireOpts: leases.AcquireOpts{SafetyMargin: time.Second}, Metrics: &leases.Metrics{}})
	if !errors.Is(err, leases.ErrLost) || !strings.Contains(err.Error(), "trust deadline") {
		t.Fatalf("Do = %v, want ErrLost for the trust deadline", err)
	}
	if !stillGranted {
		t.Fatal("the holder stopped trusting its lease only after the database expired it (or a renewal got through)")
	}
}

// A renewal that succeeds with little time left is counted as a near miss.
func TestDoCountsNearMisses(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	m := &leases.Metrics{}
	// Long enough that an eighth of it (the time between letting the renewal through and
	// the trust deadline) is room on a busy machine.
	ttl := 5 * time.Second
	err := leases.Do(ctx, pool, "near-miss", ttl, func(fnCtx context.Context, l leases.Lease) error {
		tx, err := pool.Begin(ctx)
		if err != nil {
			return err
		}
		defer tx.Rollback(ctx)
		if _, err := tx.Exec(ctx, `SELECT 1 FROM pgcoord_leases WHERE name = 'near-miss' FOR UPDATE`); err != nil {
			return err
		}
		waitForBlockedRenewal(t, pool)
		// Let the renewal through when less than a quarter of the TTL is left.
		time.Sleep(time.Until(l.TrustUntil.Add(-ttl / 8)))
		if err := tx.Rollback(ctx); err != nil {
			return err
		}
		deadline := time.Now().Add(5 * time.Second)
		for m.Renewals.Load() == 0 && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		return context.Cause(fnCtx)
	}, &leases.DoOpts{Metrics: m})
	if err != nil {
		t.Fatalf("Do: %v", err)
	}
	if m.NearMisses.Load() < 1 {
		t.Fatalf("near misses = %d after a renewal with an eighth of the TTL left", m.NearMisses.Load())
	}
}

// waitForBlockedRenewal returns once a session of pool waits on a lock.
func waitForBlockedRenewal(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		var n int
		err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND query LIKE '%pgcoord_lease_renew%'`).Scan(&n)
		if err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatal("no renewal blocked within 10s")
}

// Whatever fn returns, Do reports a lost lease as ErrLost — for each way a lease is lost
// while fn runs — and never as the caller's own cancellation: errors.Is(err,
// context.Canceled) holds only when the caller cancelled. fn's own error is kept.
func TestDoReportsALostLeaseWhateverFnReturns(t *testing.T) {
	t.Parallel()
	boom := errors.New("boom")
	losses := []struct {
		name string
		ttl  time.Duration
		// lose makes the running lease l be lost; fn's context must be cancelled then. It
		// returns what to undo once it has been.
		lose func(t *testing.T, pool *pgxpool.Pool, clock *pgtest.Clock, l leases.Lease) (undo func())
	}{
		{"taken over", time.Second, func(t *testing.T, pool *pgxpool.Pool, clock *pgtest.Clock, l leases.Lease) func() {
			clock.Advance(time.Hour) // the holder paused past its TTL, as the database sees it
			if _, err := leases.TryAcquire(ctx, pool, l.Name, time.Hour, nil); err != nil {
				t.Errorf("takeover: %v", err)
			}
			return func() {}
		}},
		{"expired by an operator", time.Second, func(t *testing.T, pool *pgxpool.Pool, _ *pgtest.Clock, l leases.Lease) func() {
			if _, err := leases.Expire(ctx, pool, l.Name, "test"); err != nil {
				t.Errorf("Expire: %v", err)
			}
			return func() {}
		}},
		{"trust deadline passed", time.Second, func(t *testing.T, pool *pgxpool.Pool, _ *pgtest.Clock, l leases.Lease) func() {
			// Renewals cannot get through: they wait on this lock (as on a stalled network).
			blocker, err := pool.Begin(ctx)
			if err != nil {
				t.Error(err)
				return func() {}
			}
			if _, err := blocker.Exec(ctx, `SELECT 1 FROM pgcoord_leases WHERE name = $1 FOR UPDATE`, l.Name); err != nil {
				t.Error(err)
			}
			return func() { _ = blocker.Rollback(ctx) }
		}},
	}
	returns := []struct {
		name string
		fn   func(fnCtx context.Context) error
		// wantBoom: Do's error must wrap boom too.
		wantBoom bool
	}{
		{"nil", func(context.Context) error { return nil }, false},
		{"its context's error", func(fnCtx context.Context) error { return fnCtx.Err() }, false},
		{"a wrapped cancellation", func(fnCtx context.Context) error { return fmt.Errorf("export: %w", fnCtx.Err()) }, false},
		{"an error of its own", func(context.Context) error { return boom }, true},
	}
	for _, loss := range losses {
		for _, ret := range returns {
			t.Run(loss.name+"/fn returns "+ret.name, func(t *testing.T) {
				t.Parallel()
				pool := pgtest.Pool(t)
				clock := pgtest.NewClock(t, pool)
				m := &leases.Metrics{}
				err := leases.Do(ctx, pool, "job", loss.ttl, func(fnCtx context.Context, l leases.Lease) error {
					undo := loss.lose(t, pool, clock, l)
					defer undo()
					select {
					case <-fnCtx.Done():
					case <-time.After(pgtest.WaitLimit):
						return errors.New("fn's context was not cancelled after the lease was lost")
					}
					if cause := context.Cause(fnCtx); !errors.Is(cause, leases.ErrLost) {
						t.Errorf("fn's context ended with cause %v, want ErrLost", cause)
					}
					return ret.fn(fnCtx)
				}, &leases.DoOpts{Metrics: m, Logger: slog.New(slog.DiscardHandler)})
				if !errors.Is(err, leases.ErrLost) {
					t.Fatalf("Do = %v, want an error wrapping ErrLost", err)
				}
				if errors.Is(err, context.Canceled) {
					t.Errorf("Do = %v: errors.Is(err, context.Canceled) although the caller cancelled nothing", err)
				}
				if ret.wantBoom && !errors.Is(err, boom) {
					t.Errorf("Do = %v, want fn's own error kept too", err)
				}
				if m.Lost.Load() != 1 {
					t.Errorf("lost counted %d times, want 1", m.Lost.Load())
				}
			})
		}
	}
}

// The caller's own cancellation is not a lost lease: Do returns fn's context.Canceled,
// not ErrLost, and releases the lease.
func TestDoReportsTheCallersCancellationAsSuch(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	callerCtx, cancel := context.WithCancel(ctx)
	err := leases.Do(callerCtx, pool, "cancelled", time.Minute, func(fnCtx context.Context, l leases.Lease) error {
		cancel()
		<-fnCtx.Done()
		return fnCtx.Err()
	}, nil)
	if !errors.Is(err, context.Canceled) || errors.Is(err, leases.ErrLost) {
		t.Fatalf("Do = %v, want context.Canceled and not ErrLost", err)
	}
	if info, err := leases.Get(ctx, pool, "cancelled"); err != nil || info.Held() {
		t.Fatalf("after a cancelled Do the lease is %+v (%v), want released", info, err)
	}
}
