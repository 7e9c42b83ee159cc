package integration_test

import (
	"testing"
	"time"

	"github.com/pgcoord/pgcoord/leases"
	"github.com/pgcoord/pgcoord/semaphore"
	"github.com/pgcoord/pgcoord/singleton"
)

// TestFailoverAsyncLostGrant shows the hazard of asynchronous replication and the timeline
// floor that defuses it: grants the old primary acknowledged but never sent to the standby
// are lost in the failover, so the promoted standby's counters are behind the tokens their
// holders carry — its next grants would repeat them — yet the tokens it issues are higher,
// because they start at the new timeline's floor.
func TestFailoverAsyncLostGrant(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pair := startReplicaPair(t, replicaPairOpts{})
	primary := pair.primary.pool("pgcoord-failover-primary")
	if floor := tokenFloor(t, primary); floor != 0 {
		t.Fatalf("pgcoord_token_floor() on timeline 1 is %d, want 0 (tokens unchanged)", floor)
	}

	// Grants the standby receives.
	l, err := leases.TryAcquire(ctx, primary, "report", time.Hour, &leases.AcquireOpts{Holder: "worker-a"})
	if err != nil {
		t.Fatal(err)
	}
	if err := leases.Release(ctx, primary, l, nil); err != nil {
		t.Fatal(err)
	}
	p, err := semaphore.TryAcquire(ctx, primary, "tenant", 1, time.Hour, &semaphore.AcquireOpts{Holder: "worker-a"})
	if err != nil {
		t.Fatal(err)
	}
	if err := semaphore.Release(ctx, primary, p); err != nil {
		t.Fatal(err)
	}
	standby := pair.standby.pool("pgcoord-failover-standby")
	pair.waitReplayed(primary, standby)
	standby.Close()

	// Grants it never receives: they commit on the primary and are acknowledged to their
	// holders, and then the primary crashes.
	pair.standby.stop("fast")
	lostLease, err := leases.TryAcquire(ctx, primary, "report", time.Hour, &leases.AcquireOpts{Holder: "worker-b"})
	if err != nil {
		t.Fatal(err)
	}
	lostPermit, err := semaphore.TryAcquire(ctx, primary, "tenant", 1, time.Hour, &semaphore.AcquireOpts{Holder: "worker-b"})
	if err != nil {
		t.Fatal(err)
	}
	lostRun, err := singleton.ClaimTick(ctx, primary, hourlyJob, &singleton.ClaimOpts{Holder: "worker-b"})
	if err != nil {
		t.Fatal(err)
	}
	pair.primary.stop("immediate")
	pair.standby.start()
	pair.standby.promote()
	promoted := pair.standby.pool("pgcoord-failover-promoted")

	// The hazard: the promoted standby never saw those grants. Its rows still carry the
	// older grants' tokens, below the ones worker-b holds, and the token sequence's own
	// state is only as recent as the last of its WAL records the standby replayed: counting
	// on from what the standby knows could issue worker-b's tokens again.
	info, err := leases.Get(ctx, promoted, "report")
	if err != nil {
		t.Fatal(err)
	}
	if info.Held() || info.Token != l.Token || info.Token >= lostLease.Token {
		t.Fatalf("the promoted standby's lease is %+v; want it free, with worker-a's token %d below the lost token %d", info, l.Token, lostLease.Token)
	}
	var semToken int64
	if err := promoted.QueryRow(ctx, `SELECT fence_token FROM pgcoord_semaphores WHERE key = 'tenant'`).Scan(&semToken); err != nil {
		t.Fatal(err)
	}
	if semToken != p.Token || semToken >= lostPermit.Token {
		t.Fatalf("the promoted standby's semaphore token is %d; want worker-a's %d, below the lost permit's token %d", semToken, p.Token, lostPermit.Token)
	}
	runs, err := singleton.ListRuns(ctx, promoted, hourlyJob.Name, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(runs) != 0 {
		t.Fatalf("the promoted standby knows runs %+v; the claim should have been lost", runs)
	}

	// The floor: the promoted standby is on timeline 2, and every token it issues is higher
	// than every token timeline 1 issued, lost ones included.
	if floor := tokenFloor(t, promoted); floor != timeline2Floor {
		t.Fatalf("pgcoord_token_floor() after promotion is %d, want %d (timeline 2)", floor, timeline2Floor)
	}
	newLease, err := leases.TryAcquire(ctx, promoted, "report", time.Hour, &leases.AcquireOpts{Holder: "worker-c"})
	if err != nil {
		t.Fatal(err)
	}
	newPermit, err := semaphore.TryAcquire(ctx, promoted, "tenant", 1, time.Hour, &semaphore.AcquireOpts{Holder: "worker-c"})
	if err != nil {
		t.Fatal(err)
	}
	newRun, err := singleton.ClaimTick(ctx, promoted, hourlyJob, &singleton.ClaimOpts{Holder: "worker-c"})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		what      string
		lost, got int64
	}{
		{"lease", lostLease.Token, newLease.Token},
		{"permit", lostPermit.Token, newPermit.Token},
		{"run", lostRun.Token, newRun.Token},
	} {
		if c.got <= c.lost || c.got <= timeline2Floor || c.got >= 2*timeline2Floor {
			t.Errorf("%s: the promoted standby issued token %d after the lost %d; want one above the floor %d of timeline 2",
				c.what, c.got, c.lost, timeline2Floor)
		}
	}
	if !(newLease.Token < newPermit.Token && newPermit.Token < newRun.Token) {
		t.Errorf("tokens issued in turn after the promotion: %d, %d, %d; want increasing", newLease.Token, newPermit.Token, newRun.Token)
	}

	// Counting goes on above the floor.
	if err := leases.Release(ctx, promoted, newLease, nil); err != nil {
		t.Fatal(err)
	}
	again, err := leases.TryAcquire(ctx, promoted, "report", time.Hour, nil)
	if err != nil || again.Token <= newRun.Token {
		t.Fatalf("the grant after %d: token %d (%v), want a higher one", newRun.Token, again.Token, err)
	}
}
