package leases_test

import (
	"testing"
	"time"

	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/leases"
)

// The grant commits, its reply is lost with the connection, and TryAcquire still returns
// the grant — by asking again as the same holder — instead of reporting the lease held by
// a stranger (itself) until the TTL runs out.
func TestAcquireRecoversAGrantWhoseReplyWasLost(t *testing.T) {
	t.Parallel()
	pool, dropper := pgtest.DropPool(t, "pgcoord_lease_acquire")
	dropper.Arm()
	l, err := leases.TryAcquire(ctx, pool, "payment:42", time.Minute, nil)
	if dropper.Dropped() != 1 {
		t.Fatalf("the fault was not injected (dropped %d replies): the test proves nothing", dropper.Dropped())
	}
	if err != nil {
		t.Fatalf("TryAcquire after a lost reply: %v", err)
	}
	info, err := leases.Get(ctx, pool, "payment:42")
	if err != nil || info.Holder != l.Holder || info.Token != l.Token {
		t.Fatalf("recovered grant %+v, lease row %+v (%v)", l, info, err)
	}
}

// The same for the blocking Acquire: its attempts run on the pool, one statement each, and
// an attempt whose grant committed but whose reply was lost is asked again at once, as the
// same holder, instead of failing the call.
func TestWaitingAcquireRecoversAGrantWhoseReplyWasLost(t *testing.T) {
	t.Parallel()
	pool, dropper := pgtest.DropPool(t, "pgcoord_lease_wait")
	dropper.Arm()
	l, err := leases.Acquire(ctx, pool, "payment:43", time.Minute, &leases.AcquireOpts{PollInterval: time.Minute})
	if dropper.Dropped() != 1 {
		t.Fatalf("the fault was not injected (dropped %d replies): the test proves nothing", dropper.Dropped())
	}
	if err != nil {
		t.Fatalf("Acquire after a lost reply: %v", err)
	}
	info, err := leases.Get(ctx, pool, "payment:43")
	if err != nil || info.Holder != l.Holder || info.Token != l.Token || !info.Held() {
		t.Fatalf("recovered grant %+v, lease row %+v (%v)", l, info, err)
	}
}
