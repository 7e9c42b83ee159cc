package ui_test

import (
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/internal/ui"
	"github.com/pgcoord/pgcoord/outbox"
)

// outboxState makes, through the public API, topic orders with one delivered message, one
// dead (its payload a secret), one due and one delayed; and topic audit with one dead. It
// returns the dead message of orders.
func outboxState(t *testing.T, pool *pgxpool.Pool) outbox.Message {
	t.Helper()
	ms := enqueue(t, pool,
		outbox.Message{Topic: "orders", Key: "a", Payload: []byte("delivered-1")},
		outbox.Message{Topic: "orders", Key: "b", Payload: []byte("poison: card 4242-secret")},
		outbox.Message{Topic: "audit", Key: "x", Payload: []byte("poison-audit")})
	relayOnce(t, pool)
	enqueue(t, pool,
		outbox.Message{Topic: "orders", Key: "c", Payload: []byte("due")},
		outbox.Message{Topic: "orders", Key: "d", Payload: []byte("later"), Delay: time.Hour})
	return ms[1]
}

// TestUIOutboxPage: per topic the pending, due, in-flight and dead counts with their bars
// and the oldest pending age; the delivery rate of the last minutes as a chart; the dead
// messages with their topic, key, attempts and last error — and never their payloads
// unless ShowPayloads; the dead list filters by topic and pages by id.
func TestUIOutboxPage(t *testing.T) {
	t.Parallel()
	d := newDash(t, ui.Config{})
	dead := outboxState(t, d.pool)

	body := d.page(t, "/outbox")
	contains(t, "outbox page", body,
		`<tr class="has-dead" data-topic="orders">`, `aria-label="2 pending"`, `<rect class="due" width="1"`, `<rect class="waiting" x="1" width="1"`,
		`<td class="num"><span class="badge dead">1</span></td>`, `aria-label="oldest pending `,
		`data-topic="audit"`,
		"Delivered per minute, last 10 minutes: 1</h3>", `data-n="1"`, `aria-label="deliveries per minute of orders"`,
		fmt.Sprintf(`<tr data-id="%d">`, dead.ID), "boom: upstream refused", `<td class="name"><a href="?topic=orders&amp;key=b">b</a></td>`)
	for _, hidden := range []string{"4242-secret", "poison-audit", "Retry</button>", "<th>Payload</th>"} {
		if strings.Contains(body, hidden) {
			t.Errorf("outbox page shows %q without ShowPayloads or AllowActions", hidden)
		}
	}

	// The dead list of one topic.
	audit := d.page(t, "/outbox?topic=audit")
	if strings.Contains(audit, fmt.Sprintf(`data-id="%d"`, dead.ID)) || !strings.Contains(audit, "Dead messages of topic audit") {
		t.Errorf("dead list of topic audit shows orders' message or no title:\n%s", audit)
	}

	// Pages of dead messages, by id.
	var bulk []outbox.Message
	for i := range 50 {
		bulk = append(bulk, outbox.Message{Topic: "bulk", Key: strconv.Itoa(i), Payload: []byte("poison")})
	}
	enqueue(t, d.pool, bulk...)
	relayOnce(t, d.pool)
	first := d.page(t, "/outbox")
	if n := strings.Count(first, "<tr data-id="); n != 50 {
		t.Fatalf("first page lists %d dead messages, want 50", n)
	}
	next := d.page(t, "/outbox?after="+url.QueryEscape(strings.Split(strings.Split(first, `class="next" href="?topic=&amp;after=`)[1], `"`)[0]))
	if n := strings.Count(next, "<tr data-id="); n != 2 || strings.Contains(next, `class="next"`) {
		t.Fatalf("second page lists %d dead messages, want the last 2 and no next page", n)
	}
	if code, _, _ := d.do(t, http.MethodGet, "/outbox?after=x", nil); code != http.StatusBadRequest {
		t.Errorf("bad after = %d, want 400", code)
	}
}

// TestUIOutboxPayloads: with ShowPayloads the dead messages' payloads are shown.
func TestUIOutboxPayloads(t *testing.T) {
	t.Parallel()
	d := newDash(t, ui.Config{ShowPayloads: true})
	outboxState(t, d.pool)
	contains(t, "outbox page with payloads", d.page(t, "/outbox"), "<th>Payload</th>", "poison: card 4242-secret", "poison-audit",
		`<span class="badge warn">payloads shown</span>`)
}

// TestUIRetryAction: Retry makes a dead message pending again through outbox.Retry, with
// the page's CSRF token and the confirmation, and audits it; it is refused without
// AllowActions, without the CSRF token, for a message that is not dead and for bad ids,
// and those refusals change and audit nothing.
func TestUIRetryAction(t *testing.T) {
	t.Parallel()
	off := newDash(t, ui.Config{})
	msg := outboxState(t, off.pool)
	off.page(t, "/outbox")
	if code, body, _ := off.do(t, http.MethodPost, "/actions/outbox/retry", url.Values{"id": {strconv.FormatInt(msg.ID, 10)}, "confirmed": {"yes"}}); code != http.StatusForbidden || !strings.Contains(body, "--allow-actions") {
		t.Fatalf("retry without --allow-actions = %d %q, want 403", code, body)
	}

	d := newDash(t, ui.Config{AllowActions: true})
	msg = outboxState(t, d.pool)
	page := d.page(t, "/outbox")
	contains(t, "outbox page with actions", page, `action="/actions/outbox/retry"`,
		fmt.Sprintf(`data-confirm="Retry outbox message %d (topic orders, key b)?`, msg.ID))
	id := strconv.FormatInt(msg.ID, 10)
	post := func(csrf, id string) (int, string, *http.Response) {
		return d.do(t, http.MethodPost, "/actions/outbox/retry", url.Values{"csrf": {csrf}, "id": {id}, "confirmed": {"yes"}}, "Origin", d.url)
	}
	if code, body, _ := post("", id); code != http.StatusForbidden || !strings.Contains(body, "CSRF") {
		t.Fatalf("retry without CSRF = %d %q, want 403", code, body)
	}
	if got, _ := outbox.Get(t.Context(), d.pool, msg.ID); got.State != outbox.Dead {
		t.Fatalf("a refused retry changed the message: %+v", got)
	}
	for bad, want := range map[string]int{"0": http.StatusBadRequest, "x": http.StatusBadRequest, "999999": http.StatusNotFound} {
		if code, body, _ := post(csrf(t, page), bad); code != want {
			t.Errorf("retry of id %q = %d %q, want %d", bad, code, body, want)
		}
	}
	if es := auditEntries(t, d.pool); len(es) != 0 {
		t.Fatalf("refused retries were audited: %+v", es)
	}

	code, _, resp := post(csrf(t, page), id)
	if code != http.StatusSeeOther || !strings.HasPrefix(resp.Header.Get("Location"), "/outbox?flash=") {
		t.Fatalf("retry = %d to %q, want 303 back to /outbox", code, resp.Header.Get("Location"))
	}
	got, err := outbox.Get(t.Context(), d.pool, msg.ID)
	if err != nil || got.State != outbox.Pending || got.Attempts != 0 {
		t.Fatalf("message after retry: %+v, %v; want pending with a fresh count of attempts", got, err)
	}
	es := auditEntries(t, d.pool)
	if len(es) != 1 || es[0].Action != "outbox.retry" || es[0].Target != id || es[0].Actor != "local" ||
		es[0].Details["topic"] != "orders" || es[0].Details["key"] != "b" || es[0].Details["attempts"] != float64(1) ||
		es[0].Details["last_error"] != errBoom.Error() {
		t.Fatalf("audit rows %+v", es)
	}
	after := d.page(t, resp.Header.Get("Location"))
	contains(t, "page after retry", after, fmt.Sprintf("outbox message %d (topic orders, key b) is pending again", msg.ID))
	if strings.Contains(after, fmt.Sprintf(`<tr data-id="%d">`, msg.ID)) {
		t.Error("the retried message is still listed as dead")
	}

	// It is pending now: retrying again is refused, and not audited.
	if code, body, _ := post(csrf(t, page), id); code != http.StatusConflict || !strings.Contains(body, "not dead") {
		t.Fatalf("second retry = %d %q, want 409", code, body)
	}
	if n := len(auditEntries(t, d.pool)); n != 1 {
		t.Fatalf("%d audit rows after a refused retry, want 1", n)
	}
}
