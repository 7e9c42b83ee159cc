package ui_test

import (
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/pgcoord/pgcoord/internal/ui"
	"github.com/pgcoord/pgcoord/outbox"
)

// TestUIRetryTopicAction: "Retry all dead" makes every dead message of its topic pending
// again (outbox.RetryDead) and no other topic's, audited with the count in the same
// transaction; a topic without dead messages is refused with 409 and not audited.
func TestUIRetryTopicAction(t *testing.T) {
	t.Parallel()
	d := newDash(t, ui.Config{AllowActions: true})
	ms := enqueue(t, d.pool, outbox.Message{Topic: "orders", Key: "a", Payload: []byte("poison 1")},
		outbox.Message{Topic: "orders", Key: "b", Payload: []byte("poison 2")},
		outbox.Message{Topic: "audit", Key: "c", Payload: []byte("poison 3")})
	relayOnce(t, d.pool)
	page := d.page(t, "/outbox")
	contains(t, "outbox page", page, `action="/actions/outbox/retry-topic"`, `data-confirm="Retry all 2 dead messages of topic orders?`,
		`<button type="submit" class="retry-topic">Retry all dead</button>`)
	post := func(topic string) (int, string, *http.Response) {
		return d.do(t, http.MethodPost, "/actions/outbox/retry-topic", url.Values{"csrf": {csrf(t, page)}, "topic": {topic}, "confirmed": {"yes"}})
	}
	code, _, resp := post("orders")
	if code != http.StatusSeeOther {
		t.Fatalf("retry topic = %d", code)
	}
	for i, want := range []outbox.State{outbox.Pending, outbox.Pending, outbox.Dead} {
		if m, err := outbox.Get(t.Context(), d.pool, ms[i].ID); err != nil || m.State != want {
			t.Errorf("message %d after retrying topic orders: %v, %v; want %s", i, m.State, err, want)
		}
	}
	contains(t, "page after", d.page(t, resp.Header.Get("Location")), "2 dead message(s) of topic orders are pending again")
	es := auditEntries(t, d.pool)
	if len(es) != 1 || es[0].Action != "outbox.retry_topic" || es[0].Target != "orders" || es[0].Details["retried"] != float64(2) {
		t.Fatalf("audit rows %+v", es)
	}
	if code, body, _ := post("orders"); code != http.StatusConflict || !strings.Contains(body, "no dead messages") {
		t.Fatalf("retrying a topic without dead messages = %d %q, want 409", code, body)
	}
	if code, _, _ := post(""); code != http.StatusBadRequest {
		t.Fatalf("retrying no topic = %d, want 400", code)
	}
	if n := len(auditEntries(t, d.pool)); n != 1 {
		t.Fatalf("%d audit rows after refusals, want 1", n)
	}
}

// TestUIPayloadsTruncated: with ShowPayloads a payload shows its first 40 characters in
// the table, and opens (a <details> element) to the first 2,048 bytes with its size.
func TestUIPayloadsTruncated(t *testing.T) {
	t.Parallel()
	d := newDash(t, ui.Config{ShowPayloads: true})
	long := "poison " + strings.Repeat("0123456789", 300)
	enqueue(t, d.pool, outbox.Message{Topic: "big", Key: "k", Payload: []byte(long)})
	relayOnce(t, d.pool)
	for _, path := range []string{"/outbox", "/outbox?topic=big&key=k"} {
		contains(t, path, d.page(t, path), "<details><summary><code>"+long[:40]+"…</code></summary><pre>"+long[:2048]+" … (3007 bytes)</pre></details>")
	}
	hidden := newDash(t, ui.Config{})
	enqueue(t, hidden.pool, outbox.Message{Topic: "big", Key: "k", Payload: []byte(long)})
	relayOnce(t, hidden.pool)
	for _, path := range []string{"/outbox", "/outbox?topic=big&key=k"} {
		if body := hidden.page(t, path); strings.Contains(body, "0123456789") || strings.Contains(body, "<details>") {
			t.Errorf("%s shows a payload without ShowPayloads", path)
		}
	}
}
