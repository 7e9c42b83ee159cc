package semaphore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/semaphore"
)

// Up to the limit, every TryAcquire is admitted with the next token; the next one is
// refused with ErrFull and changes nothing but the refusal counter.
func TestTryAcquireAdmitsUpToTheLimit(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	var held []semaphore.Permit
	for i := range 3 {
		p := mustTry(t, pool, "tenant", 3, time.Minute, nil)
		if p.Token != int64(i+1) || p.Key != "tenant" || p.Holder == "" || !p.Trusted() || !p.ExpiresAt.After(p.AcquiredAt) {
			t.Fatalf("permit %d: %+v", i, p)
		}
		held = append(held, p)
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
	if s.Held != 3 || s.Limit != 3 || s.Token != 3 || s.Admitted != 3 || s.Refused != 0 || s.Expired != 0 || s.Waiters != 0 {
		t.Fatalf("status after 3 admissions and 1 refusal: %+v", s)
	}
	// A release frees one slot; the next admission has a higher token.
	if err := semaphore.Release(ctx, pool, held[1]); err != nil {
		t.Fatal(err)
	}
	if p := mustTry(t, pool, "tenant", 3, time.Minute, nil); p.Token != 4 {
		t.Fatalf("token after release: %d, want 4", p.Token)
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
	dead := mustTry(t, pool, "k", 1, 30*time.Second, nil)
	if _, err := semaphore.TryAcquire(ctx, pool, "k", 1, 30*time.Second, nil); !errors.Is(err, semaphore.ErrFull) {
		t.Fatalf("before expiry: %v", err)
	}
	later := dead.ExpiresAt.Add(time.Millisecond)
	if s, _ := semaphore.List(ctx, pool, &semaphore.ListOpts{Now: later}); len(s) != 1 || s[0].Held != 0 || s[0].Expired != 1 {
		t.Fatalf("status after expiry: %+v", s)
	}
	next := mustTry(t, pool, "k", 1, 30*time.Second, &semaphore.AcquireOpts{Now: later})
	if next.Token != dead.Token+1 {
		t.Fatalf("token after reclaim: %d", next.Token)
	}
	if s, _ := semaphore.List(ctx, pool, &semaphore.ListOpts{Now: later}); s[0].Held != 1 || s[0].Expired != 0 {
		t.Fatalf("status after reclaim: %+v", s[0])
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
	_, err = semaphore.Renew(ctx, pool, async, time.Minute, &semaphore.RenewOpts{Now: async.ExpiresAt.Add(time.Millisecond)})
	if !errors.Is(err, semaphore.ErrLost) {
		t.Fatalf("Renew after expiry: %v", err)
	}
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
	if c := mustTry(t, pool, "k", 2, time.Minute, nil); c.Token != 3 {
		t.Fatalf("token after drain: %d, want 3", c.Token)
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
	// A live permit, and one that expired unreclaimed (granted as if an hour ago, after
	// the live one, so that no admission reclaimed it).
	live := mustTry(t, pool, "a", 2, time.Minute, nil)
	leaked := mustTry(t, pool, "a", 2, time.Second, &semaphore.AcquireOpts{Now: time.Now().Add(-time.Hour)})
	// A waiter in line for b.
	mustTry(t, pool, "b", 1, time.Minute, nil)
	waiting := pgtest.Go(func() (semaphore.Permit, error) {
		wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		defer cancel()
		return semaphore.Acquire(wctx, pool, "b", 1, time.Minute, &semaphore.AcquireOpts{PollInterval: time.Minute})
	})
	eventually(t, "a waiter in line for b", func() bool { return mustGet(t, pool, "b").Waiters == 1 })
	list, err := semaphore.List(ctx, pool, nil)
	if err != nil || len(list) != 2 {
		t.Fatalf("List: %+v, %v", list, err)
	}
	a, b := list[0], list[1]
	if a.Key != "a" || a.Held != 1 || a.Expired != 1 || a.Token != 2 || a.Admitted != 2 || !a.OldestPermitAt.Equal(live.AcquiredAt) {
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
	if _, err := waiting.Wait(t); !errors.Is(err, context.DeadlineExceeded) {
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
	p := mustTry(t, pool, "k", 1, time.Second, &semaphore.AcquireOpts{Now: time.Now().Add(-time.Hour)})
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
