package semaphore_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/semaphore"
)

// waitFor starts an Acquire of key in a goroutine and returns once it is in line (the key
// has want live waiters). Behind a pooler, where notifications cannot arrive, the waiter
// polls (NoListen) every 50ms instead, and the tests still assert what waiters get.
func waitFor(t *testing.T, pool *pgxpool.Pool, key string, want int, opts *semaphore.AcquireOpts) *pgtest.Call[semaphore.Permit] {
	t.Helper()
	if pgtest.BehindPooler() {
		polling := *opts
		polling.NoListen, polling.PollInterval = true, 50*time.Millisecond
		opts = &polling
	}
	call := pgtest.Go(func() (semaphore.Permit, error) {
		actx, cancel := context.WithTimeout(ctx, 2*pgtest.WaitLimit)
		defer cancel()
		return semaphore.Acquire(actx, pool, key, 1, time.Hour, opts)
	})
	eventually(t, fmt.Sprintf("waiter %d of %q in line", want, key), func() bool {
		if call.Returned() {
			p, err := call.Wait(t)
			t.Fatalf("Acquire returned (%+v, %v) instead of waiting", p, err)
		}
		return mustGet(t, pool, key).Waiters == want
	})
	return call
}

// Waiters are served in the order they joined the line, each woken by the release before
// it (a poll interval of a minute leaves only the notification to explain it).
func TestWaitersAreServedInArrivalOrder(t *testing.T) {
	t.Parallel()
	pool := pgtest.PoolMax(t, 2) // waiters hold no connection: two are plenty
	held := mustTry(t, pool, "line", 1, time.Hour, nil)
	var line []*pgtest.Call[semaphore.Permit]
	for i := range 4 {
		line = append(line, waitFor(t, pool, "line", i+1, &semaphore.AcquireOpts{Holder: fmt.Sprintf("waiter-%d", i), PollInterval: time.Minute}))
	}
	for i, call := range line {
		if err := semaphore.Release(ctx, pool, held); err != nil {
			t.Fatal(err)
		}
		p, err := call.Wait(t)
		if err != nil || p.Holder != fmt.Sprintf("waiter-%d", i) {
			t.Fatalf("after release %d: %+v, %v", i, p, err)
		}
		for _, later := range line[i+1:] {
			if later.Returned() {
				t.Fatalf("a later waiter returned before waiter-%d", i)
			}
		}
		held = p
	}
	if s := mustGet(t, pool, "line"); s.Waiters != 0 || s.Held != 1 {
		t.Fatalf("status at the end: %+v", s)
	}
}

// A free slot belongs to the first waiter in line: TryAcquire and Next are refused while
// a live waiter is ahead, even if it has not noticed the slot yet. When it gives up, it
// leaves the line at once.
func TestNobodyJumpsALiveWaiter(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	a := mustTry(t, pool, "k", 2, time.Hour, nil)
	mustTry(t, pool, "k", 2, time.Hour, nil)
	if err := semaphore.AddDemand(ctx, pool, "k", 5, nil); err != nil {
		t.Fatal(err)
	}
	// A waiter that polls once a minute and does not listen: it will not notice the
	// release below.
	wctx, cancel := context.WithCancel(ctx)
	slow := pgtest.Go(func() (semaphore.Permit, error) {
		return semaphore.Acquire(wctx, pool, "k", 2, time.Hour, &semaphore.AcquireOpts{NoListen: true, PollInterval: time.Minute})
	})
	eventually(t, "the waiter in line", func() bool { return mustGet(t, pool, "k").Waiters == 1 })
	if err := semaphore.Release(ctx, pool, a); err != nil {
		t.Fatal(err)
	}
	if s := mustGet(t, pool, "k"); s.Held != 1 || s.Limit != 2 {
		t.Fatalf("a slot should be free: %+v", s)
	}
	if _, err := semaphore.TryAcquire(ctx, pool, "k", 2, time.Hour, nil); !errors.Is(err, semaphore.ErrFull) {
		t.Fatalf("TryAcquire with a waiter ahead: %v, want ErrFull", err)
	}
	if _, err := semaphore.Next(ctx, pool, time.Hour, nil); !errors.Is(err, semaphore.ErrNoWork) {
		t.Fatalf("Next with a waiter ahead: %v, want ErrNoWork", err)
	}
	cancel()
	if _, err := slow.Wait(t); !errors.Is(err, context.Canceled) {
		t.Fatalf("the cancelled waiter: %v", err)
	}
	if p, err := semaphore.TryAcquire(ctx, pool, "k", 2, time.Hour, nil); err != nil || p.Token <= a.Token {
		t.Fatalf("TryAcquire once the waiter left: %+v, %v", p, err)
	}
}

// A waiter that stopped asking (its process died) holds its place only until its
// registration lapses; then the line moves on without it.
func TestADeadWaiterDoesNotBlockTheLine(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	clock := pgtest.NewClock(t, pool)
	held := mustTry(t, pool, "k", 1, time.Hour, nil)
	// The ghost joins the line for a second through the SQL API, and never asks again.
	var wantedUntil time.Time
	if _, err := pool.Exec(ctx, `SELECT * FROM pgcoord_semaphore_acquire('k', 'ghost', 1, interval '1 hour', interval '1 second')`); err != nil {
		t.Fatal(err)
	}
	if err := pool.QueryRow(ctx, `SELECT wanted_until FROM pgcoord_semaphore_waiters WHERE key = 'k' AND holder = 'ghost'`).Scan(&wantedUntil); err != nil {
		t.Fatal(err)
	}
	live := waitFor(t, pool, "k", 2, &semaphore.AcquireOpts{PollInterval: 50 * time.Millisecond})
	if err := semaphore.Release(ctx, pool, held); err != nil {
		t.Fatal(err)
	}
	// While the ghost's registration is live, nobody gets the slot: judged a millisecond
	// before it lapses (the live waiter's polls too, while the clock stands there).
	clock.Freeze(wantedUntil.Add(-time.Millisecond))
	if _, err := semaphore.TryAcquire(ctx, pool, "k", 1, time.Hour, nil); !errors.Is(err, semaphore.ErrFull) {
		t.Fatalf("TryAcquire behind a live ghost: %v", err)
	}
	if live.Returned() {
		t.Fatal("the live waiter was admitted behind a live ghost")
	}
	clock.Run(0)
	// The live waiter gets it once the ghost's registration lapsed, at its next poll.
	p, err := live.Wait(t)
	if err != nil {
		t.Fatal(err)
	}
	if p.AcquiredAt.Before(wantedUntil) {
		t.Fatalf("admitted at %v, before the ghost's registration lapsed at %v", p.AcquiredAt, wantedUntil)
	}
}

// A refused Acquire also tries again when the place in line of a waiter ahead of it lapses:
// a dead waiter sends no notification, and no permit may be live to expire. With an hour's
// poll interval and notifications off, only that explains its admission.
func TestAWaiterBehindADeadOneTriesAgainWhenItsPlaceLapses(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	clock := pgtest.NewClock(t, pool)
	clock.Freeze(clock.Now()) // the ghost's place stays live until the test moves the clock
	held := mustTry(t, pool, "k", 1, time.Hour, nil)
	if _, err := pool.Exec(ctx, `SELECT * FROM pgcoord_semaphore_acquire('k', 'ghost', 1, interval '1 hour', interval '1 second')`); err != nil {
		t.Fatal(err)
	}
	if err := semaphore.Release(ctx, pool, held); err != nil {
		t.Fatal(err)
	}
	call := pgtest.Go(func() (semaphore.Permit, error) {
		actx, cancel := context.WithTimeout(ctx, 2*pgtest.WaitLimit)
		defer cancel()
		return semaphore.Acquire(actx, pool, "k", 1, time.Hour, &semaphore.AcquireOpts{NoListen: true, PollInterval: time.Hour})
	})
	eventually(t, "a waiter in line behind the ghost", func() bool {
		if call.Returned() {
			p, err := call.Wait(t)
			t.Fatalf("Acquire returned (%+v, %v) while the ghost was ahead of it", p, err)
		}
		return mustGet(t, pool, "k").Waiters == 2
	})
	clock.Advance(2 * time.Second) // the ghost's place lapses
	if p, err := call.Wait(t); err != nil || p.Holder == "ghost" {
		t.Fatalf("the waiter behind a lapsed ghost: %+v, %v", p, err)
	}
}

// Raising the limit wakes a waiter at once: with a poll interval of a minute and the
// holder's permit good for an hour, only SetLimit's notification explains a prompt return.
func TestRaisingTheLimitWakesWaiters(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	mustTry(t, pool, "k", 1, time.Hour, nil)
	call := waitFor(t, pool, "k", 1, &semaphore.AcquireOpts{PollInterval: time.Minute})
	raised := time.Now()
	if err := semaphore.SetLimit(ctx, pool, "k", 2, nil); err != nil {
		t.Fatal(err)
	}
	p, err := call.Wait(t)
	if err != nil {
		t.Fatalf("Acquire after raising the limit: %+v, %v", p, err)
	}
	if took := time.Since(raised); took > 10*time.Second {
		t.Fatalf("the waiter took %v to notice the raised limit", took)
	} else {
		t.Logf("woken %v after the limit was raised", took)
	}
}

// Lowering the limit revokes nothing: the permits held stay valid (renewable), the key is
// over its limit for a while, and new admissions wait until fewer than the new limit are
// live.
func TestLoweringTheLimitRevokesNothing(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	var held []semaphore.Permit
	for range 3 {
		held = append(held, mustTry(t, pool, "k", 3, time.Hour, nil))
	}
	if err := semaphore.SetLimit(ctx, pool, "k", 1, nil); err != nil {
		t.Fatal(err)
	}
	s := mustGet(t, pool, "k")
	if s.Held != 3 || s.Limit != 1 || !s.OverLimit() {
		t.Fatalf("after lowering: %+v", s)
	}
	for i, p := range held {
		r, err := semaphore.Renew(ctx, pool, p, time.Hour, nil)
		if err != nil {
			t.Fatalf("permit %d after lowering the limit: %v", i, err)
		}
		held[i] = r
	}
	waiter := waitFor(t, pool, "k", 1, &semaphore.AcquireOpts{PollInterval: time.Minute})
	for i := range 2 {
		if err := semaphore.Release(ctx, pool, held[i]); err != nil {
			t.Fatal(err)
		}
		if _, err := semaphore.TryAcquire(ctx, pool, "k", 1, time.Hour, nil); !errors.Is(err, semaphore.ErrFull) {
			t.Fatalf("TryAcquire with %d held and limit 1: %v", 2-i, err)
		}
		if waiter.Returned() {
			t.Fatalf("the waiter was admitted with %d held and limit 1", 2-i)
		}
	}
	if err := semaphore.Release(ctx, pool, held[2]); err != nil {
		t.Fatal(err)
	}
	p, err := waiter.Wait(t)
	if err != nil || p.Token <= held[2].Token {
		t.Fatalf("the waiter once nothing was held: %+v, %v", p, err)
	}
	if s := mustGet(t, pool, "k"); s.Held != 1 || s.OverLimit() {
		t.Fatalf("at the end: %+v", s)
	}
}

// Without LISTEN (behind a transaction pooler), Acquire still gets a released slot by
// polling; and it wakes at a dead holder's expiry, not at the next poll.
func TestAcquireWithoutListenAndAtExpiry(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	held := mustTry(t, pool, "polled", 1, time.Hour, nil)
	call := waitFor(t, pool, "polled", 1, &semaphore.AcquireOpts{NoListen: true, PollInterval: 50 * time.Millisecond})
	if err := semaphore.Release(ctx, pool, held); err != nil {
		t.Fatal(err)
	}
	if _, err := call.Wait(t); err != nil {
		t.Fatal(err)
	}

	dead := mustTry(t, pool, "expiring", 1, 300*time.Millisecond, nil)
	p, err := semaphore.Acquire(ctx, pool, "expiring", 1, time.Minute, &semaphore.AcquireOpts{PollInterval: time.Minute})
	if err != nil || p.Token <= dead.Token {
		t.Fatalf("Acquire behind a dead holder: %+v, %v", p, err)
	}
	if p.AcquiredAt.Before(dead.ExpiresAt) {
		t.Fatalf("admitted at %v, before the dead permit expired at %v", p.AcquiredAt, dead.ExpiresAt)
	}
	if late := p.AcquiredAt.Sub(dead.ExpiresAt); late > 10*time.Second {
		t.Fatalf("admitted %v after the dead permit expired: it did not wake at expiry", late)
	}
}

// A waiter's place in line lasts two poll intervals plus a second from each attempt, by
// the database clock: a slow round trip between two polls does not cost it its place.
func TestAPlaceInLineOutlastsTwoPolls(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	held := mustTry(t, pool, "slack", 1, time.Hour, nil)
	poll := 10 * time.Second
	if pgtest.BehindPooler() {
		poll = 50 * time.Millisecond // what waitFor polls at behind a pooler
	}
	call := waitFor(t, pool, "slack", 1, &semaphore.AcquireOpts{PollInterval: 10 * time.Second})
	var lasts time.Duration
	if err := pool.QueryRow(ctx, `SELECT extract(epoch FROM wanted_until - since) * 1e6 FROM pgcoord_semaphore_waiters WHERE key = 'slack'`).
		Scan(&lasts); err != nil {
		t.Fatal(err)
	}
	lasts *= time.Microsecond
	// Measured from the first attempt (since); a later attempt extends it, so the place
	// may last longer than that from since, never shorter.
	if want := 2*poll + time.Second; lasts < want || lasts > want+5*time.Second {
		t.Errorf("a place in line lasts %v from the first attempt, want %v (two polls of %v and a second)", lasts, want, poll)
	}
	if err := semaphore.Release(ctx, pool, held); err != nil {
		t.Fatal(err)
	}
	if _, err := call.Wait(t); err != nil {
		t.Fatal(err)
	}
}

// A waiting Acquire gives up with its context, leaves the line and holds no connection of
// the pool; no pool connection listens (the pool's notifier has its own).
func TestAcquireHonoursContextAndReturnsItsConnection(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	mustTry(t, pool, "busy", 1, time.Hour, nil)
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	_, err := semaphore.Acquire(short, pool, "busy", 1, time.Minute, nil)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Acquire past its deadline: %v", err)
	}
	// A connection whose query the deadline interrupted is closed by the pool in the
	// background (pgxpool destroys it asynchronously): it must come back, not stay held.
	eventually(t, "Acquire's connections back in the pool", func() bool { return pool.Stat().AcquiredConns() == 0 })
	var listening, lines int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_listening_channels()`).Scan(&listening); err != nil {
		t.Fatal(err)
	}
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pgcoord_semaphore_waiters`).Scan(&lines); err != nil {
		t.Fatal(err)
	}
	if listening != 0 || lines != 0 {
		t.Fatalf("after giving up: %d channels listened to, %d waiter rows", listening, lines)
	}
}

// A release notifies only while someone waits: NOTIFY serializes commits server-wide.
func TestReleaseNotifiesOnlyWhenSomeoneWaits(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	var ch string
	if err := conn.QueryRow(ctx, `SELECT pgcoord_channel('semaphores')`).Scan(&ch); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `LISTEN "`+ch+`"`); err != nil {
		t.Fatal(err)
	}
	defer conn.Exec(ctx, "UNLISTEN *") //nolint:errcheck // best effort
	p := mustTry(t, pool, "quiet", 1, time.Hour, nil)
	if err := semaphore.Release(ctx, pool, p); err != nil {
		t.Fatal(err)
	}
	nctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	if n, err := conn.Conn().WaitForNotification(nctx); err == nil {
		t.Fatalf("an uncontended release notified: %+v", n)
	}
}

// A waiter that gives up while a slot is free for it hands its turn on at once: the next
// waiter is woken (both poll once a minute, so only the notification explains it).
func TestAWaiterThatGivesUpWakesTheNext(t *testing.T) {
	t.Parallel()
	pool := pgtest.PoolMax(t, 6)
	held := mustTry(t, pool, "k", 1, time.Hour, nil)
	firstCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	first := pgtest.Go(func() (semaphore.Permit, error) {
		return semaphore.Acquire(firstCtx, pool, "k", 1, time.Hour, &semaphore.AcquireOpts{NoListen: true, PollInterval: time.Minute})
	})
	eventually(t, "the first waiter in line", func() bool { return mustGet(t, pool, "k").Waiters == 1 })
	second := waitFor(t, pool, "k", 2, &semaphore.AcquireOpts{PollInterval: time.Minute})
	// The release wakes the second waiter, which is refused (the first is ahead); the
	// first, not listening, sleeps on.
	if err := semaphore.Release(ctx, pool, held); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the second waiter refused after the release", func() bool { return mustGet(t, pool, "k").Refused >= 3 })
	cancel()
	if _, err := first.Wait(t); !errors.Is(err, context.Canceled) {
		t.Fatalf("the first waiter: %v", err)
	}
	p, err := second.Wait(t)
	if err != nil || p.Token <= held.Token {
		t.Fatalf("the second waiter after the first gave up: %+v, %v", p, err)
	}
}
