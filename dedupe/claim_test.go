package dedupe_test

import (
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/dedupe"
	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/pgcoord"
)

func TestClaimFirstTrueThenFalse(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pgtest.Pool(t)

	claimCommit := func(scope, key string) bool {
		t.Helper()
		var first bool
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			var err error
			first, err = dedupe.Claim(ctx, tx, scope, key, nil)
			return err
		})
		if err != nil {
			t.Fatalf("claim %s/%s: %v", scope, key, err)
		}
		return first
	}
	if !claimCommit("webhook", "evt_1") {
		t.Fatal("the first claim returned false")
	}
	for range 3 {
		if claimCommit("webhook", "evt_1") {
			t.Fatal("a later claim of the same key returned true")
		}
	}
	// Another key, and the same key in another scope, are claims of their own.
	if !claimCommit("webhook", "evt_2") || !claimCommit("email", "evt_1") {
		t.Fatal("a claim of a new (scope, key) returned false")
	}
	// Within one transaction too: the second claim sees the first.
	tx := begin(t, pool, pgx.TxOptions{})
	if first, err := dedupe.Claim(ctx, tx, "webhook", "evt_3", nil); err != nil || !first {
		t.Fatalf("claim in tx = %v, %v", first, err)
	}
	if again, err := dedupe.Claim(ctx, tx, "webhook", "evt_3", nil); err != nil || again {
		t.Fatalf("second claim in the same tx = %v, %v; want false", again, err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if n := queryInt64(t, pool, `SELECT count(*) FROM pgcoord_dedupe`); n != 4 {
		t.Fatalf("%d claims stored, want 4", n)
	}
	// Kept forever by default.
	if n := queryInt64(t, pool, `SELECT count(*) FROM pgcoord_dedupe WHERE expires_at IS NOT NULL`); n != 0 {
		t.Fatalf("%d claims without Retention have an expiry", n)
	}
	// The longest key is accepted.
	long := strings.Repeat("k", dedupe.MaxKeyLen)
	if !claimCommit(strings.Repeat("s", pgcoord.MaxNameLen), long) {
		t.Fatal("a claim with the longest scope and key returned false")
	}
}

// A rolled-back claim leaves nothing: the retry claims again.
func TestClaimRollbackClaimsAgain(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pgtest.Pool(t)

	tx := begin(t, pool, pgx.TxOptions{})
	if first, err := dedupe.Claim(ctx, tx, "jobs", "order:42", nil); err != nil || !first {
		t.Fatalf("claim = %v, %v", first, err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if n := queryInt64(t, pool, `SELECT count(*) FROM pgcoord_dedupe`); n != 0 {
		t.Fatalf("a rolled-back claim left %d rows", n)
	}
	tx = begin(t, pool, pgx.TxOptions{})
	if first, err := dedupe.Claim(ctx, tx, "jobs", "order:42", nil); err != nil || !first {
		t.Fatalf("the retry's claim = %v, %v; want true", first, err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
}

// A claimer of a key claimed by an open transaction waits for it, then gets false if it
// committed and true if it rolled back.
func TestClaimWaitsForTheFirstTransaction(t *testing.T) {
	t.Parallel()
	for _, commit := range []bool{true, false} {
		name := map[bool]string{true: "commit", false: "rollback"}[commit]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			pool := pgtest.PoolMax(t, 4)
			first := begin(t, pool, pgx.TxOptions{})
			if ok, err := dedupe.Claim(ctx, first, "s", "k", nil); err != nil || !ok {
				t.Fatalf("first claim = %v, %v", ok, err)
			}
			second := begin(t, pool, pgx.TxOptions{})
			waiter, blocker := pgtest.BackendPID(t, second), pgtest.BackendPID(t, first)
			p := pgtest.Go(func() (bool, error) { return dedupe.Claim(ctx, second, "s", "k", nil) })
			pgtest.WaitBlocked(t, pool, p, waiter, blocker)

			var err error
			if commit {
				err = first.Commit(ctx)
			} else {
				err = first.Rollback(ctx)
			}
			if err != nil {
				t.Fatal(err)
			}
			got, err := p.Wait(t)
			if err != nil || got != !commit {
				t.Fatalf("after the first transaction's %s, the waiting claim = %v, %v; want %v", name, got, err, !commit)
			}
			if err := second.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			if n := queryInt64(t, pool, `SELECT count(*) FROM pgcoord_dedupe`); n != 1 {
				t.Fatalf("%d claims stored, want 1", n)
			}
		})
	}
}

// Many transactions race for one key; some roll back. Exactly one of those that commit
// claimed it.
func TestClaimConcurrentExactlyOneCommittedWinner(t *testing.T) {
	t.Parallel()
	const n = 12
	ctx := t.Context()
	pool := pgtest.PoolMax(t, n+1)
	for round := range 5 {
		key := "race-" + string(rune('a'+round))
		var (
			wg        sync.WaitGroup
			mu        sync.Mutex
			winners   int // true claims in committed transactions
			committed int
			errs      []error
		)
		start := make(chan struct{})
		for i := range n {
			tx := begin(t, pool, pgx.TxOptions{})
			wg.Go(func() {
				<-start
				first, err := dedupe.Claim(ctx, tx, "race", key, nil)
				if err == nil {
					if i%3 == 0 { // a third of the claimers fail after claiming
						err = tx.Rollback(ctx)
						first = false
					} else if err = tx.Commit(ctx); err == nil {
						mu.Lock()
						committed++
						mu.Unlock()
					}
				}
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					errs = append(errs, err)
				}
				if first {
					winners++
				}
			})
		}
		close(start)
		wg.Wait()
		if len(errs) > 0 {
			t.Fatalf("round %d: errors: %v", round, errs)
		}
		if committed == 0 || winners != 1 {
			t.Fatalf("round %d: %d of %d committed claimers got true, want exactly 1", round, winners, committed)
		}
		if rows := queryInt64(t, pool, `SELECT count(*) FROM pgcoord_dedupe WHERE key = $1`, key); rows != 1 {
			t.Fatalf("round %d: %d rows for the key, want 1", round, rows)
		}
	}
}

// Under REPEATABLE READ, a claim racing one that committed after the snapshot fails with
// 40001; the retry gets false, and the claim exists once.
func TestClaimRepeatableReadSerializationFailure(t *testing.T) {
	t.Parallel()
	for _, blocked := range []bool{false, true} {
		name := map[bool]string{false: "committed-before", true: "committed-while-waiting"}[blocked]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			pool := pgtest.PoolMax(t, 4)
			rr := begin(t, pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
			exec(t, rr, `SELECT 1`) // takes the snapshot
			other := begin(t, pool, pgx.TxOptions{})
			if ok, err := dedupe.Claim(ctx, other, "pay", "order:7", nil); err != nil || !ok {
				t.Fatalf("other claim = %v, %v", ok, err)
			}
			var p *pgtest.Call[bool]
			if blocked {
				waiter, blocker := pgtest.BackendPID(t, rr), pgtest.BackendPID(t, other)
				p = pgtest.Go(func() (bool, error) { return dedupe.Claim(ctx, rr, "pay", "order:7", nil) })
				pgtest.WaitBlocked(t, pool, p, waiter, blocker)
			}
			if err := other.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			if !blocked {
				p = pgtest.Go(func() (bool, error) { return dedupe.Claim(ctx, rr, "pay", "order:7", nil) })
			}
			got, err := p.Wait(t)
			if sqlState(err) != "40001" || got {
				t.Fatalf("REPEATABLE READ claim racing a committed one = %v, %v; want an error with SQLSTATE 40001", got, err)
			}
			if !strings.HasPrefix(err.Error(), "dedupe: claim") {
				t.Errorf("error %q does not say it comes from dedupe", err)
			}
			_ = rr.Rollback(ctx)

			// The caller's retry, as the isolation level demands, finds the claim.
			retry := begin(t, pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
			if ok, err := dedupe.Claim(ctx, retry, "pay", "order:7", nil); err != nil || ok {
				t.Fatalf("retried claim = %v, %v; want false", ok, err)
			}
			if err := retry.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			if n := queryInt64(t, pool, `SELECT count(*) FROM pgcoord_dedupe`); n != 1 {
				t.Fatalf("%d claims, want the effect once", n)
			}
		})
	}
}

// Retention sets the expiry from the database clock of the claiming transaction; an
// expired claim still counts until GC removes it.
func TestClaimRetention(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pgtest.Pool(t)
	tx := begin(t, pool, pgx.TxOptions{})
	if ok, err := dedupe.Claim(ctx, tx, "s", "db-clock", &dedupe.ClaimOpts{Retention: time.Hour}); err != nil || !ok {
		t.Fatalf("claim = %v, %v", ok, err)
	}
	var txNow time.Time
	if err := tx.QueryRow(ctx, `SELECT now()`).Scan(&txNow); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	var claimed, expires time.Time
	if err := pool.QueryRow(ctx, `SELECT claimed_at, expires_at FROM pgcoord_dedupe WHERE key = 'db-clock'`).Scan(&claimed, &expires); err != nil {
		t.Fatal(err)
	}
	if !claimed.Equal(txNow) || !expires.Equal(txNow.Add(time.Hour)) {
		t.Errorf("db-clock claim: claimed_at %v, expires_at %v; want the transaction's now() %v and an hour later", claimed, expires, txNow)
	}

	// With the database clock at past, a claim dates from past.
	clock := pgtest.NewClock(t, pool)
	past := time.Date(2020, 1, 2, 3, 4, 5, 0, time.UTC)
	clock.Freeze(past)
	claimIn(t, pool, "s", "dated", &dedupe.ClaimOpts{Retention: 90 * time.Minute}, true)
	if err := pool.QueryRow(ctx, `SELECT claimed_at, expires_at FROM pgcoord_dedupe WHERE key = 'dated'`).Scan(&claimed, &expires); err != nil {
		t.Fatal(err)
	}
	if !claimed.Equal(past) || !expires.Equal(past.Add(90*time.Minute)) {
		t.Errorf("dated claim: claimed_at %v, expires_at %v; want %v and 90m later", claimed, expires, past)
	}

	// Two hours on, the claim has expired; not yet collected, it still counts.
	clock.Advance(2 * time.Hour)
	claimIn(t, pool, "s", "dated", nil, false)
	if n, err := dedupe.GC(ctx, pool, nil); err != nil || n != 1 {
		t.Fatalf("GC = %d, %v; want the expired claim collected", n, err)
	}
	claimIn(t, pool, "s", "dated", nil, true)
}

// claimIn claims (scope, key) in a transaction of its own and fails t unless Claim
// returned want.
func claimIn(t *testing.T, pool *pgxpool.Pool, scope, key string, opts *dedupe.ClaimOpts, want bool) {
	t.Helper()
	tx := begin(t, pool, pgx.TxOptions{})
	if ok, err := dedupe.Claim(t.Context(), tx, scope, key, opts); err != nil || ok != want {
		t.Fatalf("claim of %s/%s = %v, %v; want %v", scope, key, ok, err, want)
	}
	if err := tx.Commit(t.Context()); err != nil {
		t.Fatal(err)
	}
}

func TestClaimRejectsBadInputBeforeSQL(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	tx := noSQL{} // any SQL would panic
	cases := []struct {
		what       string
		scope, key string
		opts       *dedupe.ClaimOpts
		want       error
	}{
		{"empty scope", "", "k", nil, pgcoord.ErrInvalidName},
		{"empty key", "s", "", nil, pgcoord.ErrInvalidName},
		{"long scope", strings.Repeat("s", pgcoord.MaxNameLen+1), "k", nil, pgcoord.ErrInvalidName},
		{"long key", "s", strings.Repeat("k", dedupe.MaxKeyLen+1), nil, pgcoord.ErrInvalidName},
		{"NUL in key", "s", "a\x00b", nil, pgcoord.ErrInvalidName},
		{"bad UTF-8 key", "s", "a\xffb", nil, pgcoord.ErrInvalidName},
		{"negative retention", "s", "k", &dedupe.ClaimOpts{Retention: -time.Second}, pgcoord.ErrInvalidArgument},
		{"huge retention", "s", "k", &dedupe.ClaimOpts{Retention: dedupe.MaxRetention + 1}, pgcoord.ErrInvalidArgument},
		// Below the database's precision: it would be stored as 0, a claim expired at once.
		{"sub-microsecond retention", "s", "k", &dedupe.ClaimOpts{Retention: 999 * time.Nanosecond}, pgcoord.ErrInvalidArgument},
	}
	for _, c := range cases {
		ok, err := dedupe.Claim(ctx, tx, c.scope, c.key, c.opts)
		if ok || !errors.Is(err, c.want) {
			t.Errorf("%s: Claim = %v, %v; want an error wrapping %v", c.what, ok, err, c.want)
		}
	}
	for _, nilTx := range []pgx.Tx{nil, (*nilTxType)(nil)} {
		if ok, err := dedupe.Claim(ctx, nilTx, "s", "k", nil); ok || !errors.Is(err, pgcoord.ErrInvalidArgument) {
			t.Errorf("Claim with a nil tx (%T) = %v, %v; want ErrInvalidArgument", nilTx, ok, err)
		}
	}
}

// nilTxType is a pointer type implementing pgx.Tx, for a typed nil.
type nilTxType struct{ pgx.Tx }
