package ui_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/pgcoord/pgcoord/internal/ui"
	"github.com/pgcoord/pgcoord/outbox"
	"github.com/pgcoord/pgcoord/singleton"
)

// rows lists the values of attr (data-name, data-key, ...) of the table rows of body, in
// order.
func rows(body, attr string) []string {
	var out []string
	for _, part := range strings.Split(body, attr+`="`)[1:] {
		out = append(out, part[:strings.Index(part, `"`)])
	}
	return out
}

// TestUIFilters: every list filters by prefix in SQL — leases, semaphore keys, jobs,
// topics — with LIKE's wildcards taken literally, keeps the filter in its page links,
// and refuses an oversized or binary filter with 400.
func TestUIFilters(t *testing.T) {
	t.Parallel()
	d := newDash(t, ui.Config{})
	for _, n := range []string{"a%b", "a_c", "ab", "order:1", "order:2", "other"} {
		holdLease(t, d.pool, n, "w", time.Minute, time.Time{}, nil)
		permit(t, d.pool, n, "w", 1, time.Minute, time.Time{})
		tick(t, d.pool, singleton.Job{Name: n, Every: time.Hour}, time.Time{}, true, nil)
	}
	for _, c := range []struct {
		path, attr string
		want       string
	}{
		{"/leases?prefix=order:", "data-name", "order:1 order:2"},
		{"/leases?prefix=a%25", "data-name", "a%b"},
		{"/leases?prefix=a_", "data-name", "a_c"},
		{"/semaphores?prefix=o", "data-key", "order:1 order:2 other"},
		{"/semaphores?prefix=a_", "data-key", "a_c"},
		{"/jobs?prefix=order", "data-job", "order:1 order:2"},
		{"/jobs?prefix=zzz", "data-job", ""},
	} {
		if got := strings.Join(rows(d.page(t, c.path), c.attr), " "); got != c.want {
			t.Errorf("%s lists %q, want %q", c.path, got, c.want)
		}
	}
	contains(t, "filter form", d.page(t, "/leases?prefix=order:"), `<input name="prefix" placeholder="lease name prefix" value="order:"`)

	// The filter holds across pages.
	for i := range 52 {
		holdLease(t, d.pool, "bulk:"+string(rune('A'+i/26))+string(rune('a'+i%26)), "w", time.Minute, time.Time{}, nil)
	}
	first := d.page(t, "/leases?prefix=bulk:")
	if n := len(rows(first, "data-name")); n != 50 {
		t.Fatalf("first filtered page has %d leases, want 50", n)
	}
	contains(t, "first filtered page", first, `href="?prefix=bulk%3a&amp;after=bulk%3aBx"`)
	if got := rows(d.page(t, "/leases?prefix=bulk:&after=bulk:Bx"), "data-name"); strings.Join(got, " ") != "bulk:By bulk:Bz" {
		t.Fatalf("second filtered page %v", got)
	}

	enqueue(t, d.pool, outbox.Message{Topic: "mail.eu", Key: "k", Payload: []byte("x")},
		outbox.Message{Topic: "mail.us", Key: "k", Payload: []byte("x")}, outbox.Message{Topic: "sms", Key: "k", Payload: []byte("x")})
	if got := strings.Join(rows(d.page(t, "/outbox?prefix=mail."), "data-topic"), " "); got != "mail.eu mail.us" {
		t.Errorf("topics with prefix mail. = %q", got)
	}

	for _, bad := range []string{"/leases?prefix=" + strings.Repeat("x", 256), "/semaphores?prefix=%00", "/jobs?job=%01",
		"/idempotency?state=done", "/outbox?topic=" + strings.Repeat("x", 300)} {
		if code, _, _ := d.do(t, http.MethodGet, bad, nil); code != http.StatusBadRequest {
			t.Errorf("GET %s = %d, want 400", bad[:min(len(bad), 40)], code)
		}
	}
}

// TestUIIdempotencyFind: completed keys by scope, key prefix and state.
func TestUIIdempotencyFind(t *testing.T) {
	t.Parallel()
	d := newDash(t, ui.Config{})
	completeKey(t, d.pool, "payments", "order-1", `{"ok":1}`)
	completeKey(t, d.pool, "payments", "order-2", `{"ok":2}`)
	completeKey(t, d.pool, "payments", "refund-1", `{"ok":3}`)
	completeKey(t, d.pool, "mail", "order-9", `{"ok":4}`)
	beginKey(t, d.pool, "payments", "order-3", "charged", false)
	for _, c := range []struct{ query, want string }{
		{"in=payments&prefix=order-&state=completed", "payments/order-1 payments/order-2"},
		{"prefix=order-&state=completed", "mail/order-9 payments/order-1 payments/order-2"},
		{"in=payments&state=in_flight", "payments/order-3"},
		{"in=payments&prefix=order-", "payments/order-1 payments/order-2 payments/order-3"},
	} {
		body := d.page(t, "/idempotency?"+c.query)
		found := body[strings.Index(body, `id="found"`):]
		found = found[:strings.Index(found, "</table>")]
		if got := strings.Join(rows(found, "data-key"), " "); got != c.want {
			t.Errorf("%s finds %q, want %q", c.query, got, c.want)
		}
	}
	contains(t, "find", d.page(t, "/idempotency?prefix=order-&state=completed"), `<span class="badge completed">completed</span>`,
		`<td class="num">201</td>`, `<option value="completed" selected>`)
}
