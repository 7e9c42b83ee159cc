package leases_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/leases"
)

func ExampleTryAcquire() {
	ctx := context.Background()
	pool := pgtest.ExamplePool() // your *pgxpool.Pool, with pgcoord migrated

	lease, err := leases.TryAcquire(ctx, pool, "order:42", 30*time.Second, nil)
	if err != nil {
		panic(err)
	}
	defer leases.Release(ctx, pool, lease, nil)
	fmt.Println("granted with fence token", lease.Token)

	// A second worker finds it held.
	_, err = leases.TryAcquire(ctx, pool, "order:42", 30*time.Second, nil)
	fmt.Println(errors.Is(err, leases.ErrHeld))
	// Output:
	// granted with fence token 1
	// true
}

func ExampleAcquire() {
	ctx := context.Background()
	pool := pgtest.ExamplePool()

	first, _ := leases.TryAcquire(ctx, pool, "report", time.Minute, nil)
	go func() {
		time.Sleep(50 * time.Millisecond) // the first holder finishes its work
		leases.Release(ctx, pool, first, nil)
	}()

	// Waits, woken by the release's notification.
	waitCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	second, err := leases.Acquire(waitCtx, pool, "report", time.Minute, nil)
	if err != nil {
		panic(err)
	}
	defer leases.Release(ctx, pool, second, nil)
	fmt.Println("tokens:", first.Token, second.Token)
	// Output:
	// tokens: 1 2
}

func ExampleDo() {
	ctx := context.Background()
	pool := pgtest.ExamplePool()

	// Do renews the lease while the function runs and releases it after. The function's
	// context is cancelled if the lease is lost; every write carries lease.Token.
	err := leases.Do(ctx, pool, "nightly-export", 10*time.Second, func(ctx context.Context, lease leases.Lease) error {
		fmt.Println("exporting under fence token", lease.Token)
		return nil
	}, nil)
	fmt.Println("done:", err)
	info, _ := leases.Get(ctx, pool, "nightly-export")
	fmt.Println("held after Do:", info.Held())
	// Output:
	// exporting under fence token 1
	// done: <nil>
	// held after Do: false
}

// A holder whose work may outlast the TTL renews well before expiry (Do does it for you).
// A renewal keeps the grant's token; once the grant is gone, it returns ErrLost.
func ExampleRenew() {
	ctx := context.Background()
	pool := pgtest.ExamplePool()

	lease, err := leases.TryAcquire(ctx, pool, "reindex", 30*time.Second, nil)
	if err != nil {
		panic(err)
	}
	renewed, err := leases.Renew(ctx, pool, lease, time.Minute, nil) // a minute from now
	if err != nil {
		panic(err)
	}
	fmt.Println("same token:", renewed.Token == lease.Token, "expires later:", renewed.ExpiresAt.After(lease.ExpiresAt))

	// An operator expires the lease (`pgcoord leases expire reindex`): the holder learns
	// at its next renewal, and must stop.
	if _, err := leases.Expire(ctx, pool, "reindex", "operator"); err != nil {
		panic(err)
	}
	_, err = leases.Renew(ctx, pool, renewed, 30*time.Second, nil)
	fmt.Println("lost:", errors.Is(err, leases.ErrLost))
	// Output:
	// same token: true expires later: true
	// lost: true
}

// Release frees the lease at once for the next holder. It acts on one grant only:
// releasing twice, or after the lease changed hands, changes nothing.
func ExampleRelease() {
	ctx := context.Background()
	pool := pgtest.ExamplePool()

	first, err := leases.TryAcquire(ctx, pool, "order:42", 30*time.Second, nil)
	if err != nil {
		panic(err)
	}
	fmt.Println("released:", leases.Release(ctx, pool, first, nil))

	next, err := leases.TryAcquire(ctx, pool, "order:42", 30*time.Second, nil)
	if err != nil {
		panic(err)
	}
	defer leases.Release(ctx, pool, next, nil)
	fmt.Println("next holder's token is higher:", next.Token > first.Token)

	// A late second release of the first grant cannot free the next holder's lease.
	fmt.Println("released again, lost:", errors.Is(leases.Release(ctx, pool, first, nil), leases.ErrLost))
	info, _ := leases.Get(ctx, pool, "order:42")
	fmt.Println("still held:", info.Held())
	// Output:
	// released: <nil>
	// next holder's token is higher: true
	// released again, lost: true
	// still held: true
}
