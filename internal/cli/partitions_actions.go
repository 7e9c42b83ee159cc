package cli

import (
	"fmt"
	"strconv"

	"github.com/jackc/pgx/v5"
	"github.com/spf13/cobra"

	"github.com/pgcoord/pgcoord/partition"
)

// rebalanceJSON is `partitions rebalance --json`.
type rebalanceJSON struct {
	Group   string `json:"group"`
	Changed bool   `json:"changed"`
}

func (a *app) partitionsRebalanceCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "rebalance GROUP",
		Short: "Recompute a partition group's plan now, forgetting members whose lease expired",
		Long: `Recompute the plan of the partition group GROUP now, as the next heartbeat of a member would:
members whose lease expired are forgotten, and their partitions go to the live members.
Members keep what they hold up to their share, so a balanced group does not move. It says
whether the plan changed. An unknown group is an error (exit 1). Audited.

With --json: {"group", "changed"}.`,
		Example: `  pgcoord partitions rebalance orders`,
		Args:    exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			pool, err := a.connect(ctx)
			if err != nil {
				return err
			}
			defer pool.Close()
			changed, err := partition.Rebalance(ctx, pool, args[0], a.actorName())
			if err != nil {
				return argError(err)
			}
			if a.json {
				return a.printJSON(rebalanceJSON{Group: args[0], Changed: changed})
			}
			if changed {
				fmt.Fprintf(a.out, "group %q rebalanced: the plan changed; partitions move as their holders release them\n", args[0])
			} else {
				fmt.Fprintf(a.out, "group %q rebalanced: the plan was balanced already, nothing moves\n", args[0])
			}
			return nil
		},
	}
}

// resizeJSON is `partitions resize --json`.
type resizeJSON struct {
	DryRun  bool      `json:"dry_run"`
	Changed bool      `json:"changed"`
	From    int       `json:"from"`
	To      int       `json:"to"`
	Group   groupJSON `json:"group"`
}

func (a *app) partitionsResizeCommand() *cobra.Command {
	var dryRun bool
	cmd := &cobra.Command{
		Use:   "resize GROUP N [--dry-run]",
		Short: "Change a partition group's partition count to N (1 to 65536): every grant is revoked",
		Long: fmt.Sprintf(`Change the partition count of the group GROUP to N (1 to %d). The group's epoch goes up
and every grant is revoked; no partition is granted under the new count while a grant under
the old one lasts, so no key is served under two counts at once (a key's partition depends
on the count: partition.KeyPartition). Until the members have released their partitions
(or their grants expired), nothing is owned. Resizing to the present count changes
nothing. An unknown group exits 1; N outside 1..%d exits 2. Audited.

--dry-run reads the group and says what would change, changing nothing. With --json:
{"dry_run", "changed", "from", "to", "group"}, group as in 'partitions list --json'
(afterwards; before, with --dry-run).`, partition.MaxPartitions, partition.MaxPartitions),
		Example: `  pgcoord partitions resize orders 128 --dry-run
  pgcoord partitions resize orders 128`,
		Args: exactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			n, err := strconv.Atoi(args[1])
			if err != nil || n < 1 || n > partition.MaxPartitions {
				return usagef("partition count %q: want a whole number from 1 to %d", args[1], partition.MaxPartitions)
			}
			pool, err := a.connect(ctx)
			if err != nil {
				return err
			}
			defer pool.Close()
			var before, after partition.Group
			err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				var err error
				if before, err = partition.GetGroup(ctx, tx, args[0]); err != nil || dryRun {
					after = before
					return err
				}
				after, err = partition.Resize(ctx, tx, args[0], n, a.actorName())
				return err
			})
			if err != nil {
				return argError(err)
			}
			changed := before.Partitions != n
			if a.json {
				return a.printJSON(resizeJSON{DryRun: dryRun, Changed: changed && !dryRun, From: before.Partitions, To: n, Group: toGroupJSON(after)})
			}
			switch {
			case !changed:
				fmt.Fprintf(a.out, "group %q has %d partitions already: nothing changed\n", args[0], n)
			case dryRun:
				fmt.Fprintf(a.out, "would resize group %q from %d to %d partitions (epoch %d): every grant of its %d live members is revoked, and none is made under the new count until they are released or expired\nnothing changed (--dry-run)\n",
					args[0], before.Partitions, n, before.Epoch+1, before.Members)
			default:
				fmt.Fprintf(a.out, "group %q resized from %d to %d partitions (epoch %d): every grant is revoked; partitions are granted under the new count once the old grants are released or expired\n",
					args[0], before.Partitions, n, after.Epoch)
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "say what would change, change nothing")
	return cmd
}

// drainJSON is `partitions drain --json`.
type drainJSON struct {
	DryRun bool   `json:"dry_run"`
	Group  string `json:"group"`
	Member string `json:"member"`
	// Holds are the partitions the member held when it was drained: they move.
	Holds []int `json:"holds"`
	// OtherLiveMembers counts the live members that are not draining, which take them.
	OtherLiveMembers int `json:"other_live_members"`
	// AlreadyDraining says that the member was draining already: nothing changed.
	AlreadyDraining bool `json:"already_draining"`
}

func (a *app) partitionsDrainCommand() *cobra.Command {
	var dryRun bool
	cmd := &cobra.Command{
		Use:   "drain GROUP MEMBER [--dry-run]",
		Short: "Move every partition away from a live member (before a deploy); it gets none until it joins again",
		Long: `Drain the member MEMBER of the partition group GROUP: the plan gives it nothing until its
process joins the group again (a restart), and each partition it holds is revoked (its
OnRevoke runs) and granted to another live member once released. Use it before stopping a
member on purpose. Draining the last live member leaves the partitions without an owner
(a warning says so); draining a member that drains already changes nothing. An unknown
group, or a member that is not live in it, is an error (exit 1). Audited.

--dry-run says what would move, changing nothing; it exits as the real command would. With
--json: {"dry_run", "group", "member", "holds", "other_live_members", "already_draining"}.`,
		Example: `  pgcoord partitions drain orders worker-7 --dry-run
  pgcoord partitions drain orders worker-7`,
		Args: exactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			group, member := args[0], args[1]
			if err := check.Name("member", member); err != nil {
				return usageError{err}
			}
			pool, err := a.connect(ctx)
			if err != nil {
				return err
			}
			defer pool.Close()
			// What it holds and who takes it, read before: the drain revokes, it does not
			// release, so the same partitions move.
			v, err := readGroup(ctx, pool, group, true)
			if err != nil {
				return err
			}
			js := drainJSON{DryRun: dryRun, Group: group, Member: member, Holds: []int{}}
			var target *partition.GroupMember
			for i, m := range v.members {
				switch {
				case m.Name == member && m.Live:
					target = &v.members[i]
				case m.Live && m.Draining.IsZero():
					js.OtherLiveMembers++
				}
			}
			if target == nil {
				return fmt.Errorf("member %q is not live in group %q: nothing drained", member, group)
			}
			for _, s := range v.parts {
				if s.Holder == member {
					js.Holds = append(js.Holds, s.ID)
				}
			}
			if !target.Draining.IsZero() { // draining it again would change nothing but be audited
				js.AlreadyDraining = true
				if a.json {
					return a.printJSON(js)
				}
				fmt.Fprintf(a.out, "member %q of group %q is draining already (since %s, by %s): nothing changed\n",
					member, group, preciseTime(target.Draining), dash(target.DrainedBy))
				return nil
			}
			if !dryRun {
				drained, err := partition.Drain(ctx, pool, group, member, a.actorName())
				if err != nil {
					return argError(err)
				}
				if !drained { // its lease ran out meanwhile
					return fmt.Errorf("member %q is not live in group %q: nothing drained", member, group)
				}
			}
			if js.OtherLiveMembers == 0 {
				fmt.Fprintf(a.errOut, "pgcoord: warning: group %q has no other live member: %q's partitions stay without an owner until another member joins\n",
					group, member)
			}
			if a.json {
				return a.printJSON(js)
			}
			if dryRun {
				fmt.Fprintf(a.out, "would drain member %q of group %q: the %d partition(s) it holds (%s) move to the %d other live member(s)\nnothing changed (--dry-run)\n",
					member, group, len(js.Holds), ranges(js.Holds), js.OtherLiveMembers)
				return nil
			}
			fmt.Fprintf(a.out, "member %q of group %q drained: the %d partition(s) it holds (%s) move to the %d other live member(s) as it releases them; it gets none until it joins again\n",
				member, group, len(js.Holds), ranges(js.Holds), js.OtherLiveMembers)
			return nil
		},
	}
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "say what would move, change nothing")
	return cmd
}
