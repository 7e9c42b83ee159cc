package semaphore_test

import (
	"testing"
	"time"

	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/semaphore"
)

// The admission commits, its reply is lost with the connection, and TryAcquire still
// returns the permit — by asking again as the same holder — instead of ErrFull from a key
// whose only slot its own lost permit holds.
func TestTryAcquireRecoversAPermitWhoseReplyWasLost(t *testing.T) {
	t.Parallel()
	pool, dropper := pgtest.DropPool(t, "pgcoord_semaphore_acquire")
	dropper.Arm()
	p, err := semaphore.TryAcquire(ctx, pool, "tenant", 1, time.Minute, nil)
	if dropper.Dropped() != 1 {
		t.Fatalf("the fault was not injected (dropped %d replies): the test proves nothing", dropper.Dropped())
	}
	if err != nil {
		t.Fatalf("TryAcquire after a lost reply: %v", err)
	}
	infos, err := semaphore.Permits(ctx, pool, "tenant")
	if err != nil || len(infos) != 1 || infos[0].Holder != p.Holder || infos[0].Token != p.Token {
		t.Fatalf("recovered permit %+v, permits %+v (%v)", p, infos, err)
	}
}

// The same for a waiting Acquire: its connection dies with the reply of the admitting
// attempt, and it asks once more on another connection.
func TestAcquireRecoversAPermitWhoseReplyWasLost(t *testing.T) {
	t.Parallel()
	pool, dropper := pgtest.DropPool(t, "pgcoord_semaphore_acquire")
	dropper.Arm()
	p, err := semaphore.Acquire(ctx, pool, "tenant", 1, time.Minute, nil)
	if dropper.Dropped() != 1 {
		t.Fatalf("the fault was not injected (dropped %d replies): the test proves nothing", dropper.Dropped())
	}
	if err != nil {
		t.Fatalf("Acquire after a lost reply: %v", err)
	}
	if s := mustGet(t, pool, "tenant"); s.Held != 1 || s.Token != p.Token || s.Waiters != 0 {
		t.Fatalf("recovered permit %+v, status %+v", p, s)
	}
}

// The same for Next: its admission commits, the reply is lost, and it asks again as the
// same holder and gets its own permit back — not a second permit, which would reserve a
// second unit of demand.
func TestNextRecoversAPermitWhoseReplyWasLost(t *testing.T) {
	t.Parallel()
	pool, dropper := pgtest.DropPool(t, "pgcoord_semaphore_next")
	if err := semaphore.AddDemand(ctx, pool, "tenant", 5, &semaphore.AddDemandOpts{Limit: 5}); err != nil {
		t.Fatal(err)
	}
	dropper.Arm()
	p, err := semaphore.Next(ctx, pool, time.Minute, nil)
	if dropper.Dropped() != 1 {
		t.Fatalf("the fault was not injected (dropped %d replies): the test proves nothing", dropper.Dropped())
	}
	if err != nil {
		t.Fatalf("Next after a lost reply: %v", err)
	}
	infos, err := semaphore.Permits(ctx, pool, "tenant")
	if err != nil || len(infos) != 1 || infos[0].Holder != p.Holder || infos[0].Token != p.Token || !infos[0].Reserved {
		t.Fatalf("recovered permit %+v, permits %+v (%v)", p, infos, err)
	}
}
