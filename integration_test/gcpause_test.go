//go:build unix

package integration_test

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pgcoord/pgcoord/fenced"
	"github.com/pgcoord/pgcoord/leases"
)

// The double-charge incident of the mission, with real processes. Per order, payment worker
// A takes the lease "order:<id>" with a short TTL and stalls (SIGSTOP: a stop-the-world
// pause it cannot notice) past the lease's expiry by the database clock; worker B, another
// process, takes the lease with a higher token and charges; then A wakes up (SIGCONT) still
// believing it holds the lease, and charges too.
//
//   - naive: the charge is an unconditional INSERT. Both charges land: the incident is real,
//     and a time-based lease alone cannot prevent it.
//   - fenced: the charge runs fenced.Check(order, token) first, in its transaction. A's
//     check finds B's higher token and returns fenced.ErrStale: exactly one charge, B's.
//   - guard: the payments table carries the guard trigger (fenced.InstallGuard) and the
//     charge is a raw UPDATE that sets fence_token with no check in its WHERE clause (a code
//     path that forgot fencing). The database refuses A's lower token with SQLSTATE PGC01:
//     exactly one charge, B's.

const (
	gcpauseRole = "gcpause.charge"
	// gcpauseTTL is A's lease: short, so that the test waits little for its expiry.
	gcpauseTTL = 400 * time.Millisecond
	// gcpauseStep bounds every single wait of the scenario: a line from a worker, an exit,
	// the lease's expiry, B's acquisition.
	gcpauseStep = 20 * time.Second
	// gcpauseParallel orders run at a time (each with its two worker processes).
	gcpauseParallel = 4
)

// pauseOutcome is one order of the pause scenario as the test saw it.
type pauseOutcome struct {
	order  int64
	a, b   grant
	aSaid  string // what A said after it woke up
	before leases.Info
}

// pauseOrder plays the incident for one order: A acquires, is stopped, its lease expires by
// the database clock, B acquires and charges, A is continued and charges.
func (r *gcpauseRig) pauseOrder(ctx context.Context, t *testing.T, mode string, order int64) (pauseOutcome, error) {
	out := pauseOutcome{order: order}
	a, err := r.start(t, "A", mode, "try", order)
	if err != nil {
		return out, err
	}
	if out.a, err = acquired(a); err != nil {
		return out, err
	}
	// The pause: A holds the lease and has not charged yet.
	if err := a.Signal(syscall.SIGSTOP); err != nil {
		return out, err
	}
	if out.before, err = waitExpired(ctx, r.pool, orderLease(order)); err != nil {
		return out, err
	}
	b, err := r.start(t, "B", mode, "try", order)
	if err != nil {
		return out, err
	}
	if out.b, err = acquired(b); err != nil {
		return out, err
	}
	if err := b.Send("go"); err != nil {
		return out, err
	}
	if _, err := b.Expect(gcpauseStep, "charged"); err != nil {
		return out, err
	}
	if err := b.Wait(gcpauseStep); err != nil {
		return out, fmt.Errorf("worker %s: %w", b.Name(), err)
	}
	// A wakes up, still believing it holds the lease, and charges.
	if err := a.Signal(syscall.SIGCONT); err != nil {
		return out, err
	}
	if err := a.Send("go"); err != nil {
		return out, err
	}
	if out.aSaid, err = a.Expect(gcpauseStep, "charged", "stale"); err != nil {
		return out, err
	}
	if err := a.Wait(gcpauseStep); err != nil {
		return out, fmt.Errorf("worker %s: %w", a.Name(), err)
	}
	return out, nil
}

// checkTokens asserts the invariants every mode shares: the lease was still A's grant when
// it expired, and B's grant has a strictly higher token, granted no earlier than A's grant
// expired by the database clock.
func checkTokens(t *testing.T, o pauseOutcome) {
	t.Helper()
	if o.before.Token != o.a.token {
		t.Errorf("order %d: the lease expired with token %d, want A's %d", o.order, o.before.Token, o.a.token)
	}
	if o.b.token <= o.a.token {
		t.Errorf("order %d: B's token %d is not higher than A's %d", o.order, o.b.token, o.a.token)
	}
	if o.b.acquiredAt.Before(o.a.expiresAt) {
		t.Errorf("order %d: B was granted at %v, before A's grant expired at %v (database clock)", o.order, o.b.acquiredAt, o.a.expiresAt)
	}
}

// TestGCPauseDoubleCharge plays the incident over many orders in each mode and checks the
// whole history: without fencing every order is charged twice; with fencing (register or
// guard trigger) every order is charged exactly once, by B, with B's higher token, and A is
// told its token is stale.
func TestGCPauseDoubleCharge(t *testing.T) {
	t.Parallel()
	r := newGCPauseRig(t)
	ctx := t.Context()
	n := gcpauseOrders()

	t.Run("naive", func(t *testing.T) {
		outcomes := forOrders(t, 1000, n, func(order int64) (pauseOutcome, error) { return r.pauseOrder(ctx, t, "naive", order) })
		for _, o := range outcomes {
			checkTokens(t, o)
			if o.aSaid != "charged" {
				t.Errorf("order %d: A said %q after waking up, want charged", o.order, o.aSaid)
			}
			got := chargesOf(ctx, t, r.pool, o.order)
			want := []charge{{"B", o.b.token}, {"A", o.a.token}}
			if len(got) != 2 || got[0] != want[0] || got[1] != want[1] {
				t.Errorf("order %d: charges %v, want the double charge %v", o.order, got, want)
			}
		}
	})

	t.Run("fenced", func(t *testing.T) {
		outcomes := forOrders(t, 2000, n, func(order int64) (pauseOutcome, error) { return r.pauseOrder(ctx, t, "fenced", order) })
		for _, o := range outcomes {
			checkTokens(t, o)
			if !strings.HasPrefix(o.aSaid, "stale ") {
				t.Errorf("order %d: A said %q after waking up, want stale (fenced.ErrStale)", o.order, o.aSaid)
			}
			got := chargesOf(ctx, t, r.pool, o.order)
			if len(got) != 1 || got[0] != (charge{"B", o.b.token}) {
				t.Errorf("order %d: charges %v, want exactly one, by B with token %d", o.order, got, o.b.token)
			}
			var highest int64
			if err := r.pool.QueryRow(ctx, `SELECT fence_token FROM pgcoord_fences WHERE resource = $1`, orderLease(o.order)).Scan(&highest); err != nil {
				t.Fatal(err)
			}
			if highest != o.b.token {
				t.Errorf("order %d: the fence register holds %d, want B's token %d", o.order, highest, o.b.token)
			}
		}
	})

	t.Run("guard", func(t *testing.T) {
		const first = 3000
		if _, err := r.pool.Exec(ctx, `INSERT INTO payments (order_id) SELECT generate_series($1::bigint, $2::bigint)`, first, first+n-1); err != nil {
			t.Fatal(err)
		}
		outcomes := forOrders(t, first, n, func(order int64) (pauseOutcome, error) { return r.pauseOrder(ctx, t, "guard", order) })
		for _, o := range outcomes {
			checkTokens(t, o)
			if o.aSaid != "stale "+fenced.GuardSQLState {
				t.Errorf("order %d: A said %q after waking up, want the guard's refusal (stale %s)", o.order, o.aSaid, fenced.GuardSQLState)
			}
			var (
				status, worker string
				charges        int
				token          int64
			)
			if err := r.pool.QueryRow(ctx, `SELECT status, worker, charges, fence_token FROM payments WHERE order_id = $1`, o.order).
				Scan(&status, &worker, &charges, &token); err != nil {
				t.Fatal(err)
			}
			if status != "charged" || worker != "B" || charges != 1 || token != o.b.token {
				t.Errorf("order %d: payment is %s by %s, %d charges, fence token %d; want charged once by B with token %d",
					o.order, status, worker, charges, token, o.b.token)
			}
		}
	})
}
