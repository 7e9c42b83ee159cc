//go:build unix

package integration_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgcoord/pgcoord/internal/workerproc"
	"github.com/pgcoord/pgcoord/ratelimit"
)

func init() { workerRoles[rlRole] = ratelimitWorker }

const rlRole = "ratelimit.worker"

// ratelimitWorker runs GOROUTINES goroutines that call ratelimit.Allow until told "quit"
// on stdin, each call in a transaction that records an admitted call with its charge (so
// a call and its record commit or vanish together). Parameters: NAME, SEED, GOROUTINES and
// MODE:
//   - exact: one unit of rl_exact/hot; a record holds clock_timestamp() read before the
//     call and after it, which bracket the charge.
//   - nested: a random cost (1 to 3) on per_key/k<i> (12 keys, k0 the hottest),
//     per_tenant/t<i/4> and global/all; a record holds the key, tenant and cost.
//
// Errors of a call (its backend killed by the test) end the call's transaction and the
// loop goes on. It says "ready", then after "quit" "done <admitted> <refused by per_key>
// <refused by per_tenant> <refused by global> <failed calls> <refused by rl_exact>".
//
// MODE=line is different: see rlLine.
func ratelimitWorker(ctx context.Context, w *workerproc.Worker) error {
	name, mode := w.Param("NAME"), w.Param("MODE")
	if mode == "line" {
		return rlLine(ctx, w, name)
	}
	seed, err := strconv.ParseUint(w.Param("SEED"), 10, 64)
	if err != nil {
		return err
	}
	n, err := strconv.Atoi(w.Param("GOROUTINES"))
	if err != nil {
		return err
	}
	var quit atomic.Bool
	var admitted, failed atomic.Int64
	var refusedMu sync.Mutex
	refused := map[string]int64{}
	var wg sync.WaitGroup
	for g := range n {
		rng := rand.New(rand.NewPCG(seed, uint64(g)))
		wg.Go(func() {
			for !quit.Load() && ctx.Err() == nil {
				d, err := rlCall(ctx, w, name, mode, rng)
				switch {
				case err != nil:
					failed.Add(1)
				case d.Allowed:
					admitted.Add(1)
				default:
					refusedMu.Lock()
					refused[d.Policy]++
					refusedMu.Unlock()
				}
			}
		})
	}
	w.Say("ready")
	if err := w.Await("quit"); err != nil {
		return err
	}
	quit.Store(true)
	wg.Wait()
	w.Say("done %d %d %d %d %d %d", admitted.Load(), refused["per_key"], refused["per_tenant"], refused["global"], failed.Load(),
		refused["rl_exact"])
	return nil
}

// rlCall makes one call and records it if admitted, in one transaction.
func rlCall(ctx context.Context, w *workerproc.Worker, name, mode string, rng *rand.Rand) (ratelimit.Decision, error) {
	var d ratelimit.Decision
	err := pgx.BeginFunc(ctx, w.Pool, func(tx pgx.Tx) error {
		switch mode {
		case "exact":
			var before time.Time
			if err := tx.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&before); err != nil {
				return err
			}
			var err error
			if d, err = ratelimit.Allow(ctx, tx, 1, []ratelimit.Limit{{Policy: "rl_exact", Key: "hot"}}, nil); err != nil || !d.Allowed {
				return err
			}
			_, err = tx.Exec(ctx, `INSERT INTO rl_exact_calls (worker, before_at, after_at) VALUES ($1, $2, clock_timestamp())`, name, before)
			return err
		case "nested":
			k := rng.IntN(12) // 40% of the calls on k0, so that each level refuses some
			if rng.IntN(10) < 4 {
				k = 0
			}
			key, tenant, cost := "k"+strconv.Itoa(k), "t"+strconv.Itoa(k/4), int64(1+rng.IntN(3))
			var err error
			d, err = ratelimit.Allow(ctx, tx, cost, []ratelimit.Limit{
				{Policy: "per_key", Key: key}, {Policy: "per_tenant", Key: tenant}, {Policy: "global", Key: "all"},
			}, nil)
			if err != nil || !d.Allowed {
				return err
			}
			_, err = tx.Exec(ctx, `INSERT INTO rl_nested_calls (worker, key, tenant, cost) VALUES ($1, $2, $3, $4)`, name, key, tenant, cost)
			return err
		}
		return errors.New("unknown MODE " + mode)
	})
	if err != nil {
		return ratelimit.Decision{}, fmt.Errorf("%s: %w", name, err)
	}
	return d, nil
}

// rlLine runs GOROUTINES waiters of rl_line/line, waiter g arriving at START (unix ns, the
// host's clock) + (g × PROCS + INDEX) × SPACING, so that the waiters of all processes arrive
// one at a time, interleaved. Each reads the database clock, calls ratelimit.Wait, and
// records its arrival, its slot and when it woke. It says "ready", then "done" when every
// waiter is recorded.
func rlLine(ctx context.Context, w *workerproc.Worker, name string) error {
	var n, procs, index int
	var start, spacing int64
	for _, p := range []struct {
		name string
		v    any
	}{{"GOROUTINES", &n}, {"PROCS", &procs}, {"INDEX", &index}, {"START", &start}, {"SPACING", &spacing}} {
		if _, err := fmt.Sscan(w.Param(p.name), p.v); err != nil {
			return fmt.Errorf("%s: %w", p.name, err)
		}
	}
	w.Say("ready")
	errs := make(chan error, n)
	for g := range n {
		go func() {
			i := g*procs + index
			time.Sleep(time.Until(time.Unix(0, start+int64(i)*spacing)))
			var arrived time.Time
			if err := w.Pool.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&arrived); err != nil {
				errs <- err
				return
			}
			r, err := ratelimit.Wait(ctx, w.Pool, 1, []ratelimit.Limit{{Policy: "rl_line", Key: "line"}}, nil)
			if err != nil {
				errs <- err
				return
			}
			// The database judged the call Delay before its slot.
			_, err = w.Pool.Exec(ctx, `INSERT INTO rl_line_calls (waiter, arrived_at, judged_at, slot_at, woke_at) VALUES ($1, $2, $3, $4, clock_timestamp())`,
				fmt.Sprintf("%s/%d", name, i), arrived, r.At.Add(-r.Delay), r.At)
			errs <- err
		}()
	}
	for range n {
		if err := <-errs; err != nil {
			return err
		}
	}
	w.Say("done")
	return nil
}
