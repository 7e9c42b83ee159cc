package fenced_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgcoord/pgcoord/fenced"
	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/leases"
)

// A fenced write: take the lease, then in one transaction check its token against the
// resource's fence register and write. A holder that paused past its lease and wakes up
// after the next holder wrote is refused, however long it slept.
func ExampleCheck() {
	ctx := context.Background()
	pool := pgtest.ExamplePool() // your *pgxpool.Pool, with pgcoord migrated
	if _, err := pool.Exec(ctx, `CREATE TABLE charges (order_id int, token bigint)`); err != nil {
		panic(err)
	}

	// charge records a charge for order 42 under the lease's token, if no newer holder
	// has written before.
	charge := func(lease leases.Lease) error {
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if err := fenced.Check(ctx, tx, "order:42", lease.Token); err != nil {
				return err // fenced.ErrStale: roll back, a newer holder took over
			}
			_, err := tx.Exec(ctx, `INSERT INTO charges VALUES (42, $1)`, lease.Token)
			return err
		})
	}

	// Worker A takes the lease, then stalls (a GC pause) past its TTL ...
	a, err := leases.TryAcquire(ctx, pool, "order:42", time.Minute, nil)
	if err != nil {
		panic(err)
	}
	// ... so the lease is handed over (here by an operator), and worker B charges.
	if _, err := leases.Expire(ctx, pool, "order:42", "example"); err != nil {
		panic(err)
	}
	b, err := leases.TryAcquire(ctx, pool, "order:42", time.Minute, nil)
	if err != nil {
		panic(err)
	}
	defer leases.Release(ctx, pool, b, nil)
	fmt.Println("B charges with token", b.Token, "->", charge(b))

	// A wakes up, still believing it holds the lease.
	err = charge(a)
	fmt.Println("A charges with token", a.Token, "-> stale:", errors.Is(err, fenced.ErrStale))

	var charges int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM charges`).Scan(&charges); err != nil {
		panic(err)
	}
	fmt.Println("charges:", charges)
	// Output:
	// B charges with token 2 -> <nil>
	// A charges with token 1 -> stale: true
	// charges: 1
}

// The guard trigger makes the database itself refuse a write that would lower a row's
// fence token, whichever code path sends it: here a raw UPDATE that does not go through
// this package at all. Without a resource column (GuardOpts), it judges UPDATEs only.
func ExampleInstallGuard() {
	ctx := context.Background()
	pool := pgtest.ExamplePool()
	if _, err := pool.Exec(ctx, `CREATE TABLE payments (order_id int PRIMARY KEY, status text, fence_token bigint NOT NULL);
		INSERT INTO payments VALUES (42, 'charged', 34)`); err != nil {
		panic(err)
	}

	if err := fenced.InstallGuard(ctx, pool, "payments", "fence_token", nil); err != nil {
		panic(err)
	}

	// A zombie holder with token 33 writes without checking anything.
	_, err := pool.Exec(ctx, `UPDATE payments SET status = 'charged again', fence_token = 33 WHERE order_id = 42`)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		fmt.Println("SQLSTATE", pgErr.Code, "stale:", fenced.IsStale(err))
	}
	// The current holder writes with its own token, or a newer one.
	_, err = pool.Exec(ctx, `UPDATE payments SET status = 'refunded', fence_token = 35 WHERE order_id = 42`)
	fmt.Println("token 35:", err)
	// Output:
	// SQLSTATE PGC01 stale: true
	// token 35: <nil>
}

// With a resource column, the guard judges INSERTs too: here an insert-only ledger of
// charges, each row judged against the lease and the fence register of "order:" ||
// order_id, whatever code path inserts it.
func ExampleInstallGuard_insertOnlyLedger() {
	ctx := context.Background()
	pool := pgtest.ExamplePool()
	if _, err := pool.Exec(ctx, `CREATE TABLE charges (order_id int, amount_cents int NOT NULL, fence_token bigint)`); err != nil {
		panic(err)
	}
	err := fenced.InstallGuard(ctx, pool, "charges", "fence_token", &fenced.GuardOpts{ResourceColumn: "order_id", ResourcePrefix: "order:"})
	if err != nil {
		panic(err)
	}

	// Worker A takes order 42's lease and pauses; the lease is handed over to B.
	a, err := leases.TryAcquire(ctx, pool, "order:42", time.Minute, nil)
	if err != nil {
		panic(err)
	}
	if _, err := leases.Expire(ctx, pool, "order:42", "example"); err != nil {
		panic(err)
	}
	b, err := leases.TryAcquire(ctx, pool, "order:42", time.Minute, nil)
	if err != nil {
		panic(err)
	}
	// A wakes up and inserts its charge before B has charged: the database refuses it.
	_, err = pool.Exec(ctx, `INSERT INTO charges VALUES (42, 1999, $1)`, a.Token)
	fmt.Println("A's charge refused:", fenced.IsStale(err))
	_, err = pool.Exec(ctx, `INSERT INTO charges VALUES (42, 1999, $1)`, b.Token)
	fmt.Println("B's charge:", err)
	// Output:
	// A's charge refused: true
	// B's charge: <nil>
}

// The conditional update: the row itself carries the highest token that wrote it.
func ExampleExec() {
	ctx := context.Background()
	pool := pgtest.ExamplePool()
	if _, err := pool.Exec(ctx, `CREATE TABLE payments (order_id int PRIMARY KEY, status text, fence_token bigint NOT NULL);
		INSERT INTO payments VALUES (42, 'pending', 0)`); err != nil {
		panic(err)
	}

	const charge = `UPDATE payments SET status = 'charged', fence_token = $2
		WHERE order_id = $1 AND fence_token <= $2`
	tag, err := fenced.Exec(ctx, pool, charge, 42, 34)
	fmt.Println(tag, err)
	_, err = fenced.Exec(ctx, pool, charge, 42, 33)
	fmt.Println(errors.Is(err, fenced.ErrStale))
	// Output:
	// UPDATE 1 <nil>
	// true
}

// CheckLease gives mutual exclusion for writes in the same database: once it passed, the
// lease cannot change hands until the transaction ends.
func ExampleCheckLease() {
	ctx := context.Background()
	pool := pgtest.ExamplePool()

	lease, err := leases.TryAcquire(ctx, pool, "nightly-report", time.Minute, nil)
	if err != nil {
		panic(err)
	}
	write := func() error {
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if err := fenced.CheckLease(ctx, tx, lease); err != nil {
				return err // leases.ErrLost
			}
			// ... the report's writes, made while the lease is certainly held ...
			return nil
		})
	}
	fmt.Println("while held:", write())
	if err := leases.Release(ctx, pool, lease, nil); err != nil {
		panic(err)
	}
	fmt.Println("after release, lost:", errors.Is(write(), leases.ErrLost))
	// Output:
	// while held: <nil>
	// after release, lost: true
}

// Write sends the fence check and the write together, in one round trip: the statement
// runs only if the token is not stale.
func ExampleWrite() {
	ctx := context.Background()
	pool := pgtest.ExamplePool()
	if _, err := pool.Exec(ctx, `CREATE TABLE reports (day date PRIMARY KEY, body text)`); err != nil {
		panic(err)
	}

	// publish writes the day's report under a lease's token.
	publish := func(lease leases.Lease, body string) error {
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := fenced.Write(ctx, tx, "report:2024-06-01", lease.Token,
				`INSERT INTO reports VALUES ('2024-06-01', $1)
				 ON CONFLICT (day) DO UPDATE SET body = excluded.body`, body)
			return err // fenced.ErrStale: nothing was written; the transaction rolls back
		})
	}

	// A takes the lease and pauses; the lease passes to B, who publishes.
	a, err := leases.TryAcquire(ctx, pool, "report:2024-06-01", time.Minute, nil)
	if err != nil {
		panic(err)
	}
	if _, err := leases.Expire(ctx, pool, "report:2024-06-01", "example"); err != nil {
		panic(err)
	}
	b, err := leases.TryAcquire(ctx, pool, "report:2024-06-01", time.Minute, nil)
	if err != nil {
		panic(err)
	}
	defer leases.Release(ctx, pool, b, nil)
	fmt.Println("B:", publish(b, "from B"))

	// A wakes up and publishes its older report: refused, B's stays.
	fmt.Println("A stale:", errors.Is(publish(a, "from A"), fenced.ErrStale))
	var body string
	if err := pool.QueryRow(ctx, `SELECT body FROM reports`).Scan(&body); err != nil {
		panic(err)
	}
	fmt.Println(body)
	// Output:
	// B: <nil>
	// A stale: true
	// from B
}
