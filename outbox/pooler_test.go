package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/outbox"
)

// A relay that does not LISTEN (the setting for a transaction-mode pooler) delivers a
// committed message by polling, within a few poll intervals. In pooler mode the pool goes
// through PgBouncer.
func TestRelayWithoutListenPolls(t *testing.T) {
	t.Parallel()
	testRelayDelivers(t, outbox.Config{NoListen: true, PollInterval: 50 * time.Millisecond})
}

// Behind PgBouncer a listening relay gets no notification, yet is never stuck: it falls
// back to its poll interval.
func TestListeningRelayBehindPoolerFallsBackToPolling(t *testing.T) {
	pgtest.NeedsPooler(t)
	t.Parallel()
	testRelayDelivers(t, outbox.Config{PollInterval: 50 * time.Millisecond})
}

func testRelayDelivers(t *testing.T, cfg outbox.Config) {
	t.Helper()
	ctx := t.Context()
	pool := pgtest.Pool(t)
	delivered := make(chan string, 1)
	r := newRelay(t, pool, outbox.HandlerFunc(func(_ context.Context, m outbox.Message) error {
		delivered <- string(m.Payload)
		return nil
	}), cfg)
	rctx, stop := context.WithCancel(ctx)
	done := pgtest.Go(func() (struct{}, error) { return struct{}{}, r.Run(rctx) })
	defer func() { stop(); done.Wait(t) }()

	enqueue(t, pool, msg("k", "polled"))
	select {
	case got := <-delivered:
		if got != "polled" {
			t.Fatalf("delivered %q", got)
		}
	case <-time.After(pgtest.WaitLimit):
		t.Fatalf("not delivered within %v by a relay polling every %v", pgtest.WaitLimit, cfg.PollInterval)
	}
	waitFor(t, "the message marked delivered", func() bool { return pending(t, pool) == 0 })
}
