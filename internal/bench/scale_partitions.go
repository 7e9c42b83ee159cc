package bench

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/internal/dbarg"
	"github.com/pgcoord/pgcoord/internal/dbsqlc"
)

// scale.partition_rebalance.N: what a partition group's rebalance costs per partition
// (issue 31: 10,000 partitions over 100 members at 0.5 or more of 64 over 5, per
// partition). Setup loads a group of N partitions and its members (rebalanceShape) as rows,
// plans it (pgcoord_partition_rebalance) and heartbeats each member once, so that every
// partition is granted to its planned owner. The members are synthetic: the op drives them
// through the SQL API, as their processes would, with the calls a membership change needs
// — the re-plan, the releases of what moves and the grants — and no more (members of
// package partition also heartbeat when a notification wakes them, with nothing to do;
// that is left out). One op, on the worker's connection to the size's schema:
//
//	a new member joins: pgcoord_partition_heartbeat with p_join, which re-plans and gives
//	   it its quota, taken from the others (sticky: nothing else moves);
//	one read lists, by holder, the partitions planned for it (through the target index):
//	   the revokes that the holders' heartbeats would return;
//	each of those holders heartbeats once, releasing them;
//	the new member heartbeats and is granted them all;
//	it leaves (pgcoord_partition_leave), which releases them and re-plans: they go back to
//	   the members now below their quota;
//	one read lists, by planned owner, where they went (primary key lookups);
//	each of those members heartbeats once and is granted them: the group is as loaded.
//
// An op counts as N operations (setUnits), so ops/s is partitions per second of a join
// and a leave, and the ratio to the smallest size is the cost per partition's.

const (
	rebalanceGroup  = "bench"
	rebalanceJoiner = "joiner"
	rebalanceTTL    = time.Hour // no member's lease runs out during a bench
)

// rebalanceMembers is how many members scale.partition_rebalance.N loads, by N.
var rebalanceMembers = map[int]int{64: 5, 10000: 100}

// rebalanceShape returns how many partitions and members scale.partition_rebalance.n
// loads: n over rebalanceMembers[n]; in tests (the small tables of scaleDivisor > 1), n/100
// (at least 8) over a tenth as many members (at least 2), so that a join still moves some.
func rebalanceShape(n int) (partitions, members int) {
	m := rebalanceMembers[n]
	if scaleDivisor == 1 {
		return n, m
	}
	return max(8, n/100), max(2, m/10)
}

func init() {
	scaleFamily{
		name: "partition_rebalance", sizes: []int{64, 10000}, unscaled: true, maxConcurrency: 1,
		unitOf: func(n int) string { return fmt.Sprintf("partitions over %d members", rebalanceMembers[n]) },
		what: "a member joins a partition group whose partitions are all granted, through the SQL API: its heartbeat " +
			"re-plans, each member that must give it partitions heartbeats once releasing them, it heartbeats and is " +
			"granted them; then it leaves (a re-plan) and each member given its partitions heartbeats once and is granted " +
			"them; ops/s counts each op as the group's partitions (partitions rebalanced per second, by a join and a leave)",
		load: loadPartitionGroup, newOp: newScaleRebalanceOp,
	}.register()
}

// loadPartitionGroup creates the group of size n's shape and its members, plans it and
// grants every partition.
func loadPartitionGroup(ctx context.Context, pool *pgxpool.Pool, n int) error {
	parts, members := rebalanceShape(n)
	if _, err := partitionQueries.PartitionCreate(ctx, pool, dbsqlc.PartitionCreateParams{
		GroupName: rebalanceGroup, Partitions: int32(parts),
	}); err != nil {
		return fmt.Errorf("create the group: %w", err)
	}
	if _, err := pool.Exec(ctx, `
		INSERT INTO pgcoord_partition_members (group_name, member, weight, joined_at, expires_at)
		SELECT $1, 'member-' || lpad(g::text, 3, '0'), 1, pgcoord_now(), pgcoord_now() + $3::interval
		  FROM generate_series(1, $2::int) g`, rebalanceGroup, members, dbarg.Interval(rebalanceTTL)); err != nil {
		return fmt.Errorf("load pgcoord_partition_members: %w", err)
	}
	if _, err := partitionQueries.PartitionRebalance(ctx, pool, dbsqlc.PartitionRebalanceParams{
		GroupName: rebalanceGroup, Actor: "pgcoord bench",
	}); err != nil {
		return fmt.Errorf("plan the group: %w", err)
	}
	for i := 1; i <= members; i++ {
		if _, err := rebalanceBeat(ctx, pool, fmt.Sprintf("member-%03d", i), nil, false); err != nil {
			return fmt.Errorf("grant the partitions: %w", err)
		}
	}
	var granted int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pgcoord_partitions WHERE group_name = $1 AND holder = target`,
		rebalanceGroup).Scan(&granted); err != nil {
		return err
	}
	if granted != parts {
		return fmt.Errorf("%d of the %d partitions granted to their planned owners after loading", granted, parts)
	}
	_, err := pool.Exec(ctx, `ANALYZE pgcoord_partition_groups, pgcoord_partition_members, pgcoord_partitions`)
	return err
}

// rebalanceBeat is a heartbeat of member, releasing release.
func rebalanceBeat(ctx context.Context, db dbsqlc.DBTX, member string, release []int32, join bool) (dbsqlc.PartitionHeartbeatRow, error) {
	if release == nil {
		release = []int32{}
	}
	r, err := partitionQueries.PartitionHeartbeat(ctx, db, dbsqlc.PartitionHeartbeatParams{
		GroupName: rebalanceGroup, Member: member, Weight: 1, Ttl: dbarg.Interval(rebalanceTTL),
		Release: release, Joining: join,
	})
	if err != nil {
		return r, fmt.Errorf("heartbeat of %s: %w", member, err)
	}
	return r, nil
}

// memberPartitions is a member and some partitions of the group.
type memberPartitions struct {
	member     string // "" for none
	partitions []int32
}

// byMember runs a query listing members and arrays of partitions.
func byMember(ctx context.Context, db dbsqlc.DBTX, sql string, args ...any) ([]memberPartitions, error) {
	rows, err := db.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (memberPartitions, error) {
		var mp memberPartitions
		err := row.Scan(&mp.member, &mp.partitions)
		return mp, err
	})
}

func newScaleRebalanceOp(_ Worker, n int) scaleOp {
	parts, _ := rebalanceShape(n)
	return func(ctx context.Context, pool *pgxpool.Pool) error {
		if err := rebalance(ctx, pool); err != nil {
			return fmt.Errorf("bench: scale.partition_rebalance: %w", err)
		}
		setUnits(ctx, int64(parts))
		return nil
	}
}

// rebalance is one op of scale.partition_rebalance: a join, then a leave.
func rebalance(ctx context.Context, db dbsqlc.DBTX) error {
	if _, err := rebalanceBeat(ctx, db, rebalanceJoiner, nil, true); err != nil {
		return fmt.Errorf("join: %w", err)
	}
	moves, err := byMember(ctx, db, `
		SELECT coalesce(holder, ''), array_agg(partition ORDER BY partition) FROM pgcoord_partitions
		 WHERE group_name = $1 AND target = $2 AND holder IS DISTINCT FROM $2
		 GROUP BY holder ORDER BY holder`, rebalanceGroup, rebalanceJoiner)
	if err != nil {
		return fmt.Errorf("read the moves: %w", err)
	}
	var planned []int32
	for _, mv := range moves {
		if mv.member == "" {
			return fmt.Errorf("partitions %v were free, but every partition was granted", mv.partitions)
		}
		r, err := rebalanceBeat(ctx, db, mv.member, mv.partitions, false)
		if err != nil {
			return err
		}
		if len(r.Revoke) != 0 || slices.ContainsFunc(mv.partitions, func(p int32) bool { return slices.Contains(r.Owned, p) }) {
			return fmt.Errorf("%s released %v and still holds %v, revoke %v", mv.member, mv.partitions, r.Owned, r.Revoke)
		}
		planned = append(planned, mv.partitions...)
	}
	if len(planned) == 0 {
		return fmt.Errorf("the join of %s moved no partition", rebalanceJoiner)
	}
	slices.Sort(planned)
	r, err := rebalanceBeat(ctx, db, rebalanceJoiner, nil, false)
	if err != nil {
		return err
	}
	if !slices.Equal(r.Owned, planned) {
		return fmt.Errorf("%s was granted %v, want %v", rebalanceJoiner, r.Owned, planned)
	}

	left, err := partitionQueries.PartitionLeave(ctx, db, dbsqlc.PartitionLeaveParams{GroupName: rebalanceGroup, Member: rebalanceJoiner})
	if err != nil {
		return fmt.Errorf("leave: %w", err)
	}
	if int(left) != len(planned) {
		return fmt.Errorf("%s left holding %d partitions, want %d", rebalanceJoiner, left, len(planned))
	}
	back, err := byMember(ctx, db, `
		SELECT coalesce(target, ''), array_agg(partition ORDER BY partition) FROM pgcoord_partitions
		 WHERE group_name = $1 AND partition = ANY ($2)
		 GROUP BY target ORDER BY target`, rebalanceGroup, planned)
	if err != nil {
		return fmt.Errorf("read the moves: %w", err)
	}
	for _, mv := range back {
		if mv.member == "" {
			return fmt.Errorf("partitions %v planned to no member after %s left", mv.partitions, rebalanceJoiner)
		}
		r, err := rebalanceBeat(ctx, db, mv.member, nil, false)
		if err != nil {
			return err
		}
		if slices.ContainsFunc(mv.partitions, func(p int32) bool { return !slices.Contains(r.Owned, p) }) {
			return fmt.Errorf("%s holds %v, was planned %v", mv.member, r.Owned, mv.partitions)
		}
	}
	return nil
}
