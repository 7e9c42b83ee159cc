package ui_test

import (
	"strings"
	"testing"
	"time"

	"github.com/pgcoord/pgcoord/internal/ui"
)

// TestUIIdempotencyPage: keys in flight are listed with scope, key, attempts, recovery
// point and age, a key whose holder died marked stuck; the counts of keys in flight, stuck
// and completed; looking a key up shows its stored response's size, and its body only
// with ShowPayloads.
func TestUIIdempotencyPage(t *testing.T) {
	t.Parallel()
	for _, show := range []bool{false, true} {
		d := newDash(t, ui.Config{ShowPayloads: show})
		beginKey(t, d.pool, "payments", "live-1", "charged", false)
		beginKey(t, d.pool, "payments", "dead-1", "reserved", true)
		completeKey(t, d.pool, "payments", "done-1", `{"receipt":"secret-4242"}`)

		body := d.page(t, "/idempotency")
		contains(t, "idempotency page", body,
			`<tr class="held" data-key="payments/live-1">`, `<td>charged</td>`,
			`<tr class="stuck" data-key="payments/dead-1">`, `<span class="badge stuck">stuck</span>`, `<td>reserved</td>`,
			`<h3>In flight</h3><p class="big">2</p>`, `<h3>Stuck</h3><p class="big">1</p>`, `<h3>Completed</h3><p class="big">1</p>`)
		if strings.Contains(body, "done-1") {
			t.Error("a completed key is listed in flight")
		}
		lookup := d.page(t, "/idempotency?scope=payments&key=done-1")
		contains(t, "key lookup", lookup, `<span class="badge completed">completed</span>`, "<dt>status</dt><dd>201</dd>")
		if show {
			contains(t, "key lookup with payloads", lookup, "secret-4242", "Content-Type: application/json")
		} else {
			contains(t, "key lookup", lookup, "25 bytes, hidden: start the dashboard with --show-payloads")
			if strings.Contains(lookup, "secret-4242") || strings.Contains(lookup, "application/json") {
				t.Error("the stored response is shown without ShowPayloads")
			}
		}
		contains(t, "stuck key lookup", d.page(t, "/idempotency?scope=payments&key=dead-1"), "<dt>recovery point</dt><dd>reserved</dd>",
			`<span class="badge stuck">stuck</span>`)
		contains(t, "unknown key lookup", d.page(t, "/idempotency?scope=payments&key=nope"), "no key of that name in that scope")
	}
}

// TestUIOverviewOutboxAndIdempotency: the Overview counts the outbox's messages and the
// idempotency keys, and shows the doctor's finding on the stuck key.
func TestUIOverviewOutboxAndIdempotency(t *testing.T) {
	t.Parallel()
	d := newDash(t, ui.Config{DoctorEvery: time.Nanosecond})
	outboxState(t, d.pool)
	beginKey(t, d.pool, "payments", "live-1", "charged", false)
	beginKey(t, d.pool, "payments", "dead-1", "reserved", true)
	completeKey(t, d.pool, "payments", "done-1", "ok")
	contains(t, "overview", d.page(t, "/"),
		`<a href="/outbox">Outbox</a>`, "<dt>topics</dt><dd>2</dd>", "<dt>pending</dt><dd>2</dd>", "<dt>due</dt><dd>1</dd>",
		"<dt>dead</dt><dd>2</dd>",
		`<a href="/idempotency">Idempotency</a>`, "<dt>keys in flight</dt><dd>2</dd>", "<dt>stuck (holder died)</dt><dd>1</dd>",
		"<dt>completed</dt><dd>1</dd>",
		`<tr class="attention" data-check="idempotency">`, "payments/dead-1")
}
