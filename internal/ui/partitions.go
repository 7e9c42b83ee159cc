package ui

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgcoord/pgcoord/partition"
	"github.com/pgcoord/pgcoord/pgcoord"
)

// gridMax is how many partitions a group's page draws as cells; a larger group's members
// table still counts them all.
const gridMax = 2048

type partitionsData struct {
	Rows        []partition.Group
	After, Next string
	Prefix      string // always empty: groups are listed whole, in name order
}

// loadPartitions reads one page of partition groups: one query.
func loadPartitions(ctx context.Context, s *Server, q url.Values) (any, error) {
	var d partitionsData
	var err error
	if d.After, err = param(q, "after"); err != nil {
		return nil, err
	}
	all, err := partition.Groups(ctx, s.cfg.Pool, d.After, pageSize+1)
	if err != nil {
		return nil, err
	}
	d.Rows, d.Next = pageOf(all, pageSize, func(g partition.Group) string { return g.Name })
	return d, nil
}

// summarizePartitions counts the groups, their live members and their partitions without a
// live grant, from one bounded query.
func summarizePartitions(ctx context.Context, s *Server) ([]count, error) {
	all, err := partition.Groups(ctx, s.cfg.Pool, "", summaryRows)
	if err != nil {
		return nil, err
	}
	more := len(all) == summaryRows
	var members, unowned int
	for _, g := range all {
		members += g.Members
		unowned += g.Unowned
	}
	return []count{{"groups", len(all), more}, {"live members", members, more}, {"unowned partitions", unowned, more}}, nil
}

// partitionPath is the path of a partition group's page (see schedulePath).
func partitionPath(name string) string { return namePath("/partitions/", name) }

// groupDetail is one partition group: the group, its members with their colours, and its
// partitions as cells of a grid.
type groupDetail struct {
	partition.Group
	MemberRows []memberRow
	// Cells are the first gridMax partitions; Cols the grid's width in cells, RowLabels
	// the first partition of each of its rows.
	Cells            []cell
	Cols, Width      int
	Height, CellSize int
	NextSize         int
	RowLabels        []rowLabel
	Total            int // partitions listed (those past a resize down included)
	Free, Moving     int
	Truncated        bool
	GridMax          int
}

// memberRow is a member of the group's page, with its colour in the grid; a holder whose
// member row is gone has Gone set.
type memberRow struct {
	partition.GroupMember
	State  string // live, draining, expired or gone
	Colour string
	Holds  int // partitions it holds, as the grid shows them
	Gone   bool
}

// cell is a partition drawn in the grid: filled with its holder's colour, or free.
type cell struct {
	ID    int
	X, Y  int
	Fill  string
	Class string // held, moving (held by another member than the plan's), free, retired
	// Next, if set, is the colour of the member the plan gives it to when that is not its
	// holder (moving, or free and waiting for the grant): drawn as an inner square.
	Next         string
	NextX, NextY int
	Holder       string
	Target       string
	Title        string
	Token, Epoch int64
}

type rowLabel struct {
	Y, ID int
}

// Grid geometry, in SVG units (pixels at scale 1).
const (
	cellSize  = 20
	cellGap   = 3
	labelSize = 44
	nextSize  = 8 // the inner square of a moving or waiting partition
)

// palette are the first members' colours: distinct, none the grid's free or moving marks.
var palette = []string{"#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#edc948", "#76b7b2",
	"#9c755f", "#ff9da7", "#1f3b73", "#8cd17d", "#d37295", "#499894"}

// colour is the n-th member's colour: the palette's, then hues a golden angle apart.
func colour(n int) string {
	if n < len(palette) {
		return palette[n]
	}
	return fmt.Sprintf("hsl(%d, 55%%, 45%%)", (n*137)%360)
}

// loadPartitionGroup reads the group named by the path, its members and its partitions in
// one read-only snapshot (three queries), so the counts agree. An unknown name, or one no
// group can have, is a 404 that does not show the name.
func loadPartitionGroup(ctx context.Context, s *Server, q url.Values) (any, error) {
	name, err := param(q, "name")
	if err != nil {
		return nil, err
	}
	var (
		g       partition.Group
		members []partition.GroupMember
		states  []partition.State
	)
	err = pgx.BeginTxFunc(ctx, s.cfg.Pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		var err error
		if g, err = partition.GetGroup(ctx, tx, name); err != nil {
			return err
		}
		if members, err = partition.Members(ctx, tx, name); err != nil {
			return err
		}
		states, err = partition.List(ctx, tx, name)
		return err
	})
	if errors.Is(err, partition.ErrUnknownGroup) || errors.Is(err, pgcoord.ErrInvalidName) {
		return nil, userErrorf(http.StatusNotFound, "no partition group of that name")
	}
	if err != nil {
		return nil, err
	}
	return newGroupDetail(g, members, states), nil
}

// newGroupDetail colours the members in name order (holders without a member row after
// them) and lays the partitions out as a grid.
func newGroupDetail(g partition.Group, members []partition.GroupMember, states []partition.State) *groupDetail {
	d := &groupDetail{Group: g, Total: len(states), GridMax: gridMax, CellSize: cellSize, NextSize: nextSize}
	index := map[string]int{}
	for _, m := range members {
		index[m.Name] = len(d.MemberRows)
		state := "live"
		switch {
		case !m.Live:
			state = "expired"
		case !m.Draining.IsZero():
			state = "draining"
		}
		d.MemberRows = append(d.MemberRows, memberRow{GroupMember: m, State: state, Colour: colour(len(d.MemberRows))})
	}
	for _, st := range states {
		if st.Holder == "" {
			continue
		}
		i, ok := index[st.Holder]
		if !ok {
			i = len(d.MemberRows)
			index[st.Holder] = i
			d.MemberRows = append(d.MemberRows, memberRow{GroupMember: partition.GroupMember{Name: st.Holder}, State: "gone",
				Colour: colour(i), Gone: true})
		}
		d.MemberRows[i].Holds++
	}
	switch {
	case len(states) <= 64:
		d.Cols = 16
	case len(states) <= 1024:
		d.Cols = 32
	default:
		d.Cols = 64
	}
	shown := states
	if len(shown) > gridMax {
		shown, d.Truncated = shown[:gridMax], true
	}
	for i, st := range states {
		class := "held"
		switch {
		case st.ID >= g.Partitions:
			class = "retired"
		case st.Holder == "":
			class = "free"
			d.Free++
		case st.Holder != st.Target:
			class = "moving"
			d.Moving++
		}
		if i >= len(shown) {
			continue
		}
		c := cell{ID: st.ID, X: labelSize + (i%d.Cols)*(cellSize+cellGap), Y: (i / d.Cols) * (cellSize + cellGap),
			Class: class, Holder: st.Holder, Target: st.Target, Token: st.Token, Epoch: st.Epoch, Fill: "#fff"}
		if st.Holder != "" {
			c.Fill = d.MemberRows[index[st.Holder]].Colour
		}
		if i, ok := index[st.Target]; ok && st.Target != st.Holder {
			c.Next, c.NextX, c.NextY = d.MemberRows[i].Colour, c.X+(cellSize-nextSize)/2, c.Y+(cellSize-nextSize)/2
		}
		c.Title = cellTitle(st, class)
		d.Cells = append(d.Cells, c)
		if i%d.Cols == 0 {
			d.RowLabels = append(d.RowLabels, rowLabel{Y: c.Y + cellSize - 4, ID: st.ID})
		}
	}
	rows := (len(shown) + d.Cols - 1) / d.Cols
	d.Width = labelSize + d.Cols*(cellSize+cellGap)
	d.Height = max(rows*(cellSize+cellGap), 1)
	return d
}

// cellTitle is a cell's tooltip: the partition, who holds it, who the plan gives it to.
func cellTitle(st partition.State, class string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "partition %d: ", st.ID)
	switch class {
	case "free":
		b.WriteString("free (no live grant)")
		if !st.FreeSince.IsZero() {
			fmt.Fprintf(&b, " since %s", timestamp(st.FreeSince))
		}
		if st.Target != "" {
			fmt.Fprintf(&b, "; planned for %s, granted at its next heartbeat", st.Target)
		} else {
			b.WriteString("; no live member to plan it for")
		}
	case "moving":
		fmt.Fprintf(&b, "held by %s, planned for %s: moves once %s releases it", st.Holder, orNone(st.Target), st.Holder)
	case "retired":
		fmt.Fprintf(&b, "held by %s past a resize down: dropped once released", st.Holder)
	default:
		fmt.Fprintf(&b, "held by %s", st.Holder)
	}
	if st.Token > 0 {
		fmt.Fprintf(&b, " · fence token %d (epoch %d)", st.Token, st.Epoch)
	}
	return b.String()
}

func orNone(s string) string {
	if s == "" {
		return "no member"
	}
	return s
}

// leaseLeft is how long a member's lease has left at now, for its row.
func leaseLeft(expires, now time.Time) string {
	if !expires.After(now) {
		return "expired " + age(expires, now) + " ago"
	}
	return "in " + humanDuration(expires.Sub(now))
}
