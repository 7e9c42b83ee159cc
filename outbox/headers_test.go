package outbox_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/pgcoord/pgcoord/outbox"
	"github.com/pgcoord/pgcoord/pgcoord"
)

// TestEnqueueRefusesReservedHeaders is the attack of a message that sets the webhook
// request's credentials or framing through its headers: Enqueue and EnqueueBatch refuse it,
// in any case, before any SQL, with an error naming the header.
func TestEnqueueRefusesReservedHeaders(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	for _, name := range []string{
		"Authorization", "authorization", "Cookie", "HOST", "Connection", "Keep-Alive", "Content-Length",
		"Transfer-Encoding", "TE", "Trailer", "Upgrade", "Expect", "Proxy-Authorization", "Proxy-Connection",
		"Forwarded", "X-Forwarded-For", "Idempotency-Key", "Pgcoord-Topic", "pgcoord-attempt",
	} {
		m := outbox.Message{Topic: "t", Key: "k", Headers: map[string]string{"Trace-Id": "ok", name: "x"}}
		_, err := outbox.Enqueue(ctx, noSQL{}, m)
		if !errors.Is(err, pgcoord.ErrInvalidArgument) || !strings.Contains(err.Error(), name) || !strings.Contains(err.Error(), "reserved") {
			t.Errorf("Enqueue with header %q: err = %v, want ErrInvalidArgument saying it is reserved", name, err)
		}
		if _, err := outbox.EnqueueBatch(ctx, noSQL{}, []outbox.Message{{Topic: "t", Key: "k"}, m}); !errors.Is(err, pgcoord.ErrInvalidArgument) {
			t.Errorf("EnqueueBatch with header %q: err = %v, want ErrInvalidArgument", name, err)
		}
		if !outbox.ReservedHeader(name) {
			t.Errorf("ReservedHeader(%q) = false", name)
		}
	}
	for _, name := range []string{"Trace-Id", "Content-Type", "X-Request-Id", "Traceparent", "Proxied", "Hosting"} {
		if outbox.ReservedHeader(name) {
			t.Errorf("ReservedHeader(%q) = true, want an ordinary header", name)
		}
	}
}
