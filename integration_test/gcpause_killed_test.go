//go:build unix

package integration_test

import (
	"errors"
	"fmt"
	"os/exec"
	"syscall"
	"testing"
)

// TestGCPauseKilledHolder is the crash: A is killed (SIGKILL) while it holds the lease and
// never releases it. B, started at once, waits in leases.Acquire and is granted the lease,
// with a higher token, no earlier than A's grant expired by the database clock and within a
// bound; it charges exactly once.
func TestGCPauseKilledHolder(t *testing.T) {
	t.Parallel()
	r := newGCPauseRig(t)
	ctx := t.Context()
	n := 6
	if testing.Short() {
		n = 2
	}
	type outcome struct {
		order int64
		a, b  grant
	}
	outcomes := forOrders(t, 4000, n, func(order int64) (outcome, error) {
		o := outcome{order: order}
		a, err := r.start(t, "A", "fenced", "try", order)
		if err != nil {
			return o, err
		}
		if o.a, err = acquired(a); err != nil {
			return o, err
		}
		if err := a.Signal(syscall.SIGKILL); err != nil {
			return o, err
		}
		var exit *exec.ExitError
		if err := a.Wait(gcpauseStep); !errors.As(err, &exit) || exit.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
			return o, fmt.Errorf("worker %s: exit %v, want killed by SIGKILL", a.Name(), err)
		}
		// B waits (bounded by WAIT inside the worker) for a lease nobody will release.
		b, err := r.start(t, "B", "fenced", "wait", order)
		if err != nil {
			return o, err
		}
		if o.b, err = acquired(b); err != nil {
			return o, err
		}
		if err := b.Send("go"); err != nil {
			return o, err
		}
		if _, err := b.Expect(gcpauseStep, "charged"); err != nil {
			return o, err
		}
		return o, b.Wait(gcpauseStep)
	})
	for _, o := range outcomes {
		if o.b.token <= o.a.token {
			t.Errorf("order %d: B's token %d is not higher than the killed holder's %d", o.order, o.b.token, o.a.token)
		}
		if o.b.acquiredAt.Before(o.a.expiresAt) {
			t.Errorf("order %d: B was granted at %v, before the killed holder's grant expired at %v", o.order, o.b.acquiredAt, o.a.expiresAt)
		}
		got := chargesOf(ctx, t, r.pool, o.order)
		if len(got) != 1 || got[0] != (charge{"B", o.b.token}) {
			t.Errorf("order %d: charges %v, want exactly one, by B with token %d", o.order, got, o.b.token)
		}
	}
}
