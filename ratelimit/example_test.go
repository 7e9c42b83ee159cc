package ratelimit_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/ratelimit"
)

func ExampleSet() {
	ctx := context.Background()
	pool := pgtest.ExamplePool() // your *pgxpool.Pool, with pgcoord migrated

	// 10 calls a second per API key, in bursts of up to 20; changeable at runtime.
	p, err := ratelimit.Set(ctx, pool, ratelimit.Policy{Name: "api", Rate: 10, Period: time.Second, Burst: 20})
	if err != nil {
		panic(err)
	}
	fmt.Println(p.Name, "admits one unit every", p.Interval)
	// Output:
	// api admits one unit every 100ms
}

// Nested limits: a call is charged to its API key and to its tenant, or to neither.
func ExampleAllow() {
	ctx := context.Background()
	pool := pgtest.ExamplePool()
	_, _ = ratelimit.Set(ctx, pool, ratelimit.Policy{Name: "per_key", Rate: 10, Period: time.Second, Burst: 10})
	_, _ = ratelimit.Set(ctx, pool, ratelimit.Policy{Name: "per_tenant", Rate: 1, Period: time.Hour, Burst: 2})

	call := []ratelimit.Limit{{Policy: "per_key", Key: "key:123"}, {Policy: "per_tenant", Key: "tenant:9"}}
	for range 3 {
		d, err := ratelimit.Allow(ctx, pool, 1, call, nil)
		if err != nil {
			panic(err)
		}
		if !d.Allowed {
			fmt.Printf("refused by %s, retry in about %v\n", d.Policy, d.RetryAfter.Round(time.Hour))
			continue
		}
		fmt.Println("allowed;", d.Remaining, "left under", d.Policy)
	}
	// Output:
	// allowed; 1 left under per_tenant
	// allowed; 0 left under per_tenant
	// refused by per_tenant, retry in about 1h0m0s
}

// The charge commits or rolls back with the caller's own writes.
func ExampleAllow_inATransaction() {
	ctx := context.Background()
	pool := pgtest.ExamplePool()
	_, _ = ratelimit.Set(ctx, pool, ratelimit.Policy{Name: "exports", Rate: 1, Period: time.Hour, Burst: 1})
	limit := []ratelimit.Limit{{Policy: "exports", Key: "tenant:9"}}

	tx, _ := pool.Begin(ctx)
	d, _ := ratelimit.Allow(ctx, tx, 1, limit, nil)
	fmt.Println("allowed in a transaction:", d.Allowed)
	_ = tx.Rollback(ctx) // the export failed: its charge goes with it

	_ = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		d, err := ratelimit.Allow(ctx, tx, 1, limit, nil)
		fmt.Println("allowed again after the rollback:", d.Allowed)
		return err
	})
	// Output:
	// allowed in a transaction: true
	// allowed again after the rollback: true
}

// A batch consumer takes what the limit admits now.
func ExampleAllowAtMost() {
	ctx := context.Background()
	pool := pgtest.ExamplePool()
	_, _ = ratelimit.Set(ctx, pool, ratelimit.Policy{Name: "emails", Rate: 100, Period: time.Hour, Burst: 30})

	d, _ := ratelimit.AllowAtMost(ctx, pool, 50, []ratelimit.Limit{{Policy: "emails", Key: "all"}}, nil)
	fmt.Println("send", d.Granted, "of 50 now")
	// Output:
	// send 30 of 50 now
}

// Waiting in line instead of retrying: each caller sleeps until its own slot.
func ExampleWait() {
	ctx := context.Background()
	pool := pgtest.ExamplePool()
	_, _ = ratelimit.Set(ctx, pool, ratelimit.Policy{Name: "partner", Rate: 50, Period: time.Second, Burst: 1})

	start := time.Now()
	for range 3 {
		if _, err := ratelimit.Wait(ctx, pool, 1, []ratelimit.Limit{{Policy: "partner", Key: "acme"}}, nil); err != nil {
			panic(err)
		}
	}
	fmt.Println("three calls at 50/s took at least 40ms:", time.Since(start) >= 40*time.Millisecond)
	// Output:
	// three calls at 50/s took at least 40ms: true
}

// Reserve a slot, then give it back when the work will not happen.
func ExampleReserve() {
	ctx := context.Background()
	pool := pgtest.ExamplePool()
	_, _ = ratelimit.Set(ctx, pool, ratelimit.Policy{Name: "reports", Rate: 1, Period: time.Minute, Burst: 1})
	limit := []ratelimit.Limit{{Policy: "reports", Key: "tenant:9"}}

	first, _ := ratelimit.Reserve(ctx, pool, 1, limit, time.Hour, nil)
	second, _ := ratelimit.Reserve(ctx, pool, 1, limit, time.Hour, nil)
	fmt.Println("first now:", first.Delay == 0, "second in about", second.Delay.Round(time.Minute))
	_ = second.Cancel(ctx, pool) // not needed after all
	third, _ := ratelimit.Reserve(ctx, pool, 1, limit, time.Hour, nil)
	fmt.Println("the third gets the second's slot:", third.Delay.Round(time.Minute))
	// Output:
	// first now: true second in about 1m0s
	// the third gets the second's slot: 1m0s
}

func ExampleMiddleware() {
	ctx := context.Background()
	pool := pgtest.ExamplePool()
	_, _ = ratelimit.Set(ctx, pool, ratelimit.Policy{Name: "api", Rate: 1, Period: time.Minute, Burst: 1})

	mw, err := ratelimit.Middleware(pool, ratelimit.MiddlewareConfig{
		Limits: func(r *http.Request) ([]ratelimit.Limit, error) {
			return []ratelimit.Limit{{Policy: "api", Key: "key:" + r.Header.Get("X-Api-Key")}}, nil
		},
	})
	if err != nil {
		panic(err)
	}
	h := mw(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, "ok") }))
	for range 2 {
		rec := httptest.NewRecorder()
		req := httptest.NewRequestWithContext(ctx, http.MethodGet, "/orders", nil)
		req.Header.Set("X-Api-Key", "123")
		h.ServeHTTP(rec, req)
		fmt.Printf("%d %s retry-after=%q\n", rec.Code, rec.Header().Get("RateLimit-Policy"), rec.Header().Get("Retry-After"))
	}
	// Output:
	// 200 "api";q=1;w=60 retry-after=""
	// 429 "api";q=1;w=60 retry-after="60"
}
