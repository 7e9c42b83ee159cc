package semaphore_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

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
	fmt.Println("the later permit has the higher fence token:", b.Token > a.Token)

	// A third worker finds the tenant full: it should work for another tenant (see Next).
	_, err = semaphore.TryAcquire(ctx, pool, "tenant:42", 2, 30*time.Second, nil)
	fmt.Println(errors.Is(err, semaphore.ErrFull))

	s, _ := semaphore.Get(ctx, pool, "tenant:42")
	fmt.Printf("held %d of %d\n", s.Held, s.Limit)
	// Output:
	// the later permit has the higher fence token: true
	// true
	// held 2 of 2
}

// A fair worker loop. Producers enqueue jobs and report them with AddDemand in the same
// transaction; workers ask Next which tenant goes next, take one job of that tenant from
// the queue (marking it with the permit's token), run it, and remove it with Done in one
// transaction. A tenant with a big backlog cannot starve the others: admissions alternate
// between tenants that have work. A worker that dies at any point strands no job: its
// permit expires, the unit of demand it reserved comes back, and the job's mark names a
// permit that is no longer held.
func ExampleNext() {
	ctx := context.Background()
	pool := pgtest.ExamplePool()
	if _, err := pool.Exec(ctx, `CREATE TABLE jobs (
		id           bigserial PRIMARY KEY,
		tenant       text NOT NULL,
		what         text NOT NULL,
		permit_token bigint -- the permit it was taken under; NULL while queued
	)`); err != nil {
		panic(err)
	}

	enqueue := func(tenant string, jobs ...string) {
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			for _, j := range jobs {
				if _, err := tx.Exec(ctx, `INSERT INTO jobs (tenant, what) VALUES ($1, $2)`, tenant, j); err != nil {
					return err
				}
			}
			// At most 3 concurrent jobs per tenant (the limit applies when the key is created).
			return semaphore.AddDemand(ctx, tx, tenant, int64(len(jobs)), &semaphore.AddDemandOpts{Limit: 3})
		})
		if err != nil {
			panic(err)
		}
	}
	enqueue("acme", "import-1", "import-2", "import-3", "import-4", "import-5")
	enqueue("globex", "report-1", "report-2")

	// One job: ErrNoWork when no tenant may run one now.
	work := func() error {
		p, err := semaphore.Next(ctx, pool, 30*time.Second, nil)
		if err != nil {
			return err
		}
		defer semaphore.Release(ctx, pool, p) // gives the unit back, unless Done consumed it
		var id int64
		var what string
		err = pool.QueryRow(ctx, `UPDATE jobs SET permit_token = $2 WHERE id = (
				SELECT id FROM jobs WHERE tenant = $1
				   AND (permit_token IS NULL OR NOT pgcoord_semaphore_held(tenant, permit_token))
				 ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED)
			RETURNING id, what`, p.Key, p.Token).Scan(&id, &what)
		if err != nil {
			return err
		}
		fmt.Printf("%s: %s\n", p.Key, what) // the job, its writes fenced by p.Token
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			tag, err := tx.Exec(ctx, `DELETE FROM jobs WHERE id = $1 AND permit_token = $2`, id, p.Token)
			if err == nil && tag.RowsAffected() == 0 {
				err = semaphore.ErrLost // taken again under a later permit: ours expired
			}
			if err != nil {
				return err
			}
			return semaphore.Done(ctx, tx, p)
		})
	}
	// One worker; run many, in many processes, and they share the tenants fairly.
	for {
		err := work()
		if errors.Is(err, semaphore.ErrNoWork) {
			break // a real worker waits a little, or for news of new jobs, and asks again
		}
		if err != nil {
			panic(err)
		}
	}
	s, _ := semaphore.Get(ctx, pool, "acme")
	fmt.Println("acme's demand:", s.Demand)
	// Output:
	// acme: import-1
	// globex: report-1
	// acme: import-2
	// globex: report-2
	// acme: import-3
	// acme: import-4
	// acme: import-5
	// acme's demand: 0
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
	fmt.Println("the second holder's token is higher:", second.Token > first.Token)
	// Output:
	// the second holder's token is higher: true
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

// Producers report the work they enqueue, in the transaction that enqueues it, so that Next
// knows which tenants have work; cancelled jobs are taken away the same way.
func ExampleAddDemand() {
	ctx := context.Background()
	pool := pgtest.ExamplePool()
	if _, err := pool.Exec(ctx, `CREATE TABLE jobs (id bigserial PRIMARY KEY, tenant text NOT NULL, what text NOT NULL)`); err != nil {
		panic(err)
	}

	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		for _, what := range []string{"import-1", "import-2", "import-3"} {
			if _, err := tx.Exec(ctx, `INSERT INTO jobs (tenant, what) VALUES ('acme', $1)`, what); err != nil {
				return err
			}
		}
		// Last in the transaction: it locks the key's row until COMMIT.
		return semaphore.AddDemand(ctx, tx, "acme", 3, &semaphore.AddDemandOpts{Limit: 2})
	})
	if err != nil {
		panic(err)
	}

	// The customer cancels one import before it ran.
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `DELETE FROM jobs WHERE tenant = 'acme' AND what = 'import-3'`)
		if err != nil {
			return err
		}
		return semaphore.AddDemand(ctx, tx, "acme", -tag.RowsAffected(), nil)
	})
	if err != nil {
		panic(err)
	}
	s, _ := semaphore.Get(ctx, pool, "acme")
	fmt.Println("demand:", s.Demand, "limit:", s.Limit)
	// Output:
	// demand: 2 limit: 2
}
