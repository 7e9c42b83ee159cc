package semaphore_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/semaphore"
)

func ExampleTryAcquire() {
	ctx := context.Background()
	pool := pgtest.ExamplePool() // your *pgxpool.Pool, with pgcoord migrated

	// At most 2 concurrent imports for tenant 42, cluster-wide.
	a, err := semaphore.TryAcquire(ctx, pool, "tenant:42", 2, 30*time.Second, nil)
	if err != nil {
		panic(err)
	}
	defer semaphore.Release(ctx, pool, a)
	b, _ := semaphore.TryAcquire(ctx, pool, "tenant:42", 2, 30*time.Second, nil)
	defer semaphore.Release(ctx, pool, b)
	fmt.Println("fence tokens:", a.Token, b.Token)

	// A third worker finds the tenant full: it should work for another tenant (see Next).
	_, err = semaphore.TryAcquire(ctx, pool, "tenant:42", 2, 30*time.Second, nil)
	fmt.Println(errors.Is(err, semaphore.ErrFull))

	s, _ := semaphore.Get(ctx, pool, "tenant:42")
	fmt.Printf("held %d of %d\n", s.Held, s.Limit)
	// Output:
	// fence tokens: 1 2
	// true
	// held 2 of 2
}

// A fair worker loop. Producers enqueue jobs and report them with AddDemand in the same
// transaction; workers ask Next which tenant goes next, take one job of that tenant from
// the queue, run it and release the permit. A tenant with a big backlog cannot starve the
// others: admissions alternate between tenants that have work.
func ExampleNext() {
	ctx := context.Background()
	pool := pgtest.ExamplePool()
	if _, err := pool.Exec(ctx, `CREATE TABLE jobs (id bigserial PRIMARY KEY, tenant text NOT NULL, what text NOT NULL)`); err != nil {
		panic(err)
	}

	enqueue := func(tenant string, jobs ...string) {
		tx, err := pool.Begin(ctx)
		if err != nil {
			panic(err)
		}
		defer tx.Rollback(ctx)
		for _, j := range jobs {
			if _, err := tx.Exec(ctx, `INSERT INTO jobs (tenant, what) VALUES ($1, $2)`, tenant, j); err != nil {
				panic(err)
			}
		}
		// At most 3 concurrent jobs per tenant (the limit applies when the key is created).
		if err := semaphore.AddDemand(ctx, tx, tenant, int64(len(jobs)), &semaphore.AddDemandOpts{Limit: 3}); err != nil {
			panic(err)
		}
		if err := tx.Commit(ctx); err != nil {
			panic(err)
		}
	}
	enqueue("acme", "import-1", "import-2", "import-3", "import-4", "import-5")
	enqueue("globex", "report-1", "report-2")

	// One worker; run many, in many processes, and they share the tenants fairly.
	for {
		p, err := semaphore.Next(ctx, pool, 30*time.Second, nil)
		if errors.Is(err, semaphore.ErrNoWork) {
			break // a real worker waits a little, or for news of new jobs, and asks again
		}
		if err != nil {
			panic(err)
		}
		var what string
		err = pool.QueryRow(ctx, `
			DELETE FROM jobs WHERE id = (
				SELECT id FROM jobs WHERE tenant = $1 ORDER BY id FOR UPDATE SKIP LOCKED LIMIT 1)
			RETURNING what`, p.Key).Scan(&what)
		if err != nil {
			panic(err)
		}
		fmt.Printf("%s: %s (token %d)\n", p.Key, what, p.Token) // the job, fenced by p.Token
		semaphore.Release(ctx, pool, p)
	}
	// Output:
	// acme: import-1 (token 1)
	// globex: report-1 (token 1)
	// acme: import-2 (token 2)
	// globex: report-2 (token 2)
	// acme: import-3 (token 3)
	// acme: import-4 (token 4)
	// acme: import-5 (token 5)
}

func ExampleAcquire() {
	ctx := context.Background()
	pool := pgtest.ExamplePool()

	first, _ := semaphore.TryAcquire(ctx, pool, "export", 1, time.Minute, nil)
	go func() {
		time.Sleep(50 * time.Millisecond) // the first holder finishes its work
		semaphore.Release(ctx, pool, first)
	}()

	// Waits in line, woken by the release's notification.
	waitCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	second, err := semaphore.Acquire(waitCtx, pool, "export", 1, time.Minute, nil)
	if err != nil {
		panic(err)
	}
	defer semaphore.Release(ctx, pool, second)
	fmt.Println("tokens:", first.Token, second.Token)
	// Output:
	// tokens: 1 2
}

func ExampleSetLimit() {
	ctx := context.Background()
	pool := pgtest.ExamplePool()

	// Tenant "gold" gets up to 10 concurrent jobs and three times the share of a weight-1
	// tenant in Next.
	if err := semaphore.SetLimit(ctx, pool, "gold", 10, &semaphore.SetLimitOpts{Weight: 3}); err != nil {
		panic(err)
	}
	s, _ := semaphore.Get(ctx, pool, "gold")
	fmt.Println(s.Limit, s.Weight)
	// Output:
	// 10 3
}
