package leases_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/leases"
	"github.com/pgcoord/pgcoord/pgcoord"
)

var ctx = context.Background()

func mustAcquire(t *testing.T, db pgcoord.DBTX, name string, ttl time.Duration, opts *leases.AcquireOpts) leases.Lease {
	t.Helper()
	l, err := leases.TryAcquire(ctx, db, name, ttl, opts)
	if err != nil {
		t.Fatalf("TryAcquire(%q): %v", name, err)
	}
	return l
}

func TestExactlyOneWinnerAmongConcurrentAcquirers(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	var last int64
	for round := range 5 {
		name := fmt.Sprintf("contended-%d", round)
		var (
			wg      sync.WaitGroup
			mu      sync.Mutex
			winners []leases.Lease
			errs    []error
		)
		start := make(chan struct{})
		for range 16 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				l, err := leases.TryAcquire(ctx, pool, name, time.Minute, nil)
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err == nil:
					winners = append(winners, l)
				case !errors.Is(err, leases.ErrHeld):
					errs = append(errs, err)
				}
			}()
		}
		close(start)
		wg.Wait()
		if len(errs) > 0 || len(winners) != 1 {
			t.Fatalf("round %d: %d winners among 16 acquirers of a free lease (errors %v)", round, len(winners), errs)
		}
		// Tokens are schema-wide: each round's grant is above every earlier one.
		if winners[0].Token <= last {
			t.Fatalf("round %d: first grant of a new name has token %d, not above the previous grant's %d", round, winners[0].Token, last)
		}
		last = winners[0].Token
	}
}

// Takeover after expiry, with many contenders at once, also has exactly one winner, and
// its token is higher.
func TestExactlyOneWinnerOfAnExpiredLease(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	clock := pgtest.NewClock(t, pool)
	old := mustAcquire(t, pool, "job", time.Second, nil)
	clock.Advance(time.Hour) // the grant has expired by the database clock
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		winners []leases.Lease
	)
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l, err := leases.TryAcquire(ctx, pool, "job", time.Minute, nil)
			if err == nil {
				mu.Lock()
				winners = append(winners, l)
				mu.Unlock()
			} else if !errors.Is(err, leases.ErrHeld) {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if len(winners) != 1 || winners[0].Token <= old.Token {
		t.Fatalf("winners of the expired lease: %+v; want one, with a token above %d", winners, old.Token)
	}
}

// Tokens strictly increase over every way a grant can end: release, expiry, operator
// expiry.
func TestTokensStrictlyIncreaseAcrossTakeovers(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	clock := pgtest.NewClock(t, pool)
	var last int64
	grants := 0
	next := func() leases.Lease {
		t.Helper()
		l := mustAcquire(t, pool, "orders", time.Minute, nil)
		if l.Token <= last {
			t.Fatalf("token %d after %d", l.Token, last)
		}
		last = l.Token
		grants++
		return l
	}
	for range 3 {
		l := next()
		if err := leases.Release(ctx, pool, l, nil); err != nil {
			t.Fatal(err)
		}
		next()
		clock.Advance(2 * time.Minute) // that grant expires by the database clock
		l = next()
		if _, err := leases.Expire(ctx, pool, "orders", "test"); err != nil {
			t.Fatal(err)
		}
		info, err := leases.Get(ctx, pool, "orders")
		if err != nil || info.Held() || info.ExpiredBy != "test" || info.Token != l.Token {
			t.Fatalf("after operator expiry: %+v, %v", info, err)
		}
	}
	if grants != 9 {
		t.Fatalf("%d grants, want 9", grants)
	}
}

// Tokens come from one counter, not from the row: a lease row may be deleted (pgcoord gc
// does), and the name's next grant still gets a higher token. TRUNCATE, which would skip
// the retire trigger that hands the row's token to the fence registers, is refused.
func TestDeletedLeaseRowsDoNotRestartTokens(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	first := mustAcquire(t, pool, "kept", time.Minute, nil)
	if err := leases.Release(ctx, pool, first, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `TRUNCATE pgcoord_leases`); err == nil || !strings.Contains(err.Error(), "never truncated") {
		t.Errorf("TRUNCATE: err = %v, want refusal", err)
	}
	if tag, err := pool.Exec(ctx, `DELETE FROM pgcoord_leases WHERE name = 'kept'`); err != nil || tag.RowsAffected() != 1 {
		t.Fatalf("DELETE: %v, %v", tag, err)
	}
	if _, err := leases.Get(ctx, pool, "kept"); !errors.Is(err, leases.ErrNotFound) {
		t.Fatalf("Get of a deleted lease: %v, want ErrNotFound", err)
	}
	again := mustAcquire(t, pool, "kept", time.Minute, nil)
	if again.Token <= first.Token {
		t.Fatalf("the grant after the row was deleted has token %d, not above the first grant's %d", again.Token, first.Token)
	}
}

func TestReleaseAndRenewAreScopedToOneGrant(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	clock := pgtest.NewClock(t, pool)
	a := mustAcquire(t, pool, "shared", time.Second, nil)
	clock.Advance(time.Hour)                              // a's grant expires
	b := mustAcquire(t, pool, "shared", time.Minute, nil) // takes over the expired grant
	if b.Token <= a.Token {
		t.Fatalf("takeover token %d <= %d", b.Token, a.Token)
	}
	// A wakes up and releases or renews "its" lease: nothing changes.
	if err := leases.Release(ctx, pool, a, nil); !errors.Is(err, leases.ErrLost) {
		t.Fatalf("stale Release: %v, want ErrLost", err)
	}
	if _, err := leases.Renew(ctx, pool, a, time.Minute, nil); !errors.Is(err, leases.ErrLost) {
		t.Fatalf("stale Renew: %v, want ErrLost", err)
	}
	forged := b
	forged.Holder = "someone-else"
	if err := leases.Release(ctx, pool, forged, nil); !errors.Is(err, leases.ErrLost) {
		t.Fatalf("Release with the right token but another holder: %v, want ErrLost", err)
	}
	info, err := leases.Get(ctx, pool, "shared")
	if err != nil || !info.Held() || info.Holder != b.Holder || info.Token != b.Token || !info.ExpiresAt.Equal(b.ExpiresAt) {
		t.Fatalf("stale calls changed B's grant: %+v (B %+v), %v", info, b, err)
	}
	// B's own calls work, and Release then frees the lease.
	renewed, err := leases.Renew(ctx, pool, b, 2*time.Minute, nil)
	if err != nil || renewed.Token != b.Token || !renewed.ExpiresAt.After(b.ExpiresAt) {
		t.Fatalf("Renew: %+v, %v", renewed, err)
	}
	if err := leases.Release(ctx, pool, renewed, nil); err != nil {
		t.Fatal(err)
	}
	if err := leases.Release(ctx, pool, renewed, nil); !errors.Is(err, leases.ErrLost) {
		t.Fatalf("second Release: %v, want ErrLost", err)
	}
}

// Expiry is judged by the database clock: the schema's clock, moved by the test.
func TestExpiryByTheDatabaseClock(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	clock := pgtest.NewClock(t, pool)
	t0 := time.Now().Truncate(time.Millisecond)
	clock.Freeze(t0)
	l := mustAcquire(t, pool, "clock", time.Minute, nil)
	if d := l.ExpiresAt.Sub(l.AcquiredAt); d != time.Minute || !l.AcquiredAt.Equal(t0) {
		t.Fatalf("granted at %v for %v, want at %v for 1m", l.AcquiredAt, d, t0)
	}
	// A second before expiry it is held; at expiry it can be taken.
	clock.Freeze(t0.Add(59 * time.Second))
	if _, err := leases.TryAcquire(ctx, pool, "clock", time.Minute, nil); !errors.Is(err, leases.ErrHeld) {
		t.Fatalf("before expiry: %v, want ErrHeld", err)
	}
	clock.Freeze(t0.Add(time.Minute))
	if _, err := leases.Renew(ctx, pool, l, time.Minute, nil); !errors.Is(err, leases.ErrLost) {
		t.Fatalf("renew at expiry: %v, want ErrLost (an expired grant is not revived)", err)
	}
	next, err := leases.TryAcquire(ctx, pool, "clock", time.Minute, nil)
	if err != nil || next.Token <= l.Token || !next.AcquiredAt.Equal(t0.Add(time.Minute)) {
		t.Fatalf("at expiry: %+v, %v", next, err)
	}
}

// The trust deadline counts from the local send time, by the TTL the database reported
// left, minus the margin: never later than the database's expiry.
func TestTrustDeadline(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	before := time.Now()
	l := mustAcquire(t, pool, "trust", 10*time.Second, &leases.AcquireOpts{SafetyMargin: 2 * time.Second})
	after := time.Now()
	lo, hi := before.Add(8*time.Second), after.Add(8*time.Second)
	if l.TrustUntil.Before(lo) || l.TrustUntil.After(hi) || !l.Trusted() {
		t.Fatalf("TrustUntil %v outside [%v, %v]", l.TrustUntil, lo, hi)
	}
	// A grant recovered late (the same holder asking again, as after a lost reply) is
	// trusted only for what the database says is left of it, not for a fresh TTL.
	clock := pgtest.NewClock(t, pool)
	t0 := time.Now()
	clock.Freeze(t0)
	opts := &leases.AcquireOpts{Holder: "late", SafetyMargin: time.Second}
	granted := mustAcquire(t, pool, "trust-old", 10*time.Second, opts)
	clock.Freeze(t0.Add(9500 * time.Millisecond))
	recovered := mustAcquire(t, pool, "trust-old", 10*time.Second, opts)
	if recovered.Token != granted.Token || recovered.Trusted() {
		t.Fatalf("a recovered grant with 0.5s left and a 1s margin: %+v, trusted until %v", recovered, recovered.TrustUntil)
	}
}

// A holder with a stable identity that asks again gets its own grant back — the recovery
// path for a grant whose reply was lost.
func TestSameHolderGetsItsGrantBack(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	opts := &leases.AcquireOpts{Holder: "worker-7"}
	first := mustAcquire(t, pool, "reentrant", time.Minute, opts)
	again := mustAcquire(t, pool, "reentrant", time.Minute, opts)
	if again.Token != first.Token || again.Holder != "worker-7" || !again.ExpiresAt.Equal(first.ExpiresAt) {
		t.Fatalf("retry by the same holder: %+v, first %+v", again, first)
	}
	if _, err := leases.TryAcquire(ctx, pool, "reentrant", time.Minute, &leases.AcquireOpts{Holder: "worker-8"}); !errors.Is(err, leases.ErrHeld) {
		t.Fatalf("another holder: %v, want ErrHeld", err)
	}
}

func TestBadInputFailsBeforeSQL(t *testing.T) {
	t.Parallel()
	// Every call gets a nil or typed-nil handle or bad argument: an error must come
	// before any SQL could run (a nil handle would panic otherwise).
	var nilPool *pgxpool.Pool
	pool := pgtest.Pool(t)
	l := leases.Lease{Name: "x", Holder: "h", Token: 1}
	cases := map[string]error{
		"empty name":       errOf(leases.TryAcquire(ctx, pool, "", time.Second, nil)),
		"long name":        errOf(leases.TryAcquire(ctx, pool, strings.Repeat("n", 256), time.Second, nil)),
		"zero ttl":         errOf(leases.TryAcquire(ctx, pool, "x", 0, nil)),
		"negative ttl":     errOf(leases.TryAcquire(ctx, pool, "x", -time.Second, nil)),
		"huge ttl":         errOf(leases.TryAcquire(ctx, pool, "x", 48*time.Hour, nil)),
		"nil db":           errOf(leases.TryAcquire(ctx, nil, "x", time.Second, nil)),
		"typed nil pool":   errOf(leases.TryAcquire(ctx, nilPool, "x", time.Second, nil)),
		"margin >= ttl":    errOf(leases.TryAcquire(ctx, pool, "x", time.Second, &leases.AcquireOpts{SafetyMargin: time.Second})),
		"bad holder":       errOf(leases.TryAcquire(ctx, pool, "x", time.Second, &leases.AcquireOpts{Holder: strings.Repeat("h", 300)})),
		"sync commit off":  errOf(leases.TryAcquire(ctx, pool, "x", time.Second, &leases.AcquireOpts{SyncCommit: "off"})),
		"sync commit bad":  errOf(leases.Acquire(ctx, pool, "x", time.Second, &leases.AcquireOpts{SyncCommit: "ON"})),
		"acquire nil":      errOf(leases.Acquire(ctx, nil, "x", time.Second, nil)),
		"renew zero ttl":   errOf(leases.Renew(ctx, pool, l, 0, nil)),
		"release nil db":   leases.Release(ctx, nil, l, nil),
		"release no name":  leases.Release(ctx, pool, leases.Lease{}, nil),
		"release no token": leases.Release(ctx, pool, leases.Lease{Name: "x", Holder: "h"}, nil),
		"renew no holder":  errOf(leases.Renew(ctx, pool, leases.Lease{Name: "x", Token: 1}, time.Second, nil)),
		"do nil fn":        leases.Do(ctx, pool, "x", time.Second, nil, nil),
		"do bad renew":     leases.Do(ctx, pool, "x", time.Second, func(context.Context, leases.Lease) error { return nil }, &leases.DoOpts{RenewEvery: 2 * time.Second}),
		"list limit":       errOf(leases.List(ctx, pool, &leases.ListOpts{Limit: -1})),
	}
	for name, err := range cases {
		if !errors.Is(err, pgcoord.ErrInvalidArgument) && !errors.Is(err, pgcoord.ErrInvalidName) {
			t.Errorf("%s: err = %v, want an invalid-argument or invalid-name error", name, err)
		}
	}
	// None of them created a lease.
	if infos, err := leases.List(ctx, pool, nil); err != nil || len(infos) != 0 {
		t.Fatalf("bad calls left leases: %+v, %v", infos, err)
	}
}

func errOf[T any](_ T, err error) error { return err }

// A renewal that waited on a lock until after the grant expired must not revive it: the
// grant ended while the renewal waited.
func TestRenewBlockedPastExpiryDoesNotRevive(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	clock := pgtest.NewClock(t, pool)
	l := mustAcquire(t, pool, "blocked-renew", time.Minute, nil)
	blocker, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer blocker.Rollback(ctx)
	if _, err := blocker.Exec(ctx, `SELECT 1 FROM pgcoord_leases WHERE name = 'blocked-renew' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	waiter, holder := pgtest.BackendPID(t, conn), pgtest.BackendPID(t, blocker)
	renewal := pgtest.Go(func() (leases.Lease, error) { return leases.Renew(ctx, conn, l, time.Minute, nil) })
	pgtest.WaitBlocked(t, pool, renewal, waiter, holder)
	// While the renewal waits, the grant expires by the database clock; then it goes on.
	clock.Advance(2 * time.Minute)
	if err := blocker.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := renewal.Wait(t); !errors.Is(err, leases.ErrLost) {
		t.Fatalf("a renewal that waited past expiry: %v, want ErrLost", err)
	}
}

// A refused TryAcquire answers at once, even while the holder renews inside a transaction
// of its own that has not committed: refusals read, and reads never wait.
// A retry that races its holder's own first grant of a new name — its insert waits for
// the first attempt's to commit — gets that grant back, not ErrHeld: the holder does hold it.
func TestSameHolderRetryRacingItsFirstGrantGetsIt(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	opts := &leases.AcquireOpts{Holder: "worker-9"}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	first, err := leases.TryAcquire(ctx, tx, "racing-retry", time.Minute, opts)
	if err != nil {
		t.Fatal(err)
	}
	retry, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer retry.Release()
	waiter, blocker := pgtest.BackendPID(t, retry), pgtest.BackendPID(t, tx)
	call := pgtest.Go(func() (leases.Lease, error) { return leases.TryAcquire(ctx, retry, "racing-retry", time.Minute, opts) })
	pgtest.WaitBlocked(t, pool, call, waiter, blocker)
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	again, err := call.Wait(t)
	if err != nil || again.Token != first.Token || again.Holder != "worker-9" {
		t.Fatalf("the retry: %+v, %v; want the first attempt's grant (token %d)", again, err, first.Token)
	}
}

func TestTryAcquireDoesNotWaitForTheHoldersTransaction(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	l := mustAcquire(t, pool, "busy-holder", time.Minute, nil)
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := leases.Renew(ctx, tx, l, time.Minute, nil); err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := leases.TryAcquire(short, pool, "busy-holder", time.Minute, nil); !errors.Is(err, leases.ErrHeld) {
		t.Fatalf("TryAcquire while the holder's renewal is uncommitted: %v, want ErrHeld at once", err)
	}
}

// A grant's metadata is bounded: too much is refused before any SQL runs, clearly.
func TestAcquireRefusesOversizedMetadata(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	big := map[string]string{"note": strings.Repeat("x", leases.MaxMetadataBytes)}
	_, err := leases.TryAcquire(ctx, pool, "job", time.Minute, &leases.AcquireOpts{Metadata: big})
	if !errors.Is(err, pgcoord.ErrInvalidArgument) || !strings.Contains(err.Error(), "metadata") {
		t.Fatalf("TryAcquire with 8 KiB of metadata = %v, want ErrInvalidArgument naming the metadata", err)
	}
	if _, err := leases.Get(ctx, pool, "job"); !errors.Is(err, leases.ErrNotFound) {
		t.Fatalf("the refused grant left a lease: %v", err)
	}
}
