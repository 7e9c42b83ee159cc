package fenced_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/fenced"
	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/leases"
	"github.com/pgcoord/pgcoord/pgcoord"
)

// checkLease runs fenced.CheckLease in a transaction of its own.
func checkLease(ctx context.Context, pool *pgxpool.Pool, l leases.Lease) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return fenced.CheckLease(ctx, tx, l) })
}

func TestCheckLeaseCurrentGrant(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pgtest.Pool(t)
	l, err := leases.TryAcquire(ctx, pool, "job", time.Minute, nil)
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := checkLease(ctx, pool, l); err != nil {
			t.Fatalf("CheckLease of the current grant: %v", err)
		}
	}
	// The grant is name + holder + token: a different holder or token is not current.
	other := l
	other.Holder = "someone else"
	if err := checkLease(ctx, pool, other); !errors.Is(err, leases.ErrLost) {
		t.Errorf("CheckLease with another holder = %v, want ErrLost", err)
	}
	other = l
	other.Token++
	if err := checkLease(ctx, pool, other); !errors.Is(err, leases.ErrLost) {
		t.Errorf("CheckLease with another token = %v, want ErrLost", err)
	}
	other = l
	other.Name = "never granted"
	if err := checkLease(ctx, pool, other); !errors.Is(err, leases.ErrLost) {
		t.Errorf("CheckLease of a lease never granted = %v, want ErrLost", err)
	}
}

func TestCheckLeaseLost(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		// lose makes the grant l of pool stop being current; it returns the grant
		// that is current afterwards, if any.
		lose func(t *testing.T, pool *pgxpool.Pool, l leases.Lease) (leases.Lease, bool)
		// past moves the database clock an hour on after the lease was granted.
		past bool
	}{
		{name: "released", lose: func(t *testing.T, pool *pgxpool.Pool, l leases.Lease) (leases.Lease, bool) {
			if err := leases.Release(t.Context(), pool, l, nil); err != nil {
				t.Fatal(err)
			}
			return leases.Lease{}, false
		}},
		{name: "expired by an operator", lose: func(t *testing.T, pool *pgxpool.Pool, l leases.Lease) (leases.Lease, bool) {
			if _, err := leases.Expire(t.Context(), pool, l.Name, "test"); err != nil {
				t.Fatal(err)
			}
			return leases.Lease{}, false
		}},
		{name: "expired by the database clock", past: true, lose: func(*testing.T, *pgxpool.Pool, leases.Lease) (leases.Lease, bool) {
			return leases.Lease{}, false // nothing to do: the grant ran out long ago
		}},
		{name: "taken over after expiry", past: true, lose: func(t *testing.T, pool *pgxpool.Pool, l leases.Lease) (leases.Lease, bool) {
			next, err := leases.TryAcquire(t.Context(), pool, l.Name, time.Minute, nil)
			if err != nil {
				t.Fatalf("takeover of an expired lease: %v", err)
			}
			return next, true
		}},
		{name: "taken over after operator expiry", lose: func(t *testing.T, pool *pgxpool.Pool, l leases.Lease) (leases.Lease, bool) {
			if _, err := leases.Expire(t.Context(), pool, l.Name, "test"); err != nil {
				t.Fatal(err)
			}
			next, err := leases.TryAcquire(t.Context(), pool, l.Name, time.Minute, nil)
			if err != nil {
				t.Fatalf("acquire after operator expiry: %v", err)
			}
			return next, true
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			pool := pgtest.Pool(t)
			clock := pgtest.NewClock(t, pool)
			l, err := leases.TryAcquire(ctx, pool, "job", time.Minute, nil)
			if err != nil {
				t.Fatal(err)
			}
			if err := checkLease(ctx, pool, l); err != nil {
				t.Fatalf("CheckLease before losing the lease: %v", err)
			}
			if c.past {
				// An hour later by the database clock, which CheckLease judges by, the
				// minute's grant has long expired.
				clock.Advance(time.Hour)
			}
			next, taken := c.lose(t, pool, l)
			if err := checkLease(ctx, pool, l); !errors.Is(err, leases.ErrLost) {
				t.Fatalf("CheckLease after the lease was %s = %v, want ErrLost", c.name, err)
			}
			if taken {
				if next.Token <= l.Token {
					t.Fatalf("new grant has token %d, not above the lost grant's %d", next.Token, l.Token)
				}
				if err := checkLease(ctx, pool, next); err != nil {
					t.Errorf("CheckLease of the new grant: %v", err)
				}
			}
		})
	}
}

// TestCheckLeaseBlocksTakeover checks a current grant in an open transaction, then has
// another session take the lease over, expire it or release it: that session must wait
// for the checking transaction (a lock wait, seen in pg_stat_activity), and proceed when
// it ends.
func TestCheckLeaseBlocksTakeover(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		// other runs on its own connection while the checking transaction is open.
		other func(ctx context.Context, conn *pgxpool.Conn, l leases.Lease) (string, error)
		// expire moves the database clock past l's expiry before other runs.
		expire bool
		// commit ends the checking transaction with a commit, else a rollback.
		commit bool
	}{
		{name: "takeover after expiry", commit: true, expire: true,
			other: func(ctx context.Context, conn *pgxpool.Conn, l leases.Lease) (string, error) {
				// l has expired by the database clock, as if its holder had paused.
				next, err := leases.TryAcquire(ctx, conn, l.Name, time.Minute, &leases.AcquireOpts{Holder: "thief"})
				return next.Holder, err
			}},
		{name: "operator expiry", commit: false,
			other: func(ctx context.Context, conn *pgxpool.Conn, l leases.Lease) (string, error) {
				info, err := leases.Expire(ctx, conn, l.Name, "operator")
				return info.Holder, err
			}},
		{name: "release", commit: true,
			other: func(ctx context.Context, conn *pgxpool.Conn, l leases.Lease) (string, error) {
				return l.Holder, leases.Release(ctx, conn, l, nil)
			}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			pool := pgtest.Pool(t)
			clock := pgtest.NewClock(t, pool)
			exec(t, pool, `CREATE TABLE reports (id int PRIMARY KEY, written_by bigint NOT NULL)`)
			l, err := leases.TryAcquire(ctx, pool, "report", time.Minute, &leases.AcquireOpts{Holder: "writer"})
			if err != nil {
				t.Fatal(err)
			}

			tx, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = tx.Rollback(ctx) }()
			if err := fenced.CheckLease(ctx, tx, l); err != nil {
				t.Fatalf("CheckLease: %v", err)
			}
			exec(t, tx, `INSERT INTO reports VALUES (1, $1)`, l.Token)

			conn, err := pool.Acquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Release()
			if c.expire {
				clock.Advance(2 * time.Minute)
			}
			waiter, blocker := pgtest.BackendPID(t, conn), pgtest.BackendPID(t, tx)
			p := pgtest.Go(func() (string, error) { return c.other(ctx, conn, l) })
			pgtest.WaitBlocked(t, pool, p, waiter, blocker)

			if c.commit {
				err = tx.Commit(ctx)
			} else {
				err = tx.Rollback(ctx)
			}
			if err != nil {
				t.Fatal(err)
			}
			holder, err := p.Wait(t)
			if err != nil {
				t.Fatalf("%s after the checking transaction ended: %v", c.name, err)
			}
			if c.name == "takeover after expiry" && holder != "thief" {
				t.Errorf("takeover granted to %q, want thief", holder)
			}
			if c.name == "operator expiry" && holder != "writer" {
				t.Errorf("Expire reported holder %q, want the expired grant's writer", holder)
			}
			// The lease moved on: the old grant no longer passes.
			if err := checkLease(ctx, pool, l); !errors.Is(err, leases.ErrLost) {
				t.Errorf("CheckLease after the %s = %v, want ErrLost", c.name, err)
			}
			wantRows := int64(0)
			if c.commit {
				wantRows = 1
			}
			if n := queryInt64(t, pool, `SELECT count(*) FROM reports WHERE written_by = $1`, l.Token); n != wantRows {
				t.Errorf("%d rows written under the checked grant, want %d", n, wantRows)
			}
		})
	}
}

func TestCheckLeaseBadInput(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pgtest.Pool(t)
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if err := fenced.CheckLease(ctx, tx, leases.Lease{Holder: "h", Token: 1}); !errors.Is(err, pgcoord.ErrInvalidName) {
		t.Errorf("CheckLease of a lease without a name = %v, want ErrInvalidName", err)
	}
	if err := fenced.CheckLease(ctx, nil, leases.Lease{Name: "job", Holder: "h", Token: 1}); !errors.Is(err, pgcoord.ErrInvalidArgument) {
		t.Errorf("CheckLease with a nil transaction = %v, want ErrInvalidArgument", err)
	}
	if err := fenced.CheckLease(ctx, tx, leases.Lease{Name: "job", Token: 1}); !errors.Is(err, pgcoord.ErrInvalidName) {
		t.Errorf("CheckLease of a lease without a holder = %v, want ErrInvalidName", err)
	}
	if err := fenced.CheckLease(ctx, tx, leases.Lease{Name: "job", Holder: "h"}); !errors.Is(err, pgcoord.ErrInvalidArgument) {
		t.Errorf("CheckLease of a lease without a token = %v, want ErrInvalidArgument", err)
	}
	// Neither reached the database: the transaction is still usable.
	if n := queryInt64(t, tx, `SELECT count(*) FROM pgcoord_leases`); n != 0 {
		t.Errorf("%d lease rows, want 0", n)
	}
}
