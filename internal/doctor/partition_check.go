package doctor

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/internal/page"
	"github.com/pgcoord/pgcoord/partition"
	"github.com/pgcoord/pgcoord/pgcoord"
)

// partitionStuck is how long a partition of a group with live members may go without a
// live grant before it calls for attention: longer than a member's TTL plus its
// heartbeats, at the default TTL (partition.DefaultTTL).
const partitionStuck = 4 * partition.DefaultTTL

// checkPartitions reports the partition groups that have live members but a partition no
// member has held for longer than partitionStuck: work of those partitions is not done.
// Groups without a live member are listed, not judged (their application may be stopped).
func checkPartitions(ctx context.Context, pool *pgxpool.Pool, _ Options) Finding {
	groups, _, err := page.Collect(-1, pgcoord.MaxListLimit, func(last *partition.Group, n int) ([]partition.Group, error) {
		after := ""
		if last != nil {
			after = last.Name
		}
		return partition.Groups(ctx, pool, after, n)
	})
	if err != nil {
		return failed(err)
	}
	var now time.Time
	if err := pool.QueryRow(ctx, "SELECT pgcoord_now()").Scan(&now); err != nil {
		return failed(err)
	}
	var bad []string
	idle := 0
	for _, g := range groups {
		if g.Members == 0 {
			idle++
			continue
		}
		if g.Unowned == 0 {
			continue
		}
		states, err := partition.List(ctx, pool, g.Name)
		if err != nil {
			return failed(err)
		}
		var stuck []int
		for _, s := range states {
			if s.ID < g.Partitions && s.Holder == "" && !s.FreeSince.IsZero() && now.Sub(s.FreeSince) > partitionStuck {
				stuck = append(stuck, s.ID)
			}
		}
		if len(stuck) > 0 {
			bad = append(bad, fmt.Sprintf("%s (%d of %d partitions without an owner for over %v, e.g. %d; %d live members)",
				g.Name, len(stuck), g.Partitions, partitionStuck, stuck[0], g.Members))
		}
	}
	if len(bad) == 0 {
		return Finding{Status: OK, Summary: fmt.Sprintf("%d partition group(s), every partition of those with live members owned (%d without a live member)",
			len(groups), idle)}
	}
	return Finding{Status: Attention,
		Summary: fmt.Sprintf("%d partition group(s) with unowned partitions: %s", len(bad), list(bad)),
		Explain: "A partition is granted to the member the plan gives it to once it is free; one that stays free while " +
			"members are live waits for a release that does not come (a member.Check transaction left open holds the " +
			"partition's row), for members that are all drained, or for heartbeats that fail. See pgcoord partitions get GROUP: " +
			"the partition's target and holder, and the members' leases."}
}
