package idempotency_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/idempotency"
	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/pgcoord"
)

// The middleware cannot deadlock its pool: with a pool of 4 and 50 concurrent requests
// whose handlers query the same pool, every request is answered, none hangs (each is
// bounded by pgtest.WaitLimit). The handlers wait until `together` of them run at once, so
// a middleware that holds a connection across the handler is seen to deadlock, not just
// likely to. Without Atomic every request executes; with Atomic, attempts beyond the
// pool's share are answered 503 with Retry-After.
func TestMiddlewareCannotDeadlockItsPool(t *testing.T) {
	t.Parallel()
	for _, mode := range []struct {
		atomic   bool
		together int64
	}{{false, 4}, {true, 2}} {
		t.Run(fmt.Sprintf("atomic=%v", mode.atomic), func(t *testing.T) {
			t.Parallel()
			pool := pgtest.PoolMax(t, 4)
			var started, executed atomic.Int64
			together := make(chan struct{})
			srv := serve(t, pool, &idempotency.Config{Atomic: mode.atomic}, func(w http.ResponseWriter, r *http.Request) {
				if started.Add(1) == mode.together {
					close(together)
				}
				select {
				case <-together:
				case <-r.Context().Done():
					return
				}
				var n int
				if err := pool.QueryRow(r.Context(), `SELECT 1`).Scan(&n); err != nil {
					http.Error(w, err.Error(), http.StatusInternalServerError)
					return
				}
				executed.Add(1)
				w.WriteHeader(http.StatusCreated)
			})
			const requests = 50
			statuses := make([]int, requests)
			var wg sync.WaitGroup
			for i := range requests {
				wg.Go(func() {
					ctx, cancel := context.WithTimeout(t.Context(), pgtest.WaitLimit)
					defer cancel()
					req, _ := http.NewRequestWithContext(ctx, "POST", srv.URL, strings.NewReader("{}"))
					req.Header.Set("Idempotency-Key", fmt.Sprint("k-", i))
					resp, err := http.DefaultClient.Do(req)
					if err != nil {
						t.Errorf("request %d got no answer: %v", i, err)
						return
					}
					resp.Body.Close()
					statuses[i] = resp.StatusCode
					if resp.StatusCode == http.StatusServiceUnavailable && resp.Header.Get("Retry-After") == "" {
						t.Errorf("request %d: 503 without Retry-After", i)
					}
				})
			}
			wg.Wait()
			for i, s := range statuses {
				if s != http.StatusCreated && (!mode.atomic || s != http.StatusServiceUnavailable) && s != 0 {
					t.Errorf("request %d answered %d", i, s)
				}
			}
			if !mode.atomic && executed.Load() != requests {
				t.Errorf("%d of %d requests executed, want all", executed.Load(), requests)
			}
			if executed.Load() == 0 {
				t.Error("no request executed")
			}
		})
	}
}

// A running attempt's lease is renewed (every third of it) while its work runs, so a slow
// but live holder is not taken over; Close stops the renewals and frees the key. An
// Atomic middleware on a pool of one connection (which its handler could never share) is
// refused.
func TestLeaseRenewedWhileTheAttemptRuns(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pgtest.Pool(t)
	a, err := idempotency.Begin(ctx, pool, "slow", "k", fp, &idempotency.BeginOpts{Lease: idempotency.MinLease})
	if err != nil {
		t.Fatal(err)
	}
	lease := func() time.Time {
		var at time.Time
		if err := pool.QueryRow(ctx, `SELECT lease_expires_at FROM pgcoord_idempotency_keys WHERE key = 'k'`).Scan(&at); err != nil {
			t.Fatal(err)
		}
		return at
	}
	first := lease()
	deadline := time.Now().Add(pgtest.WaitLimit)
	for renewals := 0; renewals < 4; {
		if time.Now().After(deadline) {
			t.Fatalf("%d renewals of a 1s lease within %v", renewals, pgtest.WaitLimit)
		}
		if at := lease(); at.After(first) {
			renewals++
			first = at
		}
		if _, err := idempotency.Begin(ctx, pool, "slow", "k", fp, nil); !errors.Is(err, idempotency.ErrInFlight) {
			t.Fatalf("repeat while the holder renews: %v, want ErrInFlight", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	a.Close(ctx)
	if keys(t, pool) != 0 {
		t.Fatal("Close left the key")
	}

	one, err := pgxpool.NewWithConfig(ctx, func() *pgxpool.Config { c := pool.Config(); c.MaxConns = 1; return c }())
	if err != nil {
		t.Fatal(err)
	}
	defer one.Close()
	if _, err := idempotency.Middleware(one, &idempotency.Config{Atomic: true, Scope: oneScope}); !errors.Is(err, pgcoord.ErrInvalidArgument) {
		t.Errorf("Atomic middleware on a 1-connection pool: %v, want ErrInvalidArgument", err)
	}
	if _, err := idempotency.Begin(ctx, one, "slow", "one", fp, &idempotency.BeginOpts{Atomic: true}); !errors.Is(err, pgcoord.ErrInvalidArgument) {
		t.Errorf("Atomic Begin on a 1-connection pool: %v, want ErrInvalidArgument", err)
	}
}

// While the pool's Atomic share is taken, an Atomic Begin answers a repeat as usual (a
// replay, ErrInFlight) and a key it could run with ErrBusy, leaving the key as it found it:
// a new key is not stored, a dead holder's key keeps its recovery point for the next
// attempt.
func TestAtomicBusyLeavesKeysAsTheyWere(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pgtest.PoolMax(t, 2) // an Atomic share of one
	atomicOpts := &idempotency.BeginOpts{Atomic: true}
	done, err := idempotency.Begin(ctx, pool, "busy", "done", fp, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := done.Complete(ctx, idempotency.Response{Status: 201, Body: []byte("done")}); err != nil {
		t.Fatal(err)
	}
	deadHolder(t, pool, "busy", "dead", fp, "charged")
	running, err := idempotency.Begin(ctx, pool, "busy", "running", fp, atomicOpts)
	if err != nil {
		t.Fatal(err)
	}
	defer running.Close(ctx)
	if r, err := idempotency.Begin(ctx, pool, "busy", "done", fp, atomicOpts); err != nil || r.Replay() == nil {
		t.Errorf("replay while busy = %v; want the stored response", err)
	}
	if _, err := idempotency.Begin(ctx, pool, "busy", "running", fp, atomicOpts); !errors.Is(err, idempotency.ErrInFlight) {
		t.Errorf("repeat of the running key while busy: %v, want ErrInFlight", err)
	}
	for _, key := range []string{"new", "dead"} {
		if _, err := idempotency.Begin(ctx, pool, "busy", key, fp, atomicOpts); !errors.Is(err, idempotency.ErrBusy) {
			t.Errorf("%s key while busy: %v, want ErrBusy", key, err)
		}
	}
	if n := queryInt(t, pool, `SELECT count(*) FROM pgcoord_idempotency_keys WHERE key = 'new'`); n != 0 {
		t.Error("a refused Atomic Begin left its key stored")
	}
	running.Close(ctx)
	b, err := idempotency.Begin(ctx, pool, "busy", "dead", fp, atomicOpts)
	if err != nil {
		t.Fatal(err)
	}
	if point, _ := b.RecoveryPoint(); point != "charged" {
		t.Errorf("after the busy refusal the dead holder's key resumes at %q, want charged", point)
	}
	b.Close(ctx)
}

// GC skips a key past its retention while its holder's lease is live, and deletes it
// (leaving a tombstone) once the lease has lapsed.
func TestGCSkipsLiveLeases(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pgtest.Pool(t)
	a, err := idempotency.Begin(ctx, pool, "gc", "running", fp, &idempotency.BeginOpts{Retention: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close(ctx)
	exec(t, pool, `UPDATE pgcoord_idempotency_keys SET expires_at = pgcoord_now() - interval '1 second'`)
	if n, err := idempotency.GC(ctx, pool, nil); err != nil || n != 0 || keys(t, pool) != 1 {
		t.Fatalf("GC of an expired key with a live lease = %d, %v; want it skipped", n, err)
	}
	exec(t, pool, `UPDATE pgcoord_idempotency_keys SET holder = 'dead-process', lease_expires_at = pgcoord_now() - interval '1 second'`)
	if n, err := idempotency.GC(ctx, pool, nil); err != nil || n != 1 || keys(t, pool) != 0 {
		t.Fatalf("GC of an expired key whose lease lapsed = %d, %v; want it deleted", n, err)
	}
}
