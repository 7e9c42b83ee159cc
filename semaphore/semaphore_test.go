package semaphore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/semaphore"
)

// Up to the limit, every TryAcquire is admitted with a token higher than every earlier one;
// the next one is refused with ErrFull and changes nothing but the refusal counter.
func TestTryAcquireAdmitsUpToTheLimit(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	var held []semaphore.Permit
	var last int64
	for i := range 3 {
		p := mustTry(t, pool, "tenant", 3, time.Minute, nil)
		if p.Token <= last || p.Key != "tenant" || p.Holder == "" || !p.Trusted() || !p.ExpiresAt.After(p.AcquiredAt) {
			t.Fatalf("permit %d after token %d: %+v", i, last, p)
		}
		held = append(held, p)
		last = p.Token
	}
	if held[0].Holder == held[1].Holder {
		t.Fatalf("two calls got the same default holder %q", held[0].Holder)
	}
	// The refusal is decided from reads: inside a transaction it assigns no transaction id
	// (it writes nothing, so it needs no commit) and it is not counted in the table.
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_, err = semaphore.TryAcquire(ctx, tx, "tenant", 3, time.Minute, nil)
	if !errors.Is(err, semaphore.ErrFull) {
		t.Fatalf("4th TryAcquire with limit 3: %v, want ErrFull", err)
	}
	var xid *int64
	if err := tx.QueryRow(ctx, `SELECT txid_current_if_assigned()`).Scan(&xid); err != nil {
		t.Fatal(err)
	}
	if xid != nil {
		t.Fatalf("a refused TryAcquire assigned transaction id %d: it wrote", *xid)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	s := mustGet(t, pool, "tenant")
	if s.Held != 3 || s.Limit != 3 || s.Token != last || s.Admitted != 3 || s.Refused != 0 || s.Expired != 0 || s.Waiters != 0 {
		t.Fatalf("status after 3 admissions and 1 refusal: %+v", s)
	}
	// A release frees one slot; the next admission has a higher token.
	if err := semaphore.Release(ctx, pool, held[1]); err != nil {
		t.Fatal(err)
	}
	if p := mustTry(t, pool, "tenant", 3, time.Minute, nil); p.Token <= last {
		t.Fatalf("token after release: %d, want more than %d", p.Token, last)
	}
}

// A holder that asks again while it holds a permit gets the same permit back (the
// recovery of a lost reply), not a second slot.
func TestTryAcquireIsReentrantForOneHolder(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	opts := &semaphore.AcquireOpts{Holder: "worker-1"}
	first := mustTry(t, pool, "k", 2, time.Minute, opts)
	again := mustTry(t, pool, "k", 2, time.Minute, opts)
	if again.Token != first.Token || !again.ExpiresAt.Equal(first.ExpiresAt) {
		t.Fatalf("second call as the same holder: %+v, first %+v", again, first)
	}
	if s := mustGet(t, pool, "k"); s.Held != 1 || s.Admitted != 1 {
		t.Fatalf("status: %+v", s)
	}
}

// The limit given to TryAcquire applies only when it creates the key.
func TestStoredLimitWins(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	if err := semaphore.SetLimit(ctx, pool, "k", 1, nil); err != nil {
		t.Fatal(err)
	}
	mustTry(t, pool, "k", 5, time.Minute, nil)
	if _, err := semaphore.TryAcquire(ctx, pool, "k", 5, time.Minute, nil); !errors.Is(err, semaphore.ErrFull) {
		t.Fatalf("second TryAcquire of a key with stored limit 1: %v", err)
	}
}

// A permit that was neither renewed nor released (a dead worker) stops counting at its
// expiry, by the database clock, and the next admission reclaims its slot.
func TestExpiredPermitIsReclaimedByTheNextAdmission(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	clock := pgtest.NewClock(t, pool)
	clock.Freeze(clock.Now())
	dead := mustTry(t, pool, "k", 1, 30*time.Second, nil)
	clock.Advance(30*time.Second - time.Millisecond)
	if _, err := semaphore.TryAcquire(ctx, pool, "k", 1, 30*time.Second, nil); !errors.Is(err, semaphore.ErrFull) {
		t.Fatalf("a millisecond before expiry: %v", err)
	}
	clock.Advance(time.Millisecond)
	if s := mustGet(t, pool, "k"); s.Held != 0 || s.Expired != 1 {
		t.Fatalf("status at expiry: %+v", s)
	}
	next := mustTry(t, pool, "k", 1, 30*time.Second, nil)
	if next.Token <= dead.Token {
		t.Fatalf("token after reclaim: %d, want more than %d", next.Token, dead.Token)
	}
	if s := mustGet(t, pool, "k"); s.Held != 1 || s.Expired != 0 {
		t.Fatalf("status after reclaim: %+v", s)
	}
	// The dead holder's renewal and release find nothing.
	if _, err := semaphore.Renew(ctx, pool, dead, time.Minute, nil); !errors.Is(err, semaphore.ErrLost) {
		t.Fatalf("Renew of a reclaimed permit: %v", err)
	}
	if err := semaphore.Release(ctx, pool, dead); !errors.Is(err, semaphore.ErrLost) {
		t.Fatalf("Release of a reclaimed permit: %v", err)
	}
}

// Renew extends the permit, durably or not; a renewal of an expired permit fails even if
// nobody was admitted since.
func TestRenew(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	clock := pgtest.NewClock(t, pool)
	p := mustTry(t, pool, "k", 2, 10*time.Second, nil)
	durable, err := semaphore.Renew(ctx, pool, p, time.Minute, nil)
	if err != nil {
		t.Fatal(err)
	}
	if durable.Token != p.Token || durable.ExpiresAt.Sub(p.ExpiresAt) < 40*time.Second || !durable.TrustUntil.After(p.TrustUntil) {
		t.Fatalf("durable renewal: %+v, was %+v", durable, p)
	}
	async, err := semaphore.Renew(ctx, pool, durable, 2*time.Minute, &semaphore.RenewOpts{AsyncCommit: true})
	if err != nil {
		t.Fatal(err)
	}
	if !async.ExpiresAt.After(durable.ExpiresAt) {
		t.Fatalf("async renewal: %+v", async)
	}
	// The renewal committed asynchronously only for its own transaction.
	var sc string
	if err := pool.QueryRow(ctx, "SHOW synchronous_commit").Scan(&sc); err != nil || sc != "on" {
		t.Fatalf("synchronous_commit after an async renewal: %q, %v", sc, err)
	}
	infos, err := semaphore.Permits(ctx, pool, "k")
	if err != nil || len(infos) != 1 || infos[0].RenewedAt.IsZero() || !infos[0].ExpiresAt.Equal(async.ExpiresAt) || !infos[0].Live() {
		t.Fatalf("Permits after renewals: %+v, %v", infos, err)
	}
	// Judged after its expiry, the permit cannot be renewed.
	clock.Freeze(async.ExpiresAt.Add(time.Millisecond))
	if _, err := semaphore.Renew(ctx, pool, async, time.Minute, nil); !errors.Is(err, semaphore.ErrLost) {
		t.Fatalf("Renew after expiry: %v", err)
	}
	clock.Run(0)
	// A permit with the wrong token is not this holder's.
	wrong := async
	wrong.Token++
	if _, err := semaphore.Renew(ctx, pool, wrong, time.Minute, nil); !errors.Is(err, semaphore.ErrLost) {
		t.Fatalf("Renew with a wrong token: %v", err)
	}
}

// Releasing twice: the second changes nothing and says so.
func TestReleaseTwice(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	a := mustTry(t, pool, "k", 2, time.Minute, nil)
	b := mustTry(t, pool, "k", 2, time.Minute, nil)
	if err := semaphore.Release(ctx, pool, a); err != nil {
		t.Fatal(err)
	}
	before := mustGet(t, pool, "k")
	if err := semaphore.Release(ctx, pool, a); !errors.Is(err, semaphore.ErrLost) {
		t.Fatalf("second Release: %v, want ErrLost", err)
	}
	after := mustGet(t, pool, "k")
	before.DBNow, after.DBNow = time.Time{}, time.Time{}
	if before != after || after.Held != 1 {
		t.Fatalf("the second release changed the key: %+v -> %+v", before, after)
	}
	infos, err := semaphore.Permits(ctx, pool, "k")
	if err != nil || len(infos) != 1 || infos[0].Token != b.Token {
		t.Fatalf("the other permit must stay: %+v, %v", infos, err)
	}
}

// Drain revokes every permit: holders' renewals fail, the returned permits are the ones
// revoked, and the next admission's token is higher than all of theirs.
func TestDrain(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	a := mustTry(t, pool, "k", 2, time.Minute, nil)
	b := mustTry(t, pool, "k", 2, time.Minute, nil)
	revoked, err := semaphore.Drain(ctx, pool, "k")
	if err != nil || len(revoked) != 2 {
		t.Fatalf("Drain: %+v, %v", revoked, err)
	}
	got := map[int64]string{revoked[0].Token: revoked[0].Holder, revoked[1].Token: revoked[1].Holder}
	if got[a.Token] != a.Holder || got[b.Token] != b.Holder {
		t.Fatalf("revoked %+v, held %+v and %+v", revoked, a, b)
	}
	for _, p := range []semaphore.Permit{a, b} {
		if _, err := semaphore.Renew(ctx, pool, p, time.Minute, nil); !errors.Is(err, semaphore.ErrLost) {
			t.Fatalf("Renew after drain: %v", err)
		}
		if err := semaphore.Release(ctx, pool, p); !errors.Is(err, semaphore.ErrLost) {
			t.Fatalf("Release after drain: %v", err)
		}
	}
	if s := mustGet(t, pool, "k"); s.Held != 0 || s.Expired != 0 {
		t.Fatalf("status after drain: %+v", s)
	}
	if c := mustTry(t, pool, "k", 2, time.Minute, nil); c.Token <= max(a.Token, b.Token) {
		t.Fatalf("token after drain: %d, want more than %d and %d", c.Token, a.Token, b.Token)
	}
	// Nothing to drain: an empty slice, not nil.
	again, err := semaphore.Drain(ctx, pool, "nobody")
	if err != nil || again == nil || len(again) != 0 {
		t.Fatalf("Drain of an unknown key: %#v, %v", again, err)
	}
}

// Get, List and Permits show what an operator needs: limit, weight, token, live and
// leaked permits, waiters, demand and counters, by the database clock.
func TestStatus(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	if _, err := semaphore.Get(ctx, pool, "absent"); !errors.Is(err, semaphore.ErrNotFound) {
		t.Fatalf("Get of an unknown key: %v", err)
	}
	if l, err := semaphore.List(ctx, pool, nil); err != nil || l == nil || len(l) != 0 {
		t.Fatalf("List of nothing: %#v, %v", l, err)
	}
	if err := semaphore.SetLimit(ctx, pool, "a", 2, &semaphore.SetLimitOpts{Weight: 5}); err != nil {
		t.Fatal(err)
	}
	if err := semaphore.AddDemand(ctx, pool, "a", 7, nil); err != nil {
		t.Fatal(err)
	}
	s := mustGet(t, pool, "a")
	if s.Key != "a" || s.Limit != 2 || s.Weight != 5 || s.Demand != 7 || s.Token != 0 || s.Held != 0 ||
		!s.OldestPermitAt.IsZero() || !s.OldestWaiterSince.IsZero() || s.DBNow.IsZero() || s.OverLimit() {
		t.Fatalf("fresh key: %+v", s)
	}
	// A live permit, and one that expired unreclaimed (granted an hour ago by the
	// database clock, after the live one, so that no admission reclaimed it).
	live := mustTry(t, pool, "a", 2, time.Minute, nil)
	clock := pgtest.NewClock(t, pool)
	clock.Run(-time.Hour)
	leaked := mustTry(t, pool, "a", 2, time.Second, nil)
	clock.Run(0)
	// A waiter in line for b.
	mustTry(t, pool, "b", 1, time.Minute, nil)
	wctx, giveUp := context.WithCancel(ctx)
	defer giveUp()
	waiting := pgtest.Go(func() (semaphore.Permit, error) {
		return semaphore.Acquire(wctx, pool, "b", 1, time.Minute, &semaphore.AcquireOpts{PollInterval: time.Minute})
	})
	eventually(t, "a waiter in line for b", func() bool { return mustGet(t, pool, "b").Waiters == 1 })
	list, err := semaphore.List(ctx, pool, nil)
	if err != nil || len(list) != 2 {
		t.Fatalf("List: %+v, %v", list, err)
	}
	a, b := list[0], list[1]
	if a.Key != "a" || a.Held != 1 || a.Expired != 1 || a.Token != leaked.Token || a.Admitted != 2 || !a.OldestPermitAt.Equal(live.AcquiredAt) {
		t.Fatalf("a: %+v", a)
	}
	if b.Key != "b" || b.Held != 1 || b.Waiters != 1 || b.OldestWaiterSince.IsZero() || b.OldestWaiterSince.After(b.DBNow) || b.Refused < 1 {
		t.Fatalf("b: %+v", b)
	}
	// Paging.
	page, err := semaphore.List(ctx, pool, &semaphore.ListOpts{After: "a", Limit: 1})
	if err != nil || len(page) != 1 || page[0].Key != "b" {
		t.Fatalf("second page: %+v, %v", page, err)
	}
	infos, err := semaphore.Permits(ctx, pool, "a")
	if err != nil || len(infos) != 2 {
		t.Fatalf("Permits: %+v, %v", infos, err)
	}
	if infos[0].Token != leaked.Token || infos[0].Live() || infos[1].Token != live.Token || !infos[1].Live() ||
		infos[1].Holder != live.Holder || !infos[1].RenewedAt.IsZero() || infos[1].DBNow.IsZero() {
		t.Fatalf("Permits: %+v", infos)
	}
	giveUp()
	if _, err := waiting.Wait(t); !errors.Is(err, context.Canceled) {
		t.Fatalf("the waiter: %v", err)
	}
	// A waiter that gave up left the line at once.
	if s := mustGet(t, pool, "b"); s.Waiters != 0 || !s.OldestWaiterSince.IsZero() {
		t.Fatalf("b after the waiter gave up: %+v", s)
	}
	if none, err := semaphore.Permits(ctx, pool, "absent"); err != nil || none == nil || len(none) != 0 {
		t.Fatalf("Permits of an unknown key: %#v, %v", none, err)
	}
}

// A permit that expired but was not reclaimed yet is still there: releasing it frees the
// slot and succeeds; renewing it does not.
func TestReleaseOfAnExpiredUnreclaimedPermit(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	clock := pgtest.NewClock(t, pool)
	clock.Run(-time.Hour)
	p := mustTry(t, pool, "k", 1, time.Second, nil) // granted an hour ago: long expired
	clock.Run(0)
	if _, err := semaphore.Renew(ctx, pool, p, time.Minute, nil); !errors.Is(err, semaphore.ErrLost) {
		t.Fatalf("Renew of an expired permit: %v", err)
	}
	if s := mustGet(t, pool, "k"); s.Held != 0 || s.Expired != 1 {
		t.Fatalf("status: %+v", s)
	}
	if err := semaphore.Release(ctx, pool, p); err != nil {
		t.Fatalf("Release of an expired, unreclaimed permit: %v", err)
	}
	if s := mustGet(t, pool, "k"); s.Expired != 0 {
		t.Fatalf("status after release: %+v", s)
	}
}
