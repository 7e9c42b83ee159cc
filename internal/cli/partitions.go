package cli

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/pgcoord/pgcoord/internal/base"
	"github.com/pgcoord/pgcoord/internal/page"
	"github.com/pgcoord/pgcoord/partition"
	"github.com/pgcoord/pgcoord/pgcoord"
)

func (a *app) partitionsCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "partitions",
		Short: "Operate partition groups: M partitions spread over the live members, each owned by one",
		Long: `Operate pgcoord's partition groups (package partition): a group's M partitions spread over
whichever of its members are alive, balanced by weight and sticky, each partition granted to
one member at a time under a fence token of its own. The plan (which member each partition
goes to) is computed in the database whenever the membership changes; a partition moves
only after its holder released it or its grant expired. Every change (rebalance, resize,
drain) is audited (--actor names who makes it).`,
	}
	cmd.AddCommand(a.partitionsListCommand(), a.partitionsGetCommand(), a.partitionsMembersCommand(),
		a.partitionsRebalanceCommand(), a.partitionsResizeCommand(), a.partitionsDrainCommand())
	return cmd
}

// groupJSON is a group in `partitions list --json` and the other verbs' --json.
type groupJSON struct {
	Name           string  `json:"name"`
	Partitions     int     `json:"partitions"`
	Epoch          int64   `json:"epoch"`
	Generation     int64   `json:"generation"`
	LiveMembers    int     `json:"live_members"`
	Unowned        int     `json:"unowned"`
	UnownedSeconds float64 `json:"unowned_seconds"`
	Grants         int64   `json:"grants"`
	CreatedAt      *string `json:"created_at"`
	UpdatedAt      *string `json:"updated_at"`
	DBNow          *string `json:"db_now"`
}

func toGroupJSON(g partition.Group) groupJSON {
	return groupJSON{Name: g.Name, Partitions: g.Partitions, Epoch: g.Epoch, Generation: g.Generation,
		LiveMembers: g.Members, Unowned: g.Unowned, UnownedSeconds: g.UnownedFor.Seconds(), Grants: g.Grants,
		CreatedAt: jsonTime(g.Created), UpdatedAt: jsonTime(g.Updated), DBNow: jsonTime(g.DBNow)}
}

// memberJSON is a member in `partitions members --json` and `get --json`.
type memberJSON struct {
	Member     string  `json:"member"`
	State      string  `json:"state"`
	Weight     int     `json:"weight"`
	Owns       int     `json:"owns"`
	Planned    int     `json:"planned"`
	JoinedAt   *string `json:"joined_at"`
	ExpiresAt  *string `json:"expires_at"`
	DrainingAt *string `json:"draining_at"`
	DrainedBy  *string `json:"drained_by"`
}

func toMemberJSON(m partition.GroupMember) memberJSON {
	return memberJSON{Member: m.Name, State: memberState(m), Weight: m.Weight, Owns: m.Owns, Planned: m.Planned,
		JoinedAt: jsonTime(m.Joined), ExpiresAt: jsonTime(m.Expires), DrainingAt: jsonTime(m.Draining),
		DrainedBy: nullString(m.DrainedBy)}
}

// memberState is "live", "draining" (live, given nothing) or "expired" (its lease ran out;
// the next change of the plan forgets it).
func memberState(m partition.GroupMember) string {
	switch {
	case !m.Live:
		return "expired"
	case !m.Draining.IsZero():
		return "draining"
	}
	return "live"
}

// partitionJSON is a partition in `partitions get --json`.
type partitionJSON struct {
	Partition  int     `json:"partition"`
	State      string  `json:"state"`
	Target     *string `json:"target"`
	Holder     *string `json:"holder"`
	FenceToken int64   `json:"fence_token"`
	Epoch      int64   `json:"epoch"`
	AcquiredAt *string `json:"acquired_at"`
	ExpiresAt  *string `json:"expires_at"`
	FreeSince  *string `json:"free_since"`
	Grants     int64   `json:"grants"`
}

// partitionState is "held" (by the member the plan gives it to), "moving" (held by another
// member, which is to release it), "free" (no live grant) or "retired" (past a resize down,
// held until its holder releases it).
func partitionState(s partition.State, partitions int) string {
	switch {
	case s.ID >= partitions:
		return "retired"
	case s.Holder == "":
		return "free"
	case s.Holder != s.Target:
		return "moving"
	}
	return "held"
}

// groupGetJSON is `partitions get --json`.
type groupGetJSON struct {
	groupJSON
	Members          []memberJSON    `json:"members"`
	PartitionsDetail []partitionJSON `json:"partition_states"`
}

func (a *app) partitionsListCommand() *cobra.Command {
	var (
		limit int
		lf    listFlags
	)
	cmd := &cobra.Command{
		Use:     "list",
		Aliases: []string{"ls"},
		Short:   "List the partition groups in name order: partitions, epoch, live members, unowned partitions",
		Long: `List the partition groups in name order: their partition count, epoch (a resize adds one),
live members, and partitions without a live grant (with how long the oldest of them has been
without one, by the database clock). At most --limit groups are shown (a note on stderr says
when there are more).

With --json: an array ([] when empty) of {"name", "partitions", "epoch", "generation",
"live_members", "unowned", "unowned_seconds", "grants", "created_at", "updated_at", "db_now"}.`,
		Example: `  pgcoord partitions ls
  pgcoord partitions ls --json`,
		Args: exactArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			if limit < 1 {
				return usagef("--limit %d: want at least 1", limit)
			}
			pool, err := a.connect(ctx)
			if err != nil {
				return err
			}
			defer pool.Close()
			return a.show(ctx, cmd, &lf, func() error { return a.printGroups(ctx, pool, limit) })
		},
	}
	cmd.Flags().IntVar(&limit, "limit", defaultListLimit, "show at most this many groups")
	addListFlags(cmd, &lf, "")
	return cmd
}

// printGroups reads at most limit groups and prints them.
func (a *app) printGroups(ctx context.Context, pool *pgxpool.Pool, limit int) error {
	all, more, err := page.Collect(limit, pgcoord.MaxListLimit, func(last *partition.Group, n int) ([]partition.Group, error) {
		after := ""
		if last != nil {
			after = last.Name
		}
		return partition.Groups(ctx, pool, after, n)
	})
	if err != nil {
		return argError(err)
	}
	if more {
		fmt.Fprintf(a.errOut, "pgcoord: showing the first %d groups; there are more (raise --limit)\n", limit)
	}
	if a.json {
		js := make([]groupJSON, 0, len(all))
		for _, g := range all {
			js = append(js, toGroupJSON(g))
		}
		return a.printJSON(js)
	}
	if len(all) == 0 {
		fmt.Fprintln(a.out, "no partition groups (a member's partition.Join with Options.Partitions creates one)")
		return nil
	}
	tw := a.table()
	fmt.Fprintln(tw, "NAME\tPARTITIONS\tEPOCH\tMEMBERS\tUNOWNED")
	for _, g := range all {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%s\n", g.Name, g.Partitions, g.Epoch, g.Members, unowned(g))
	}
	return tw.Flush()
}

// unowned is a group's partitions without a live grant, and for how long the oldest has
// been: "2 (for 12s)".
func unowned(g partition.Group) string {
	if g.Unowned == 0 {
		return "0"
	}
	return fmt.Sprintf("%d (for %s)", g.Unowned, age(g.DBNow.Add(-g.UnownedFor), g.DBNow))
}

// groupView is one group read in one snapshot: the group, its members and, if asked, its
// partitions.
type groupView struct {
	group   partition.Group
	members []partition.GroupMember
	parts   []partition.State
}

// readGroup reads the group named name, its members and, with parts, its partitions, in
// one read-only snapshot (so the counts agree). An unknown group is ErrUnknownGroup.
func readGroup(ctx context.Context, pool *pgxpool.Pool, name string, parts bool) (groupView, error) {
	var v groupView
	err := pgx.BeginTxFunc(ctx, pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		var err error
		if v.group, err = partition.GetGroup(ctx, tx, name); err != nil {
			return err
		}
		if v.members, err = partition.Members(ctx, tx, name); err != nil {
			return err
		}
		if parts {
			v.parts, err = partition.List(ctx, tx, name)
		}
		return err
	})
	return v, argError(err)
}

func (a *app) partitionsGetCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "get GROUP",
		Short: "Show a partition group: its size, its members and the partitions each holds",
		Long: `Show the partition group GROUP: its size, epoch and plan generation, its partitions without
a live grant, the grants made so far; a line per member with its state (live, draining or
expired), weight, how many partitions it holds and how many the plan gives it, and the
partitions it holds (as ranges: 0-15,32); then the free partitions and those still held
by another member than the plan's (moving). An unknown group is an error (exit 1).

With --json: the object of 'partitions list --json' with "members", an array as
'partitions members --json' prints, and "partition_states", an array of {"partition",
"state" (held, moving, free or retired), "target", "holder", "fence_token", "epoch",
"acquired_at", "expires_at", "free_since", "grants"}.`,
		Example: `  pgcoord partitions get orders
  pgcoord partitions get orders --json`,
		Args: exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			pool, err := a.connect(ctx)
			if err != nil {
				return err
			}
			defer pool.Close()
			v, err := readGroup(ctx, pool, args[0], true)
			if err != nil {
				return err
			}
			if a.json {
				js := groupGetJSON{groupJSON: toGroupJSON(v.group), Members: make([]memberJSON, 0, len(v.members)),
					PartitionsDetail: make([]partitionJSON, 0, len(v.parts))}
				for _, m := range v.members {
					js.Members = append(js.Members, toMemberJSON(m))
				}
				for _, s := range v.parts {
					js.PartitionsDetail = append(js.PartitionsDetail, partitionJSON{Partition: s.ID,
						State: partitionState(s, v.group.Partitions), Target: nullString(s.Target), Holder: nullString(s.Holder),
						FenceToken: s.Token, Epoch: s.Epoch, AcquiredAt: jsonTime(s.Acquired), ExpiresAt: jsonTime(s.Expires),
						FreeSince: jsonTime(s.FreeSince), Grants: s.Grants})
				}
				return a.printJSON(js)
			}
			return a.printGroup(v)
		},
	}
}

// printGroup prints a group as `partitions get` shows it.
func (a *app) printGroup(v groupView) error {
	g := v.group
	a.printFields([][2]string{
		{"group", g.Name},
		{"partitions", fmt.Sprintf("%d (epoch %d, plan generation %d)", g.Partitions, g.Epoch, g.Generation)},
		{"live members", strconv.Itoa(g.Members)},
		{"unowned", unowned(g)},
		{"grants", strconv.FormatInt(g.Grants, 10)},
		{"created", preciseTime(g.Created)},
		{"updated", preciseTime(g.Updated)},
	})
	fmt.Fprintln(a.out)
	holds := map[string][]int{}
	var free []int
	moving := map[[2]string][]int{} // holder, target → partitions
	for _, s := range v.parts {
		switch partitionState(s, g.Partitions) {
		case "free":
			free = append(free, s.ID)
		case "moving", "retired":
			k := [2]string{s.Holder, s.Target}
			moving[k] = append(moving[k], s.ID)
		}
		if s.Holder != "" {
			holds[s.Holder] = append(holds[s.Holder], s.ID)
		}
	}
	tw := a.table()
	fmt.Fprintln(tw, "MEMBER\tSTATE\tWEIGHT\tOWNS\tPLANNED\tHOLDS")
	seen := map[string]bool{}
	for _, m := range v.members {
		seen[m.Name] = true
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%s\n", m.Name, memberState(m), m.Weight, m.Owns, m.Planned, ranges(holds[m.Name]))
	}
	// A holder whose member row is gone (forgotten in the same instant) still shows.
	for h, ids := range holds {
		if !seen[h] {
			fmt.Fprintf(tw, "%s\t%s\t-\t%d\t0\t%s\n", h, "gone", len(ids), ranges(ids))
		}
	}
	if len(v.members) == 0 && len(holds) == 0 {
		fmt.Fprintln(tw, "(no members)\t\t\t\t\t")
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(a.out, "\nfree (no live grant): %s\n", ranges(free))
	keys := make([][2]string, 0, len(moving))
	for k := range moving {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(x, y [2]string) int { return strings.Compare(x[0]+"\x00"+x[1], y[0]+"\x00"+y[1]) })
	for _, k := range keys {
		fmt.Fprintf(a.out, "moving: %s from %s to %s\n", ranges(moving[k]), base.Printable(k[0]), base.Printable(dashNone(k[1])))
	}
	return nil
}

// dashNone names a missing target: a partition past a resize down, or no live member.
func dashNone(s string) string {
	if s == "" {
		return "(none)"
	}
	return s
}

// ranges writes sorted partition ids compactly: "0-15,32,40-41"; "-" when there are none.
func ranges(ids []int) string {
	if len(ids) == 0 {
		return "-"
	}
	ids = slices.Clone(ids)
	slices.Sort(ids)
	var b strings.Builder
	for i := 0; i < len(ids); {
		j := i
		for j+1 < len(ids) && ids[j+1] == ids[j]+1 {
			j++
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(ids[i]))
		if j > i {
			b.WriteString("-" + strconv.Itoa(ids[j]))
		}
		i = j + 1
	}
	return b.String()
}

func (a *app) partitionsMembersCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "members GROUP",
		Short: "List a partition group's members: state, weight, partitions held and planned, lease",
		Long: `List the members of the partition group GROUP in name order: state (live; draining: live
but given nothing; expired: its lease ran out, and the next change of the plan forgets it),
weight, the partitions it holds and those the plan gives it, when it joined and when its
lease expires (by the database clock), and who drained it. An unknown group is an error
(exit 1).

With --json: an array ([] when empty) of {"member", "state", "weight", "owns", "planned",
"joined_at", "expires_at", "draining_at", "drained_by"}.`,
		Example: `  pgcoord partitions members orders`,
		Args:    exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			pool, err := a.connect(ctx)
			if err != nil {
				return err
			}
			defer pool.Close()
			v, err := readGroup(ctx, pool, args[0], false)
			if err != nil {
				return err
			}
			if a.json {
				js := make([]memberJSON, 0, len(v.members))
				for _, m := range v.members {
					js = append(js, toMemberJSON(m))
				}
				return a.printJSON(js)
			}
			if len(v.members) == 0 {
				fmt.Fprintf(a.out, "group %q has no members\n", v.group.Name)
				return nil
			}
			now := v.group.DBNow
			tw := a.table()
			fmt.Fprintln(tw, "MEMBER\tSTATE\tWEIGHT\tOWNS\tPLANNED\tJOINED\tEXPIRES\tDRAINED")
			for _, m := range v.members {
				expires := "expired " + ago(m.Expires, now)
				if m.Live {
					expires = "in " + timeLeft(m.Expires.Sub(now))
				}
				drained := "-"
				if !m.Draining.IsZero() {
					drained = fmt.Sprintf("%s by %s", ago(m.Draining, now), dash(m.DrainedBy))
				}
				fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%s\t%s\t%s\n", m.Name, memberState(m), m.Weight, m.Owns, m.Planned,
					ago(m.Joined, now), expires, drained)
			}
			return tw.Flush()
		},
	}
}
