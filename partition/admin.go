package partition

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgcoord/pgcoord/internal/dbsqlc"
	"github.com/pgcoord/pgcoord/pgcoord"
)

// Group is a partition group as Groups lists it.
type Group struct {
	Name       string
	Partitions int
	// Epoch counts the group's sizes (a resize adds one), Generation its plans.
	Epoch, Generation int64
	// Members is how many members are live, Unowned how many partitions have no live grant.
	Members, Unowned int
	// UnownedFor is how long the partition longest without a live grant has been without
	// one (since it was released, or since its grant lapsed), by the database clock; zero
	// when every partition has one.
	UnownedFor time.Duration
	// Grants counts the grants made to the group's partitions so far (each move is one;
	// partitions dropped by a resize down take theirs along).
	Grants           int64
	Created, Updated time.Time
	// DBNow is the database clock's time of the read.
	DBNow time.Time
}

// GroupMember is a member of a group as Members lists it.
type GroupMember struct {
	Name    string
	Weight  int
	Joined  time.Time
	Expires time.Time
	// Live says whether its lease runs, by the database clock.
	Live bool
	// Draining, if not zero, is when it was drained, and DrainedBy by whom.
	Draining  time.Time
	DrainedBy string
	// Owns is how many partitions it holds, Planned how many the plan gives it.
	Owns, Planned int
}

// State is one partition of a group as List reports it.
type State struct {
	ID int
	// Target is the member the plan gives it to ("" when none); Holder the member that
	// holds it now ("" when free), under Token until Expires.
	Target, Holder string
	Token          int64
	Epoch          int64
	Acquired       time.Time
	Expires        time.Time
	// FreeSince is when it last lost its grant (zero while held); Grants counts its grants.
	FreeSince time.Time
	Grants    int64
}

// Groups lists up to limit groups (0: 100) after the name after, in name order.
func Groups(ctx context.Context, db pgcoord.DBTX, after string, limit int) ([]Group, error) {
	if err := check.DB(db); err != nil {
		return nil, err
	}
	n, err := check.ListLimit(limit)
	if err != nil {
		return nil, err
	}
	rows, err := queries.PartitionGroups(ctx, db, dbsqlc.PartitionGroupsParams{After: after, MaxRows: n})
	if err != nil {
		return nil, fmt.Errorf("partition: list groups: %w", translate(err))
	}
	gs := make([]Group, len(rows))
	for i, r := range rows {
		gs[i] = toGroup(dbsqlc.PartitionGroupRow(r))
	}
	return gs, nil
}

// GetGroup returns the group named group as Groups lists it: ErrUnknownGroup when there is
// none.
func GetGroup(ctx context.Context, db pgcoord.DBTX, group string) (Group, error) {
	if err := checkGroup(db, group); err != nil {
		return Group{}, err
	}
	r, err := queries.PartitionGroup(ctx, db, group)
	if errors.Is(err, pgx.ErrNoRows) {
		return Group{}, fmt.Errorf("%w: %q", ErrUnknownGroup, group)
	}
	if err != nil {
		return Group{}, fmt.Errorf("partition: group %q: %w", group, translate(err))
	}
	return toGroup(r), nil
}

func toGroup(r dbsqlc.PartitionGroupRow) Group {
	return Group{Name: r.Name, Partitions: int(r.Partitions), Epoch: r.Epoch, Generation: r.Generation,
		Members: int(r.Members), Unowned: int(r.Unowned), UnownedFor: time.Duration(r.UnownedSeconds * float64(time.Second)),
		Grants: r.Grants, Created: r.CreatedAt, Updated: r.UpdatedAt, DBNow: r.DbNow}
}

// Members lists the members of group, live or not yet forgotten, in name order.
func Members(ctx context.Context, db pgcoord.DBTX, group string) ([]GroupMember, error) {
	if err := checkGroup(db, group); err != nil {
		return nil, err
	}
	rows, err := queries.PartitionMembers(ctx, db, group)
	if err != nil {
		return nil, fmt.Errorf("partition: members of %q: %w", group, translate(err))
	}
	ms := make([]GroupMember, len(rows))
	for i, r := range rows {
		ms[i] = GroupMember{Name: r.Member, Weight: int(r.Weight), Joined: r.JoinedAt, Expires: r.ExpiresAt,
			Live: r.ExpiresAt.After(r.DbNow), Owns: int(r.Owns), Planned: int(r.Planned)}
		if r.DrainingAt != nil {
			ms[i].Draining = *r.DrainingAt
		}
		if r.DrainingBy != nil {
			ms[i].DrainedBy = *r.DrainingBy
		}
	}
	return ms, nil
}

// List returns every partition of group, in order (those past a resize down until they
// are released, too).
func List(ctx context.Context, db pgcoord.DBTX, group string) ([]State, error) {
	if err := checkGroup(db, group); err != nil {
		return nil, err
	}
	rows, err := queries.PartitionList(ctx, db, group)
	if err != nil {
		return nil, fmt.Errorf("partition: partitions of %q: %w", group, translate(err))
	}
	ss := make([]State, len(rows))
	for i, r := range rows {
		s := State{ID: int(r.Partition), Token: r.FenceToken, Epoch: r.Epoch, Grants: r.Grants}
		if r.Target != nil {
			s.Target = *r.Target
		}
		if r.Holder != nil && r.ExpiresAt != nil && r.ExpiresAt.After(r.DbNow) {
			s.Holder, s.Expires = *r.Holder, *r.ExpiresAt
			if r.AcquiredAt != nil {
				s.Acquired = *r.AcquiredAt
			}
		}
		if r.FreeSince != nil {
			s.FreeSince = *r.FreeSince
		}
		ss[i] = s
	}
	return ss, nil
}

// Drain moves every partition away from a live member (before a deploy): the plan gives it
// nothing until it leaves or joins again, and its partitions are revoked and granted to the
// others. Audited with actor. It returns false when member is not live in group.
func Drain(ctx context.Context, db pgcoord.DBTX, group, member, actor string) (bool, error) {
	if err := checkGroup(db, group); err != nil {
		return false, err
	}
	if err := check.Name("member", member); err != nil {
		return false, err
	}
	ok, err := queries.PartitionDrain(ctx, db, dbsqlc.PartitionDrainParams{GroupName: group, Member: member, Actor: actor})
	if err != nil {
		return false, fmt.Errorf("partition: drain %q of %q: %w", member, group, translate(err))
	}
	return ok, nil
}

// Rebalance recomputes group's plan now, forgetting members whose lease expired (which the
// next heartbeat would do). Audited with actor. It says whether the plan changed.
func Rebalance(ctx context.Context, db pgcoord.DBTX, group, actor string) (bool, error) {
	if err := checkGroup(db, group); err != nil {
		return false, err
	}
	changed, err := queries.PartitionRebalance(ctx, db, dbsqlc.PartitionRebalanceParams{GroupName: group, Actor: actor})
	if err != nil {
		return false, fmt.Errorf("partition: rebalance %q: %w", group, translate(err))
	}
	return changed, nil
}

// Resize changes group's partition count to n (1 to MaxPartitions), audited with actor:
// every grant is revoked, and none is made under the new count while one under the old
// count lasts, so no key is served under both (see KeyPartition). It returns the group.
func Resize(ctx context.Context, db pgcoord.DBTX, group string, n int, actor string) (Group, error) {
	if err := checkGroup(db, group); err != nil {
		return Group{}, err
	}
	if n < 1 || n > MaxPartitions {
		return Group{}, check.Invalid("partition count %d is outside [1, %d]", n, MaxPartitions)
	}
	g, err := queries.PartitionResize(ctx, db, dbsqlc.PartitionResizeParams{GroupName: group, Partitions: int32(n), Actor: actor})
	if err != nil {
		return Group{}, fmt.Errorf("partition: resize %q: %w", group, translate(err))
	}
	return Group{Name: g.Name, Partitions: int(g.Partitions), Epoch: g.Epoch, Generation: g.Generation,
		Created: g.CreatedAt, Updated: g.UpdatedAt}, nil
}

func checkGroup(db pgcoord.DBTX, group string) error {
	if err := check.DB(db); err != nil {
		return err
	}
	if err := check.Name("group", group); err != nil {
		return err
	}
	if len(group) > MaxGroupLen {
		return check.InvalidName("group name is %d bytes, more than the maximum of %d", len(group), MaxGroupLen)
	}
	return nil
}
