package ui_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/fenced"
	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/internal/ui"
	"github.com/pgcoord/pgcoord/outbox"
	"github.com/pgcoord/pgcoord/singleton"
)

// busyRelay starts a relay named claimant whose handler holds its first batch until the
// test ends, and returns once the batch is claimed (its handler was called).
func busyRelay(t *testing.T, pool *pgxpool.Pool, claimant string) {
	t.Helper()
	started, release, done := make(chan struct{}, 1), make(chan struct{}), make(chan struct{})
	r, err := outbox.NewRelay(pool, &outbox.Config{Claimant: claimant, ClaimTTL: time.Minute,
		Handler: outbox.HandlerFunc(func(ctx context.Context, _ outbox.Message) error {
			select {
			case started <- struct{}{}:
			default:
			}
			select {
			case <-release:
			case <-ctx.Done():
			}
			return nil
		})})
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(done)
		_, _ = r.RunBatch(context.Background())
	}()
	t.Cleanup(func() { close(release); <-done })
	select {
	case <-started:
	case <-time.After(pgtest.WaitLimit):
		t.Fatal("the relay claimed nothing")
	}
}

// idleRelay records claimant as a relay waiting for a notification, as a relay with
// nothing to claim does (pgcoord_outbox_idle).
func idleRelay(t *testing.T, pool *pgxpool.Pool, claimant string) {
	t.Helper()
	if _, err := pool.Exec(t.Context(), "SELECT pgcoord_outbox_idle($1, interval '1 minute')", claimant); err != nil {
		t.Fatal(err)
	}
}

// waiter puts holder in line for key, as a blocking semaphore.Acquire refused at the
// limit does (pgcoord_semaphore_acquire with a wait).
func waiter(t *testing.T, pool *pgxpool.Pool, key, holder string, limit int) {
	t.Helper()
	if _, err := pool.Exec(t.Context(), "SELECT * FROM pgcoord_semaphore_acquire($1, $2, $3, interval '1 minute', interval '1 minute')",
		key, holder, limit); err != nil {
		t.Fatal(err)
	}
}

// fenceWrite accepts token on the fence register resource (fenced.Check).
func fenceWrite(t *testing.T, pool *pgxpool.Pool, resource string, token int64) {
	t.Helper()
	if err := pgx.BeginFunc(t.Context(), pool, func(tx pgx.Tx) error { return fenced.Check(t.Context(), tx, resource, token) }); err != nil {
		t.Fatal(err)
	}
}

// TestUILiveSystem: the Outbox page lists the relays that hold claims (with how many
// messages and of which topics) and those that wait; the Semaphores page's key detail
// lists each permit's holder and since when, and each waiter in line; the Leases page
// shows since when each holder holds its lease.
func TestUILiveSystem(t *testing.T) {
	t.Parallel()
	d := newDash(t, ui.Config{})
	enqueue(t, d.pool, outbox.Message{Topic: "orders", Key: "k1", Payload: []byte("a")},
		outbox.Message{Topic: "orders", Key: "k2", Payload: []byte("b")})
	busyRelay(t, d.pool, "relay-busy")
	idleRelay(t, d.pool, "relay-idle")
	body := d.page(t, "/outbox")
	contains(t, "relays", body, `<tr data-relay="relay-busy">`, `<td class="num">2</td>`, `<a href="?topic=orders">orders</a>`,
		`<tr data-relay="relay-idle">`, "<td>until ")

	permit(t, d.pool, "tenant:a", "worker-1", 1, time.Minute, time.Time{})
	waiter(t, d.pool, "tenant:a", "worker-2", 1)
	waiter(t, d.pool, "tenant:a", "worker-3", 1)
	pgtest.At(t, d.pool, dbNow(t, d.pool).Add(-2*time.Minute), func() { waiter(t, d.pool, "tenant:a", "worker-0", 1) })
	body = d.page(t, "/semaphores?key=tenant:a")
	contains(t, "semaphore detail", body, `id="sem-detail"`, `<tr class="held" data-holder="worker-1">`,
		`<tr class="waiting" data-holder="worker-2">`, `<tr class="waiting" data-holder="worker-3">`, "1 of 1 permits held · 2 waiter(s)",
		`<tr class="gone" data-holder="worker-0">`, "(stopped waiting: ignored)")
	if strings.Index(body, `data-holder="worker-2"`) > strings.Index(body, `data-holder="worker-3"`) {
		t.Error("waiters are not listed first in line first")
	}
	contains(t, "semaphore list", d.page(t, "/semaphores"), `<a href="/semaphores?key=tenant%3aa">tenant:a</a>`)
	if code, body, _ := d.do(t, http.MethodGet, "/semaphores?key=nope", nil); code != http.StatusOK || !strings.Contains(body, "no semaphore key of that name") || strings.Contains(body, "nope") {
		t.Errorf("unknown key = %d %q", code, body)
	}

	now := dbNow(t, d.pool)
	holdLease(t, d.pool, "order:1", "worker-a", time.Hour, now.Add(-90*time.Second), nil)
	contains(t, "leases", d.page(t, "/leases"), `<td title="`+now.Add(-90*time.Second).UTC().Format("2006-01-02 15:04:05.000Z")+`">1m`)
}

// TestUILinks: a lease links to its fence register, its newest grant and the operator
// actions on it; a job to its run history and the register its runs fence with; an
// outbox key to its messages.
func TestUILinks(t *testing.T) {
	t.Parallel()
	d := newDash(t, ui.Config{AllowActions: true})
	l := holdLease(t, d.pool, "order:9", "worker-a", time.Minute, time.Time{}, nil)
	fenceWrite(t, d.pool, "order:9", l.Token)
	page := d.page(t, "/leases")
	code, _, _ := d.do(t, http.MethodPost, "/actions/lease/expire", map[string][]string{"csrf": {csrf(t, page)}, "name": {"order:9"}, "confirmed": {"yes"}})
	if code != http.StatusSeeOther {
		t.Fatalf("expire = %d", code)
	}
	holdLease(t, d.pool, "order:9", "worker-b", time.Minute, time.Time{}, nil)
	body := d.page(t, "/leases?name=order:9")
	contains(t, "lease detail", body, `id="lease-detail"`, "holder worker-b",
		fmt.Sprintf(`<dd id="fence-register">token %d, written `, l.Token), "behind the newest grant",
		`<td>lease.expire</td>`, `&#34;holder&#34;: &#34;worker-a&#34;`)
	contains(t, "lease list", page, `<a href="/leases?name=order%3a9">order:9</a>`)

	every := time.Hour
	job := singleton.Job{Name: "nightly", Every: every}
	now := dbNow(t, d.pool)
	tick(t, d.pool, job, now.Add(-3*every), true, nil)
	tick(t, d.pool, job, now.Add(-2*every), true, errBoom)
	tick(t, d.pool, job, time.Time{}, false, nil)
	body = d.page(t, "/jobs?job=nightly")
	contains(t, "job detail", body, `id="job-detail"`, `<a href="/leases?name=job:nightly">job:nightly</a>`,
		"succeeded 1", "failed 1", "running 1", "boom: upstream refused")
	if n := strings.Count(body, `<tr class="`); n != 3+1 { // its 3 runs, and its row in the list
		t.Errorf("job detail and list have %d rows, want 4", n)
	}
	contains(t, "fence register of a job", d.page(t, "/leases?name=job:nightly"), "Lease job:nightly", "no lease of that name", "the runs of job")

	ms := enqueue(t, d.pool, outbox.Message{Topic: "mail", Key: "user:1", Payload: []byte("one")},
		outbox.Message{Topic: "mail", Key: "user:1", Payload: []byte("poison two")},
		outbox.Message{Topic: "mail", Key: "user:2", Payload: []byte("three")})
	relayOnce(t, d.pool)
	enqueue(t, d.pool, outbox.Message{Topic: "mail", Key: "user:1", Payload: []byte("four")})
	body = d.page(t, "/outbox?topic=mail&key=user:1")
	contains(t, "key messages", body, `id="key-messages"`, fmt.Sprintf(`<tr data-id="%d">`, ms[0].ID),
		`<span class="badge dead">dead</span>`, `<span class="badge delivered">delivered</span>`, `<span class="badge pending">pending</span>`)
	if strings.Contains(body, fmt.Sprintf(`<tr data-id="%d">`, ms[2].ID)) {
		t.Error("the messages of key user:1 include user:2's")
	}
	if code, _, _ := d.do(t, http.MethodGet, "/outbox?key=user:1", nil); code != http.StatusBadRequest {
		t.Errorf("a key without its topic = %d, want 400", code)
	}
}

// TestUIOutboxTrend: the chart of messages enqueued and delivered per minute, and the
// warning when delivery falls behind.
func TestUIOutboxTrend(t *testing.T) {
	t.Parallel()
	d := newDash(t, ui.Config{})
	enqueue(t, d.pool, outbox.Message{Topic: "t", Key: "a", Payload: []byte("x")}, outbox.Message{Topic: "t", Key: "b", Payload: []byte("y")})
	relayOnce(t, d.pool)
	body := d.page(t, "/outbox")
	contains(t, "trend", body, "last 60 minutes: 2 enqueued, 2 delivered", `<polyline class="enqueued" points="5,100.0 `)
	if strings.Contains(body, `id="behind"`) {
		t.Error("delivery is not behind, but the page says so")
	}
	enqueue(t, d.pool, outbox.Message{Topic: "t", Key: "c", Payload: []byte("z")})
	contains(t, "trend behind", d.page(t, "/outbox"), "3 enqueued, 2 delivered", `id="behind"`)
}
