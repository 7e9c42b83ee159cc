package semaphore_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/pgcoord"
	"github.com/pgcoord/pgcoord/semaphore"
)

// A permit of Next reserves one unit of its key's demand; only Done, when its transaction
// commits, consumes it. Every other ending — Release, expiry, Drain, a Done rolled back —
// leaves the unit in the demand, and Next admits again for it.
func TestNextReservesAUnitThatOnlyDoneConsumes(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	clock := pgtest.NewClock(t, pool)
	clock.Freeze(clock.Now())
	const ttl = 30 * time.Second
	if err := semaphore.AddDemand(ctx, pool, "k", 2, &semaphore.AddDemandOpts{Limit: 5}); err != nil {
		t.Fatal(err)
	}
	next := func(what string) semaphore.Permit {
		t.Helper()
		p, err := semaphore.Next(ctx, pool, ttl, nil)
		if err != nil {
			t.Fatalf("Next %s: %v", what, err)
		}
		return p
	}
	noWork := func(what string) {
		t.Helper()
		if p, err := semaphore.Next(ctx, pool, ttl, nil); !errors.Is(err, semaphore.ErrNoWork) {
			t.Fatalf("Next %s: %+v, %v; want ErrNoWork", what, p, err)
		}
	}
	status := func(what string, demand int64, held int) {
		t.Helper()
		if s := mustGet(t, pool, "k"); s.Demand != demand || s.Held != held {
			t.Fatalf("%s: demand %d, held %d; want %d and %d", what, s.Demand, s.Held, demand, held)
		}
	}

	// Two units, two permits; the limit (5) has room, but every unit is in hand.
	p1, p2 := next("for the first unit"), next("for the second unit")
	noWork("with both units in hand")
	status("both units in hand", 2, 2)
	infos, err := semaphore.Permits(ctx, pool, "k")
	if err != nil || len(infos) != 2 || !infos[0].Reserved || !infos[1].Reserved {
		t.Fatalf("Permits: %+v, %v; want two reserved permits", infos, err)
	}

	// A release gives its unit back.
	if err := semaphore.Release(ctx, pool, p1); err != nil {
		t.Fatal(err)
	}
	status("after a release", 2, 1)
	p3 := next("after a release")
	noWork("with both units in hand again")

	// Done in a transaction that rolls back changes nothing.
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := semaphore.Done(ctx, tx, p2); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	status("after a Done rolled back", 2, 2)

	// Done that commits consumes the unit and frees the slot; Release and Done after it
	// find nothing and change nothing.
	if err := finish(t, pool, p2); err != nil {
		t.Fatal(err)
	}
	status("after Done", 1, 1)
	if err := semaphore.Release(ctx, pool, p2); !errors.Is(err, semaphore.ErrLost) {
		t.Fatalf("Release after Done: %v, want ErrLost", err)
	}
	if err := finish(t, pool, p2); !errors.Is(err, semaphore.ErrLost) {
		t.Fatalf("Done twice: %v, want ErrLost", err)
	}
	status("after a second Done", 1, 1)
	noWork("with the last unit in hand")

	// A permit that expires (its worker died) gives its unit back: Next admits again, with
	// a higher token, and the expired permit's Done is refused.
	clock.Advance(ttl)
	p4 := next("after the permit in hand expired")
	if p4.Token <= p3.Token {
		t.Fatalf("token after expiry %d, want more than %d", p4.Token, p3.Token)
	}
	if err := finish(t, pool, p3); !errors.Is(err, semaphore.ErrLost) {
		t.Fatalf("Done of an expired permit: %v, want ErrLost", err)
	}
	status("after the expired permit's Done", 1, 1)

	// Drain gives the unit back too.
	if _, err := semaphore.Drain(ctx, pool, "k"); err != nil {
		t.Fatal(err)
	}
	p5 := next("after a drain")
	if err := finish(t, pool, p5); err != nil {
		t.Fatal(err)
	}
	status("after the last Done", 0, 0)
	noWork("with no demand left")

	// Done of a permit that reserved nothing (TryAcquire) frees its slot and consumes no
	// unit.
	if err := semaphore.AddDemand(ctx, pool, "k", 1, nil); err != nil {
		t.Fatal(err)
	}
	plain := mustTry(t, pool, "k", 5, ttl, nil)
	if err := finish(t, pool, plain); err != nil {
		t.Fatal(err)
	}
	status("after Done of a TryAcquire permit", 1, 0)
}

// A holder that asks Next again while its permit is live gets that permit back (the
// recovery of a lost reply): no second permit, no second unit reserved.
func TestNextIsReentrantForOneHolder(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	if err := semaphore.AddDemand(ctx, pool, "k", 2, &semaphore.AddDemandOpts{Limit: 5}); err != nil {
		t.Fatal(err)
	}
	opts := &semaphore.NextOpts{Holder: "worker-1/job-1"}
	first, err := semaphore.Next(ctx, pool, time.Minute, opts)
	if err != nil {
		t.Fatal(err)
	}
	again, err := semaphore.Next(ctx, pool, time.Minute, opts)
	if err != nil || again.Token != first.Token || again.Key != first.Key {
		t.Fatalf("Next again as the same holder: %+v, %v; first %+v", again, err, first)
	}
	if s := mustGet(t, pool, "k"); s.Held != 1 || s.Admitted != 1 {
		t.Fatalf("status: %+v", s)
	}
	// The second unit is still there for another holder.
	if _, err := semaphore.Next(ctx, pool, time.Minute, nil); err != nil {
		t.Fatalf("Next for the second unit: %v", err)
	}
}

// Done refuses bad input before any SQL runs.
func TestDoneRefusesBadInput(t *testing.T) {
	t.Parallel()
	tx := noSQLTx{d: noSQL{t}}
	for _, p := range []semaphore.Permit{{Holder: "h", Token: 1}, {Key: "k", Holder: "h"}} {
		if err := semaphore.Done(ctx, tx, p); !errors.Is(err, pgcoord.ErrInvalidName) && !errors.Is(err, pgcoord.ErrInvalidArgument) {
			t.Errorf("Done(%+v): %v, want an invalid name or argument", p, err)
		}
	}
	if err := semaphore.Done(ctx, nil, semaphore.Permit{Key: "k", Holder: "h", Token: 1}); !errors.Is(err, pgcoord.ErrInvalidArgument) {
		t.Errorf("Done with a nil transaction: %v", err)
	}
}

// noSQLTx is a pgx.Tx that fails the test if any statement is sent to it; its other
// methods must not be called.
type noSQLTx struct {
	pgx.Tx
	d noSQL
}

func (x noSQLTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	return x.d.Exec(ctx, sql, args...)
}

func (x noSQLTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	return x.d.Query(ctx, sql, args...)
}

func (x noSQLTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return x.d.QueryRow(ctx, sql, args...)
}

// Waiters hold no connection of their pool while they wait: with a pool of two
// connections, eight Acquire calls wait in line for a full key while its holder renews
// its permit again and again, and every waiter gets a permit once it is released.
func TestWaitersLeaveThePoolToTheHolder(t *testing.T) {
	t.Parallel()
	const waiters = 8
	pool := pgtest.PoolMax(t, 2)
	held := mustTry(t, pool, "k", 1, time.Minute, nil)
	var calls []*pgtest.Call[semaphore.Permit]
	for i := range waiters {
		opts := &semaphore.AcquireOpts{Holder: fmt.Sprintf("waiter-%d", i), PollInterval: 100 * time.Millisecond}
		if pgtest.BehindPooler() {
			opts.NoListen = true
		}
		calls = append(calls, pgtest.Go(func() (semaphore.Permit, error) {
			actx, cancel := context.WithTimeout(ctx, 4*pgtest.WaitLimit)
			defer cancel()
			p, err := semaphore.Acquire(actx, pool, "k", 1, time.Minute, opts)
			if err == nil {
				err = semaphore.Release(ctx, pool, p)
			}
			return p, err
		}))
	}
	eventually(t, "every waiter in line", func() bool { return mustGet(t, pool, "k").Waiters == waiters })
	// The holder's renewals find a connection at once, however many wait.
	for i := range 20 {
		rctx, cancel := context.WithTimeout(ctx, pgtest.WaitLimit)
		r, err := semaphore.Renew(rctx, pool, held, time.Minute, nil)
		cancel()
		if err != nil {
			t.Fatalf("renewal %d with %d waiters on a pool of 2: %v", i, waiters, err)
		}
		held = r
	}
	if err := semaphore.Release(ctx, pool, held); err != nil {
		t.Fatal(err)
	}
	for i, c := range calls {
		if _, err := c.Wait(t); err != nil {
			t.Fatalf("waiter %d: %v", i, err)
		}
	}
}

// Done locks its key before its permit, in the order of admissions, so a Done and an
// admission of the same key never deadlock. The admission (TryAcquire, in a transaction
// that already holds the key's row) reclaims the permit Done wants, which expired
// meanwhile; Done waits for it, and then finds its permit gone: ErrLost, its transaction
// to roll back.
func TestDoneBesideAnAdmissionDoesNotDeadlock(t *testing.T) {
	t.Parallel()
	pool := pgtest.PoolMax(t, 4)
	clock := pgtest.NewClock(t, pool)
	t0 := clock.Now()
	clock.Freeze(t0)
	if err := semaphore.AddDemand(ctx, pool, "k", 1, &semaphore.AddDemandOpts{Limit: 5}); err != nil {
		t.Fatal(err)
	}
	p, err := semaphore.Next(ctx, pool, 10*time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	// The admitting transaction holds the key's row first.
	admitter, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer admitter.Rollback(ctx) //nolint:errcheck // after Commit, a no-op
	if err := semaphore.AddDemand(ctx, admitter, "k", 1, nil); err != nil {
		t.Fatal(err)
	}
	// Done, while p is live, waits for the key's row.
	clock.Freeze(t0.Add(5 * time.Second))
	doner, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer doner.Rollback(ctx) //nolint:errcheck // after Commit, a no-op
	donerPID, admitterPID := pgtest.BackendPID(t, doner), pgtest.BackendPID(t, admitter)
	call := pgtest.Go(func() (struct{}, error) { return struct{}{}, semaphore.Done(ctx, doner, p) })
	pgtest.WaitBlocked(t, pool, call, donerPID, admitterPID)
	// Once p has expired, the admission reclaims it.
	clock.Freeze(t0.Add(20 * time.Second))
	if _, err := semaphore.TryAcquire(ctx, admitter, "k", 5, time.Minute, nil); err != nil {
		t.Fatalf("the admission beside a waiting Done: %v", err)
	}
	if err := admitter.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := call.Wait(t); !errors.Is(err, semaphore.ErrLost) {
		t.Fatalf("Done of the permit the admission reclaimed: %v, want ErrLost", err)
	}
	if err := doner.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if s := mustGet(t, pool, "k"); s.Demand != 2 || s.Held != 1 {
		t.Fatalf("status: demand %d, held %d; want 2 (nothing done) and 1 (the admission's)", s.Demand, s.Held)
	}
}
