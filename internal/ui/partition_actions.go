package ui

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"

	"github.com/jackc/pgx/v5"

	"github.com/pgcoord/pgcoord/partition"
)

// The partition actions call package partition with the operator as the actor: the SQL
// API writes the action's audit row itself (partitions.rebalance, partitions.drain), in the
// action's transaction, so the actions are marked audited.

// rebalancePartitions recomputes a group's plan now (partition.Rebalance).
func rebalancePartitions(ctx context.Context, tx pgx.Tx, _ *Server, form url.Values, actor string) (string, map[string]any, string, error) {
	group := form.Get("group")
	changed, err := partition.Rebalance(ctx, tx, group, actor)
	if errors.Is(err, partition.ErrUnknownGroup) {
		return "", nil, "", userErrorf(http.StatusNotFound, "no partition group %q", group)
	}
	if err != nil {
		return "", nil, "", err
	}
	if !changed {
		return group, nil, fmt.Sprintf("rebalanced partition group %q: the plan was balanced already, nothing moves", group), nil
	}
	return group, nil, fmt.Sprintf("rebalanced partition group %q: the plan changed; partitions move as their holders release them", group), nil
}

// drainPartitionMember moves every partition away from a live member (partition.Drain). A
// member that is not live is refused (404), and so is one draining already (409): draining
// it again would change nothing but be audited.
func drainPartitionMember(ctx context.Context, tx pgx.Tx, _ *Server, form url.Values, actor string) (string, map[string]any, string, error) {
	group, member := form.Get("group"), form.Get("member")
	if err := check.Name("member", member); err != nil {
		return "", nil, "", err
	}
	members, err := partition.Members(ctx, tx, group)
	if err != nil {
		return "", nil, "", err
	}
	var m *partition.GroupMember
	for i := range members {
		if members[i].Name == member && members[i].Live {
			m = &members[i]
		}
	}
	switch {
	case m == nil:
		return "", nil, "", userErrorf(http.StatusNotFound, "member %q is not live in partition group %q", member, group)
	case !m.Draining.IsZero():
		return "", nil, "", userErrorf(http.StatusConflict, "member %q of partition group %q is draining already, by %s", member, group, m.DrainedBy)
	}
	drained, err := partition.Drain(ctx, tx, group, member, actor)
	if errors.Is(err, partition.ErrUnknownGroup) {
		return "", nil, "", userErrorf(http.StatusNotFound, "no partition group %q", group)
	}
	if err != nil {
		return "", nil, "", err
	}
	if !drained { // its lease ran out meanwhile
		return "", nil, "", userErrorf(http.StatusNotFound, "member %q is not live in partition group %q", member, group)
	}
	return group, nil, fmt.Sprintf("drained member %q of partition group %q: its %d partition(s) move to the other live members as it releases them; it gets none until it joins again",
		member, group, m.Owns), nil
}

// partitionBack returns a partition action to the group's page.
func partitionBack(form url.Values) string { return partitionPath(form.Get("group")) }
