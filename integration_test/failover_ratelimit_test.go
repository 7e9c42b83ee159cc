//go:build unix

package integration_test

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/ratelimit"
)

// TestFailoverRatelimitUnloggedKeysReset shows what an unlogged rate limit policy gives up
// (docs/ratelimits.md): its keys are in an UNLOGGED table, which PostgreSQL empties when it
// recovers from a crash and which a standby does not have. On a primary with a streaming
// standby, a durable policy's key and an unlogged policy's key are both spent, and the
// standby has replayed it all. The standby
// reads the unlogged key as at rest (it has none of that table) while it is a standby.
// After the primary crashes and restarts, the durable key is still spent and the unlogged
// one is at rest: it admits a full burst again. The unlogged key spent again, a clean
// shutdown and restart keeps it spent. Then the primary crashes for good: on the promoted standby the same holds, and the unlogged policy itself (a logged
// row) is still there.
func TestFailoverRatelimitUnloggedKeysReset(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pair := startReplicaPair(t, replicaPairOpts{sync: true, syncCommit: "local"})
	primary := pair.primary.pool("pgcoord-failover-ratelimit")
	durable := ratelimit.Limit{Policy: "durable", Key: "k"}
	unlogged := ratelimit.Limit{Policy: "unlogged", Key: "k"}
	for _, p := range []ratelimit.Policy{
		{Name: "durable", Rate: 1, Period: time.Hour, Burst: 2},
		{Name: "unlogged", Rate: 1, Period: time.Hour, Burst: 2, Unlogged: true},
	} {
		if _, err := ratelimit.Set(ctx, primary, p); err != nil {
			t.Fatal(err)
		}
	}
	spend := func(pool *pgxpool.Pool, when string, limits ...ratelimit.Limit) {
		t.Helper()
		for _, l := range limits {
			for range 2 {
				if d, err := ratelimit.Allow(ctx, pool, 1, []ratelimit.Limit{l}, nil); err != nil || !d.Allowed {
					t.Fatalf("%s: spending %s: %+v, %v", when, l.Policy, d, err)
				}
			}
		}
	}
	// after checks, on pool, that the durable key is still spent and the unlogged one is at
	// rest again.
	after := func(pool *pgxpool.Pool, what string) {
		t.Helper()
		if d, err := ratelimit.Allow(ctx, pool, 1, []ratelimit.Limit{durable}, nil); err != nil || d.Allowed {
			t.Fatalf("after %s the durable key admitted a call (%+v, %v): its charges were lost", what, d, err)
		}
		st, err := ratelimit.State(ctx, pool, unlogged)
		if err != nil || st.Remaining != 2 {
			t.Fatalf("after %s the unlogged key admits %d (%v), want its full burst 2", what, st.Remaining, err)
		}
	}
	spend(primary, "before the crash", durable, unlogged)
	standby := pair.standby.pool("pgcoord-failover-ratelimit-standby")
	pair.waitReplayed(pair.primary.monitor(), standby)
	if st, err := ratelimit.State(ctx, standby, unlogged); err != nil || st.Remaining != 2 {
		t.Fatalf("on the standby the unlogged key reads %+v (%v), want at rest", st, err)
	}
	if ps, err := ratelimit.List(ctx, standby, nil); err != nil || len(ps) != 2 {
		t.Fatalf("listing the policies on the standby: %+v, %v", ps, err)
	}
	standby.Close()

	primary.Close()
	pair.primary.stop("immediate")
	pair.primary.start()
	restarted := pair.primary.pool("pgcoord-failover-ratelimit-restarted")
	after(restarted, "a crash and restart")
	pair.waitStreaming(true)
	spend(restarted, "after the restart", unlogged)
	restarted.Close()

	// A clean shutdown keeps the unlogged keys.
	pair.primary.stop("fast")
	pair.primary.start()
	restarted = pair.primary.pool("pgcoord-failover-ratelimit-clean-restart")
	if st, err := ratelimit.State(ctx, restarted, unlogged); err != nil || st.Remaining != 0 {
		t.Fatalf("after a clean restart the unlogged key admits %d (%v), want 0: still spent", st.Remaining, err)
	}
	pair.waitStreaming(true)
	standby = pair.standby.pool("pgcoord-failover-ratelimit-standby")
	pair.waitReplayed(pair.primary.monitor(), standby)
	standby.Close()
	restarted.Close()

	pair.primary.stop("immediate")
	pair.standby.promote()
	promoted := pair.standby.pool("pgcoord-failover-ratelimit-promoted")
	after(promoted, "a failover")
	if p, err := ratelimit.Get(ctx, promoted, "unlogged"); err != nil || !p.Unlogged {
		t.Fatalf("the unlogged policy after the failover: %+v, %v", p, err)
	}
}
