package cli_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/internal/cli"
	"github.com/pgcoord/pgcoord/internal/pgtest"
)

// heartbeat is a member's heartbeat through the SQL API (as a member in another language
// runs it): it joins or renews member of group for ttl, releasing release.
func heartbeat(t *testing.T, pool *pgxpool.Pool, group, member string, ttl time.Duration, release ...int) {
	t.Helper()
	if release == nil {
		release = []int{}
	}
	if _, err := pool.Exec(t.Context(), `SELECT pgcoord_partition_heartbeat($1, $2, 1, $3, $4, true)`,
		group, member, ttl, release); err != nil {
		t.Fatal(err)
	}
}

// line returns the fields of the first line of out whose first field is first.
func line(t *testing.T, out, first string) []string {
	t.Helper()
	for l := range strings.Lines(out) {
		if f := strings.Fields(l); len(f) > 0 && f[0] == first {
			return f
		}
	}
	t.Fatalf("no line for %q in:\n%s", first, out)
	return nil
}

// groupOut is the part of a group's --json the tests read.
type groupOut struct {
	Name           string  `json:"name"`
	Partitions     int     `json:"partitions"`
	Epoch          int64   `json:"epoch"`
	LiveMembers    int     `json:"live_members"`
	Unowned        int     `json:"unowned"`
	UnownedSeconds float64 `json:"unowned_seconds"`
	Grants         int64   `json:"grants"`
	Members        []struct {
		Member    string  `json:"member"`
		State     string  `json:"state"`
		Owns      int     `json:"owns"`
		Planned   int     `json:"planned"`
		DrainedBy *string `json:"drained_by"`
	} `json:"members"`
	States []struct {
		Partition int     `json:"partition"`
		State     string  `json:"state"`
		Holder    *string `json:"holder"`
		Target    *string `json:"target"`
	} `json:"partition_states"`
}

// The operator's round on a group of 8 partitions with members a and b (b joined while a
// held everything): ls, get (per member the ranges it holds; the partitions moving from a
// to b, then free, then held), members, drain (dry run first), rebalance, resize (dry run
// first, then again to the same count); every change is audited under the actor.
func TestPartitionCommands(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	ctx := t.Context()
	clock := pgtest.NewClock(t, d.pool)
	t0 := time.Date(2027, 1, 4, 9, 0, 0, 0, time.UTC)
	clock.Freeze(t0)

	if code, out, _ := d.run(t, "partitions", "ls"); code != cli.ExitOK || !strings.Contains(out, "no partition groups") {
		t.Fatalf("ls of none = %d, %q", code, out)
	}
	if code, out, _ := d.run(t, "--json", "partitions", "ls"); code != cli.ExitOK || strings.TrimSpace(out) != "[]" {
		t.Fatalf("ls --json of none = %d, %q", code, out)
	}
	if _, err := d.pool.Exec(ctx, `SELECT pgcoord_partition_create('orders', 8)`); err != nil {
		t.Fatal(err)
	}
	clock.Freeze(t0.Add(12 * time.Second))
	if f := line(t, mustRun(t, d, "partitions", "ls"), "orders"); strings.Join(f, " ") != "orders 8 1 0 8 (for 12s)" {
		t.Errorf("ls of a new group: %q", f)
	}
	heartbeat(t, d.pool, "orders", "a", time.Minute)
	heartbeat(t, d.pool, "orders", "b", time.Minute) // the plan gives b 4-7, which a still holds

	out := mustRun(t, d, "partitions", "get", "orders")
	contains(t, "get while 4-7 move", out, "8 (epoch 1, plan generation", "moving: 4-7 from a to b", "free (no live grant): -")
	if f := line(t, out, "a"); strings.Join(f, " ") != "a live 1 8 4 0-7" {
		t.Errorf("a's line: %q", f)
	}
	if f := line(t, out, "b"); strings.Join(f, " ") != "b live 1 0 4 -" {
		t.Errorf("b's line: %q", f)
	}
	heartbeat(t, d.pool, "orders", "a", time.Minute, 4, 5, 6, 7) // a's OnRevoke returned: the release grants them to b
	out = mustRun(t, d, "partitions", "get", "orders")
	if f := line(t, out, "b"); strings.Join(f, " ") != "b live 1 4 4 4-7" || strings.Contains(out, "moving:") {
		t.Errorf("get after a released 4-7: b's line %q in:\n%s", f, out)
	}
	heartbeat(t, d.pool, "orders", "b", time.Minute)
	var g groupOut
	runJSON(t, d, &g, "partitions", "get", "orders")
	if g.Name != "orders" || g.Partitions != 8 || g.LiveMembers != 2 || g.Unowned != 0 || g.Grants != 12 ||
		len(g.Members) != 2 || len(g.States) != 8 || g.States[5].State != "held" || *g.States[5].Holder != "b" {
		t.Errorf("get --json = %+v", g)
	}
	var gs []groupOut
	runJSON(t, d, &gs, "partitions", "list")
	if len(gs) != 1 || gs[0].LiveMembers != 2 || gs[0].Epoch != 1 || gs[0].Grants != 12 {
		t.Errorf("list --json = %+v", gs)
	}
	clock.Freeze(t0.Add(24 * time.Second))
	out = mustRun(t, d, "partitions", "members", "orders")
	if f := line(t, out, "a"); strings.Join(f, " ") != "a live 1 4 4 12s ago in 48s -" {
		t.Errorf("members: a's line %q", f)
	}

	// drain: a dry run changes nothing; the drain moves a's partitions to b.
	out = mustRun(t, d, "partitions", "drain", "orders", "a", "--dry-run")
	contains(t, "drain --dry-run", out, `would drain member "a" of group "orders": the 4 partition(s) it holds (0-3) move to the 1 other`, "nothing changed")
	out = mustRun(t, d, "--actor", "alice", "partitions", "drain", "orders", "a")
	contains(t, "drain", out, `member "a" of group "orders" drained: the 4 partition(s) it holds (0-3)`)
	runJSON(t, d, &g.Members, "partitions", "members", "orders")
	if m := g.Members[0]; m.Member != "a" || m.State != "draining" || m.Planned != 0 || m.DrainedBy == nil || *m.DrainedBy != "alice" {
		t.Errorf("a after the drain: %+v", m)
	}
	contains(t, "get after the drain", mustRun(t, d, "partitions", "get", "orders"), "moving: 0-3 from a to b")
	contains(t, "drain again", mustRun(t, d, "--actor", "bob", "partitions", "drain", "orders", "a"),
		`member "a" of group "orders" is draining already (since 2027-01-04T09:00:24.000Z, by alice): nothing changed`)
	if code, _, errOut := d.run(t, "partitions", "drain", "orders", "nobody"); code != cli.ExitFailure || !strings.Contains(errOut, `member "nobody" is not live in group "orders"`) {
		t.Errorf("drain of a member that is not live = %d, %q", code, errOut)
	}
	code, _, errOut := d.run(t, "--actor", "alice", "partitions", "drain", "orders", "b", "--dry-run")
	if code != cli.ExitOK || !strings.Contains(errOut, "no other live member") {
		t.Errorf("drain --dry-run of the last member = %d, %q; want a warning", code, errOut)
	}

	// rebalance: nothing to do while both live; once their leases ran out, both are forgotten.
	var rb struct {
		Changed bool `json:"changed"`
	}
	runJSON(t, d, &rb, "--actor", "alice", "partitions", "rebalance", "orders")
	if rb.Changed {
		t.Error("rebalance of a settled plan changed it")
	}
	clock.Freeze(t0.Add(2 * time.Minute))
	contains(t, "rebalance", mustRun(t, d, "--actor", "alice", "partitions", "rebalance", "orders"), "the plan changed")
	if out = mustRun(t, d, "partitions", "members", "orders"); !strings.Contains(out, `group "orders" has no members`) {
		t.Errorf("members after the rebalance: %q", out)
	}

	// resize: a dry run changes nothing; the resize bumps the epoch; again, nothing.
	contains(t, "resize --dry-run", mustRun(t, d, "partitions", "resize", "orders", "16", "--dry-run"),
		`would resize group "orders" from 8 to 16 partitions (epoch 2)`, "nothing changed")
	contains(t, "resize", mustRun(t, d, "--actor", "alice", "partitions", "resize", "orders", "16"),
		`group "orders" resized from 8 to 16 partitions (epoch 2)`)
	var rs struct {
		Changed bool     `json:"changed"`
		From    int      `json:"from"`
		Group   groupOut `json:"group"`
	}
	runJSON(t, d, &rs, "partitions", "resize", "orders", "16")
	if rs.Changed || rs.From != 16 || rs.Group.Epoch != 2 || rs.Group.Partitions != 16 {
		t.Errorf("resize to the same count = %+v", rs)
	}

	rows, err := d.pool.Query(ctx, `SELECT action, actor, target FROM pgcoord_audit ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	var audit []string
	for rows.Next() {
		var action, actor, target string
		if err := rows.Scan(&action, &actor, &target); err != nil {
			t.Fatal(err)
		}
		audit = append(audit, fmt.Sprintf("%s %s %s", action, target, actor))
	}
	want := []string{"partitions.drain orders alice", "partitions.rebalance orders alice", "partitions.rebalance orders alice",
		"partitions.resize orders alice"}
	if strings.Join(audit, ", ") != strings.Join(want, ", ") {
		t.Errorf("audit = %q, want %q", audit, want)
	}
}

// Bad input exits 2 before anything is written: a partition count outside 1..65536 or not
// a number, a group name over 200 bytes, a member name over 255 bytes or with a control
// character, a wrong number of arguments. An unknown group exits 1, as an unknown name of
// the other nouns does.
func TestPartitionBadInput(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	if _, err := d.pool.Exec(t.Context(), `SELECT pgcoord_partition_create('orders', 8)`); err != nil {
		t.Fatal(err)
	}
	heartbeat(t, d.pool, "orders", "a", time.Minute)
	long := strings.Repeat("g", 201)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"resize", "orders", "0"}, "from 1 to 65536"},
		{[]string{"resize", "orders", "65537"}, "from 1 to 65536"},
		{[]string{"resize", "orders", "sixteen"}, "from 1 to 65536"},
		{[]string{"resize", "orders", "1.5"}, "from 1 to 65536"},
		{[]string{"resize", "orders", "-1"}, "may be negative"},
		{[]string{"resize", "orders"}, "takes 2 argument(s)"},
		{[]string{"get", long}, "maximum of 200"},
		{[]string{"members", long}, "maximum of 200"},
		{[]string{"rebalance", long}, "maximum of 200"},
		{[]string{"resize", long, "4"}, "maximum of 200"},
		{[]string{"drain", long, "a"}, "maximum of 200"},
		{[]string{"drain", "orders", strings.Repeat("m", 256)}, "maximum of 255"},
		{[]string{"drain", "orders", "a\x1b[2J"}, "control character"},
		{[]string{"drain", "orders", strings.Repeat("m", 256), "--dry-run"}, "maximum of 255"},
		{[]string{"get", ""}, "empty"},
		{[]string{"get"}, "takes 1 argument(s)"},
		{[]string{"ls", "orders"}, "takes 0 argument(s)"},
	} {
		code, _, errOut := d.run(t, append([]string{"partitions"}, c.args...)...)
		if code != cli.ExitUsage || !strings.Contains(errOut, c.want) {
			t.Errorf("%q = %d, %q; want exit %d naming %q", c.args, code, errOut, cli.ExitUsage, c.want)
		}
	}
	for _, args := range [][]string{{"get", "nope"}, {"members", "nope"}, {"rebalance", "nope"}, {"resize", "nope", "4"},
		{"resize", "nope", "4", "--dry-run"}, {"drain", "nope", "a"}, {"drain", "nope", "a", "--dry-run"}} {
		code, _, errOut := d.run(t, append([]string{"partitions"}, args...)...)
		if code != cli.ExitFailure || !strings.Contains(errOut, "no such group") {
			t.Errorf("%q = %d, %q; want exit %d saying no such group", args, code, errOut, cli.ExitFailure)
		}
	}
	var audits, partitions, draining int
	var epoch int64
	if err := d.pool.QueryRow(t.Context(), `SELECT (SELECT count(*) FROM pgcoord_audit),
		(SELECT count(*) FROM pgcoord_partitions WHERE group_name = 'orders'),
		(SELECT count(*) FROM pgcoord_partition_members WHERE draining_at IS NOT NULL),
		(SELECT epoch FROM pgcoord_partition_groups WHERE name = 'orders')`).Scan(&audits, &partitions, &draining, &epoch); err != nil {
		t.Fatal(err)
	}
	if audits != 0 || partitions != 8 || draining != 0 || epoch != 1 {
		t.Errorf("bad input wrote: %d audit rows, %d partitions, %d draining, epoch %d", audits, partitions, draining, epoch)
	}
}

// mustRun runs a command that must succeed and returns its output.
func mustRun(t *testing.T, d testDB, args ...string) string {
	t.Helper()
	code, out, errOut := d.run(t, args...)
	if code != cli.ExitOK {
		t.Fatalf("%q = %d, %q, %q", args, code, out, errOut)
	}
	return out
}

// runJSON runs a command with --json that must succeed and parses its output into v.
func runJSON(t *testing.T, d testDB, v any, args ...string) {
	t.Helper()
	out := mustRun(t, d, append([]string{"--json"}, args...)...)
	if err := json.Unmarshal([]byte(out), v); err != nil {
		t.Fatalf("%q: %v in %q", args, err, out)
	}
}

// contains fails the test unless body holds every want.
func contains(t *testing.T, what, body string, want ...string) {
	t.Helper()
	for _, w := range want {
		if !strings.Contains(body, w) {
			t.Errorf("%s: no %q in:\n%s", what, w, body)
		}
	}
}
