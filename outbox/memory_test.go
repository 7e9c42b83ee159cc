package outbox_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"

	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/outbox"
	"github.com/pgcoord/pgcoord/pgcoord"
)

// claimBytes is a Handler that adds up, per claim token, the payload bytes it was handed,
// and records the order of the messages' payloads.
type claimBytes struct {
	mu      sync.Mutex
	byClaim map[int64]int
	order   []string
}

func (c *claimBytes) Handle(_ context.Context, m outbox.Message) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.byClaim == nil {
		c.byClaim = map[int64]int{}
	}
	c.byClaim[m.ClaimToken] += len(m.Payload)
	c.order = append(c.order, fmt.Sprintf("%s%d", m.Key, len(m.Payload)))
	return nil
}

// With the defaults, 100 messages of 1 MiB (a 100 MiB backlog) are delivered in claims
// whose payloads add up to at most DefaultBatchBytes: the relay, which holds one claim at
// a time, never holds them all. A claim without a byte cap took all 100 at once.
func TestClaimPayloadsStayWithinBatchBytes(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	payload := bytes.Repeat([]byte("x"), outbox.MaxPayload)
	for range 10 { // 10 transactions of 10 messages, one per key
		var msgs []outbox.Message
		for k := range 10 {
			msgs = append(msgs, outbox.Message{Topic: "big", Key: fmt.Sprint("k", k), Payload: payload})
		}
		enqueue(t, pool, msgs...)
	}
	h := &claimBytes{}
	r := newRelay(t, pool, h, outbox.Config{})
	for i := 0; pending(t, pool) > 0; i++ {
		if i == 1000 {
			t.Fatal("1000 batches did not drain 100 messages")
		}
		runBatch(t, r)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.order) != 100 {
		t.Fatalf("%d messages delivered, want 100", len(h.order))
	}
	largest := 0
	for _, b := range h.byClaim {
		largest = max(largest, b)
	}
	t.Logf("%d claims, the largest with %d MiB of payloads", len(h.byClaim), largest>>20)
	if largest > outbox.DefaultBatchBytes {
		t.Fatalf("a claim held %d bytes of payloads, more than the default cap of %d", largest, outbox.DefaultBatchBytes)
	}
}

// A claim always takes one message, however large; and a claim the byte cap cut short
// resumes after its last key, so one key's backlog of large messages does not hold back
// the other keys until it is drained.
func TestClaimCutByBytesResumesAfterItsKey(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	big := bytes.Repeat([]byte("x"), 1000)
	k := walkOrder(t, pool, "t", 2) // claims walk k[0] first
	var msgs []outbox.Message
	for range 6 {
		msgs = append(msgs, outbox.Message{Topic: "t", Key: k[0], Payload: big})
	}
	msgs = append(msgs, outbox.Message{Topic: "t", Key: k[1], Payload: []byte("small")})
	enqueue(t, pool, msgs...)
	h := &claimBytes{}
	r := newRelay(t, pool, h, outbox.Config{BatchBytes: 2500})
	if n := runBatch(t, r); n != 2 {
		t.Fatalf("first claim took %d messages, want the 2 of 1000 bytes that fit 2500", n)
	}
	runBatch(t, r)
	h.mu.Lock()
	got := slices.Clone(h.order)
	h.mu.Unlock()
	if want := []string{k[0] + "1000", k[0] + "1000", k[1] + "5"}; !slices.Equal(got, want) {
		t.Fatalf("delivered %v, want %v: the second claim resumes after key %s", got, want, k[0])
	}

	// A payload larger than the cap is claimed alone. (r leaves first: its range would be
	// left to it for a second, as it has just taken messages.)
	if err := r.Leave(t.Context()); err != nil {
		t.Fatal(err)
	}
	one := newRelay(t, pool, &claimBytes{}, outbox.Config{BatchBytes: 1})
	if n := runBatch(t, one); n != 1 {
		t.Fatalf("claim with a 1-byte cap took %d messages of 1000 bytes, want 1", n)
	}
}

// The byte cap counts headers too (issue 28, Info): three messages of 1-byte payloads
// with 1,000 bytes of headers each do not fit a 2,500-byte claim. Counting payloads only,
// one claim took all three: 3 KB of headers past the cap.
func TestClaimCountsHeaderBytes(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	headers := map[string]string{"trace": string(bytes.Repeat([]byte("h"), 1000))}
	var msgs []outbox.Message
	for k := range 3 {
		msgs = append(msgs, outbox.Message{Topic: "t", Key: fmt.Sprint("k", k), Payload: []byte("x"), Headers: headers})
	}
	enqueue(t, pool, msgs...)
	r := newRelay(t, pool, &claimBytes{}, outbox.Config{BatchBytes: 2500})
	if n := runBatch(t, r); n != 2 {
		t.Fatalf("a claim capped at 2500 bytes took %d messages of 1 + ~1015 bytes, want 2", n)
	}
}

// List reads no payload unless asked, and then only its first PayloadBytes bytes; it
// reports every payload's size. Get reads the whole message.
func TestListReadsPayloadsOnlyAsAsked(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pgtest.Pool(t)
	body := bytes.Repeat([]byte("0123456789"), 100)
	ms := enqueue(t, pool, msg("a", string(body)), msg("b", ""))
	if ms[0].PayloadSize != 1000 || ms[1].PayloadSize != 0 {
		t.Fatalf("Enqueue: payload sizes %d, %d", ms[0].PayloadSize, ms[1].PayloadSize)
	}
	list := func(opts *outbox.ListOpts) []outbox.Message {
		t.Helper()
		got, err := outbox.List(ctx, pool, opts)
		if err != nil || len(got) != 2 {
			t.Fatalf("List(%+v) = %d messages, %v", opts, len(got), err)
		}
		return got
	}
	for _, c := range []struct {
		opts *outbox.ListOpts
		want []byte
	}{
		{nil, []byte{}},
		{&outbox.ListOpts{PayloadBytes: 15}, body[:15]},
		{&outbox.ListOpts{PayloadBytes: outbox.MaxPayload}, body},
	} {
		got := list(c.opts)
		if !bytes.Equal(got[0].Payload, c.want) || got[0].PayloadSize != 1000 || len(got[1].Payload) != 0 || got[1].PayloadSize != 0 {
			t.Errorf("List(%+v): payloads %q (size %d), %q (size %d); want %q of 1000 bytes, and none",
				c.opts, got[0].Payload, got[0].PayloadSize, got[1].Payload, got[1].PayloadSize, c.want)
		}
	}
	if m := get(t, pool, ms[0].ID); !bytes.Equal(m.Payload, body) || m.PayloadSize != 1000 {
		t.Errorf("Get: payload of %d bytes, size %d; want the whole 1000", len(m.Payload), m.PayloadSize)
	}
	for _, bad := range []int{-1, outbox.MaxPayload + 1} {
		if _, err := outbox.List(ctx, noSQL{}, &outbox.ListOpts{PayloadBytes: bad}); !errors.Is(err, pgcoord.ErrInvalidArgument) {
			t.Errorf("List(PayloadBytes %d) err = %v, want ErrInvalidArgument before any SQL", bad, err)
		}
	}
}
