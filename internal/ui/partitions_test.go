package ui_test

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/internal/base"
	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/internal/ui"
	"github.com/pgcoord/pgcoord/partition"
)

// heartbeat is a member's heartbeat through the SQL API: it joins or renews member of group
// for ttl, releasing release.
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

// seedPartitions writes the group orders of 8 partitions: a held all 8 when b joined, so
// the plan moves 4-7 to b; a released 6 and 7 while a check of its grants of them was still
// open (so the release could not grant them to b: they wait for b's next heartbeat), and
// holds 4 and 5 still. The group idle (4 partitions) has no member.
func seedPartitions(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	for _, g := range []struct {
		name string
		n    int
	}{{"orders", 8}, {"idle", 4}} {
		if _, err := pool.Exec(t.Context(), `SELECT pgcoord_partition_create($1, $2)`, g.name, g.n); err != nil {
			t.Fatal(err)
		}
	}
	heartbeat(t, pool, "orders", "a", 10*time.Minute)
	heartbeat(t, pool, "orders", "b", 10*time.Minute)
	tx, err := pool.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	var held int
	if err := tx.QueryRow(t.Context(), `
		SELECT count(*) FROM pgcoord_partitions p, pgcoord_partition_check('orders', p.partition, 'a', p.fence_token) c
		 WHERE p.group_name = 'orders' AND p.partition IN (6, 7)`).Scan(&held); err != nil || held != 2 {
		t.Fatalf("checks of a's grants of 6 and 7: %d, %v", held, err)
	}
	heartbeat(t, pool, "orders", "a", 10*time.Minute, 6, 7)
}

// cellOf returns the grid's cell of partition p.
func cellOf(t *testing.T, page string, p int) string {
	t.Helper()
	i := strings.Index(page, fmt.Sprintf(`data-partition="%d"`, p))
	if i < 0 {
		t.Fatalf("no cell of partition %d in:\n%s", p, page)
	}
	i = strings.LastIndex(page[:i], "<g ")
	return page[i : i+strings.Index(page[i:], "</g>")]
}

// TestUIPartitionsPages: the list shows each group's size, epoch, live members and
// unowned partitions, linked from the navigation and the Overview; a group's page draws its
// partitions as a grid coloured by holder — held, moving (with the member it goes to), free
// (with the member it waits for) — with a legend of members, and its members table.
func TestUIPartitionsPages(t *testing.T) {
	t.Parallel()
	d := newDash(t, ui.Config{})
	clock := pgtest.NewClock(t, d.pool)
	t0 := time.Date(2027, 1, 4, 9, 0, 0, 0, time.UTC)
	clock.Freeze(t0)
	seedPartitions(t, d.pool)
	clock.Freeze(t0.Add(30 * time.Second))

	list := d.page(t, "/partitions")
	contains(t, "the partitions page", list,
		`<a href="/partitions" class="current" aria-current="page">Partitions</a>`,
		`<tr class="unowned" data-group="idle">`, `<td class="num warn">0</td>`, `<td>30s</td>`,
		`<tr class="unowned" data-group="orders">`, `<a href="/partitions/orders">orders</a>`,
		`<td class="num">8</td>`, `<td class="num warn">2</td>`, `<td class="num">8</td>`) // 8 grants
	if strings.Contains(list, "/actions/partitions/") {
		t.Error("a read-only dashboard shows partition actions")
	}
	contains(t, "overview", d.page(t, "/"), `<h3><a href="/partitions">Partitions</a></h3>`,
		"<dt>groups</dt><dd>2</dd><dt>live members</dt><dd>2</dd><dt>unowned partitions</dt><dd>6</dd>")

	page := d.page(t, "/partitions/orders")
	contains(t, "the group's page", page,
		`<title>Partition group · pgcoord</title>`, `class="current" aria-current="page">Partitions</a>`,
		`<h3>Partition group orders`, `<dd id="live-members">2</dd>`,
		`<span class="badge warn">2 without a live grant</span>, the oldest for 30s · 2 moving`,
		`<span class="member" data-member="a">`, `a (6)</span>`, `b (0)</span>`, "free (2)", "moving: held by another member than the plan's (2)",
		`<tr class="live" data-member="a">`, `<tr class="live" data-member="b">`)
	if n := strings.Count(page, `<g class="partition `); n != 8 {
		t.Errorf("the grid has %d cells, want 8", n)
	}
	aColour, bColour := "#4e79a7", "#f28e2b" // the palette's first two, in name order
	for p := range 4 {
		contains(t, "a held cell", cellOf(t, page, p), `class="partition held"`, `data-holder="a" data-target="a"`, `fill="`+aColour+`"`)
		if strings.Contains(cellOf(t, page, p), `class="next"`) {
			t.Errorf("partition %d, held by its planned member, has a mark", p)
		}
	}
	for _, p := range []int{4, 5} {
		contains(t, "a moving cell", cellOf(t, page, p), `class="partition moving"`, `data-holder="a" data-target="b"`,
			`fill="`+aColour+`"`, `<rect class="next"`, `fill="`+bColour+`"`, "held by a, planned for b: moves once a releases it")
	}
	for _, p := range []int{6, 7} {
		contains(t, "a free cell", cellOf(t, page, p), `class="partition free"`, `data-holder="" data-target="b"`,
			`<rect class="next"`, `fill="`+bColour+`"`, "free (no live grant) since 2027-01-04 09:00:00.000Z; planned for b")
	}
	members := between(t, page, `id="partition-members"`, "</table>")
	contains(t, "the members table", members, `<td class="num">6</td>`, `<td class="num warn">4</td>`, // a holds 6, planned 4
		`30s ago</td>`, "in 9m30s")

	idle := d.page(t, "/partitions/idle")
	contains(t, "the idle group's page", idle, "No members: nothing owns the group's partitions.", "free (4)",
		"free (no live grant) since 2027-01-04 09:00:00.000Z; no live member to plan it for")
	for _, p := range []string{"/partitions/nope", "/partitions/" + strings.Repeat("g", 201)} {
		if code, body, _ := d.do(t, http.MethodGet, p, nil, "Accept", "text/html"); code != http.StatusNotFound || !strings.Contains(body, "no partition group of that name") {
			t.Errorf("GET %s = %d, want 404 saying so:\n%s", p[:min(len(p), 30)], code, body)
		}
	}
}

// TestUIPartitionActions: with --allow-actions the signed-in operator rebalances a group
// and drains a member from the group's page; each action writes exactly one audit row, the
// SQL API's, with the operator as its actor, and returns to the group's page. A drain of a
// member that is draining already or not live, an unknown group and bad names are refused
// and not audited.
func TestUIPartitionActions(t *testing.T) {
	t.Parallel()
	d := newDash(t, ui.Config{AllowActions: true, Token: testToken})
	ctx := t.Context()
	seedPartitions(t, d.pool)
	if code, _, _ := d.do(t, http.MethodPost, "/login", url.Values{"name": {"alice"}, "token": {testToken}}); code != http.StatusSeeOther {
		t.Fatalf("sign-in = %d", code)
	}
	page := d.page(t, "/partitions/orders")
	contains(t, "the group's actions", page, `action="/actions/partitions/rebalance"`, `action="/actions/partitions/drain"`,
		`data-confirm="Rebalance partition group orders?`, `data-confirm="Drain member b of partition group orders?`)
	token := csrf(t, page)
	post := func(action string, form url.Values) (int, string, string) {
		t.Helper()
		form.Set("csrf", token)
		form.Set("confirmed", "yes")
		code, body, resp := d.do(t, http.MethodPost, "/actions/partitions/"+action, form)
		return code, body, resp.Header.Get("Location")
	}
	audited := func(n int, action string) {
		t.Helper()
		es := auditEntries(t, d.pool)
		if len(es) != n || es[0].Action != action || es[0].Target != "orders" || !strings.HasPrefix(es[0].Actor, "alice (token:") {
			t.Fatalf("audit rows %+v, want %d, the newest %s of orders by alice", es, n, action)
		}
	}

	code, _, loc := post("rebalance", url.Values{"group": {"orders"}})
	if code != http.StatusSeeOther || !strings.HasPrefix(loc, "/partitions/orders?flash=") {
		t.Fatalf("rebalance = %d to %q, want 303 back to the group's page", code, loc)
	}
	audited(1, "partitions.rebalance")
	contains(t, "the page after the rebalance", d.page(t, loc),
		`<p class="flash" role="status">rebalanced partition group &#34;orders&#34;: the plan was balanced already, nothing moves`)

	if code, _, loc = post("drain", url.Values{"group": {"orders"}, "member": {"b"}}); code != http.StatusSeeOther || !strings.HasPrefix(loc, "/partitions/orders?flash=") {
		t.Fatalf("drain = %d to %q", code, loc)
	}
	audited(2, "partitions.drain")
	actor := auditEntries(t, d.pool)[0].Actor
	if e := auditEntries(t, d.pool)[0]; e.Details["member"] != "b" {
		t.Errorf("the drain's audit details %v, want the member", e.Details)
	}
	ms, err := partition.Members(ctx, d.pool, "orders")
	if err != nil || len(ms) != 2 || ms[1].Name != "b" || ms[1].Draining.IsZero() || ms[1].DrainedBy != actor || ms[1].Planned != 0 {
		t.Fatalf("members after the drain: %+v, %v; want b draining by %s with nothing planned", ms, err, actor)
	}
	after := d.page(t, loc)
	contains(t, "the page after the drain", after, `drained member &#34;b&#34; of partition group &#34;orders&#34;: its 0 partition(s) move`,
		`<tr class="draining" data-member="b">`, `<span class="badge draining">draining</span>`)
	if strings.Contains(between(t, after, `data-member="b">`, "</tr>"), "Drain</button>") {
		t.Error("a draining member is offered Drain")
	}
	// a now holds everything it is planned for: 4-5 are no longer moving, 6-7 wait for a.
	contains(t, "partition 6 after the drain", cellOf(t, after, 6), `data-holder="" data-target="a"`)

	long := strings.Repeat("g", 201)
	for _, c := range []struct {
		action string
		form   url.Values
		status int
		want   string
	}{
		{"drain", url.Values{"group": {"orders"}, "member": {"b"}}, http.StatusConflict, "draining already"},
		{"drain", url.Values{"group": {"orders"}, "member": {"nobody"}}, http.StatusNotFound, "not live"},
		{"drain", url.Values{"group": {"nope"}, "member": {"a"}}, http.StatusNotFound, "not live"},
		{"drain", url.Values{"group": {"orders"}, "member": {""}}, http.StatusBadRequest, "empty"},
		{"drain", url.Values{"group": {long}, "member": {"a"}}, http.StatusBadRequest, "maximum of 200"},
		{"rebalance", url.Values{"group": {"nope"}}, http.StatusNotFound, "no partition group"},
		{"rebalance", url.Values{"group": {long}}, http.StatusBadRequest, "maximum of 200"},
		{"rebalance", url.Values{"group": {""}}, http.StatusBadRequest, "empty"},
	} {
		if code, body, _ := post(c.action, c.form); code != c.status || !strings.Contains(body, c.want) {
			t.Errorf("%s %v = %d %q, want %d mentioning %q", c.action, c.form, code, body, c.status, c.want)
		}
	}
	if n := len(auditEntries(t, d.pool)); n != 2 {
		t.Errorf("%d audit rows after refused actions, want 2", n)
	}
}

// TestUIPartitionActionsRefused: without --allow-actions, without the CSRF token, not
// confirmed or by GET, a partition action is refused, changes nothing and writes no audit
// row.
func TestUIPartitionActionsRefused(t *testing.T) {
	t.Parallel()
	unchanged := func(d *dash, what string) {
		t.Helper()
		ms, err := partition.Members(t.Context(), d.pool, "orders")
		if err != nil || len(ms) != 2 || !ms[0].Draining.IsZero() || !ms[1].Draining.IsZero() {
			t.Errorf("%s: members %+v, %v: a refused action drained one", what, ms, err)
		}
		if es := auditEntries(t, d.pool); len(es) != 0 {
			t.Errorf("%s: audit rows %+v, want none", what, es)
		}
	}
	form := func(csrf string) url.Values {
		return url.Values{"csrf": {csrf}, "group": {"orders"}, "member": {"a"}, "confirmed": {"yes"}}
	}
	actions := []string{"rebalance", "drain"}

	ro := newDash(t, ui.Config{})
	seedPartitions(t, ro.pool)
	if strings.Contains(ro.page(t, "/partitions/orders"), "/actions/partitions/") {
		t.Error("a read-only dashboard shows partition actions")
	}
	for _, a := range actions {
		if code, body, _ := ro.do(t, http.MethodPost, "/actions/partitions/"+a, form("00")); code != http.StatusForbidden || !strings.Contains(body, "--allow-actions") {
			t.Errorf("%s without --allow-actions = %d %q, want 403", a, code, body)
		}
	}
	unchanged(ro, "without --allow-actions")

	d := newDash(t, ui.Config{AllowActions: true})
	seedPartitions(t, d.pool)
	good := csrf(t, d.page(t, "/partitions/orders"))
	for _, a := range actions {
		for _, tok := range []string{"", strings.Repeat("0", 64)} {
			if code, body, _ := d.do(t, http.MethodPost, "/actions/partitions/"+a, form(tok)); code != http.StatusForbidden || !strings.Contains(body, "CSRF") {
				t.Errorf("%s with CSRF token %q = %d %q, want 403", a, tok, code, body)
			}
		}
		f := form(good)
		f.Del("confirmed")
		if code, _, _ := d.do(t, http.MethodPost, "/actions/partitions/"+a, f); code != http.StatusBadRequest {
			t.Errorf("%s not confirmed = %d, want 400", a, code)
		}
		if code, _, _ := d.do(t, http.MethodGet, "/actions/partitions/"+a+"?"+form(good).Encode(), nil); code != http.StatusMethodNotAllowed {
			t.Errorf("GET %s = %d, want 405", a, code)
		}
	}
	unchanged(d, "refused requests")
}

// TestUIPartitionsEscape: group and member names come from users: the pages escape them
// for HTML, show their control characters visibly, and link a group of any characters to
// its own page, where its actions find it.
func TestUIPartitionsEscape(t *testing.T) {
	t.Parallel()
	d := newDash(t, ui.Config{AllowActions: true})
	evil := `<script>alert("g")</script>/x?y#z`
	if _, err := d.pool.Exec(t.Context(), `SELECT pgcoord_partition_create($1, 2)`, evil); err != nil {
		t.Fatal(err)
	}
	heartbeat(t, d.pool, evil, `<b onmouseover=alert(1)>m</b>`, time.Minute)
	link := "/partitions/%3Cscript%3Ealert%28%22g%22%29%3C%2Fscript%3E%2Fx%3Fy%23z"
	list := d.page(t, "/partitions")
	detail := d.page(t, link)
	for what, body := range map[string]string{"list": list, "detail": detail} {
		for _, raw := range []string{"<script>alert", "<b onmouseover"} {
			if strings.Contains(body, raw) {
				t.Errorf("the %s page holds %q raw", what, raw)
			}
		}
		if i := strings.IndexFunc(body, func(r rune) bool { return r != '\n' && r != '\t' && base.IsControl(r) }); i >= 0 {
			t.Errorf("the %s page shows a raw control character at %d", what, i)
		}
		contains(t, "the "+what+" page", body, `&lt;script&gt;alert(&#34;g&#34;)&lt;/script&gt;/x?y#z`)
	}
	contains(t, "the list", list, `<a href="`+link+`">`)
	contains(t, "the detail", detail, `&lt;b onmouseover=alert(1)&gt;m&lt;/b&gt;`,
		`<input type="hidden" name="group" value="&lt;script&gt;alert(&#34;g&#34;)&lt;/script&gt;/x?y#z">`)
	code, _, resp := d.do(t, http.MethodPost, "/actions/partitions/rebalance",
		url.Values{"csrf": {csrf(t, detail)}, "group": {evil}, "confirmed": {"yes"}})
	if loc := resp.Header.Get("Location"); code != http.StatusSeeOther || !strings.HasPrefix(loc, link+"?flash=") {
		t.Fatalf("rebalance = %d to %q, want 303 to %s", code, loc, link)
	}
}
