package cli_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/pgcoord/pgcoord/internal/cli"
	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/outbox"
)

// The relay sidecar with the stdout sink: JSON lines in commit order per key, and a clean
// stop with the final counts when interrupted.
func TestOutboxRelayStdout(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	ids := obEnqueue(t, d.pool, obMsg("orders", "o-1", `{"n":1}`), obMsg("orders", "o-1", `{"n":2}`),
		outbox.Message{Topic: "orders", Key: "o-2", Payload: []byte{0xff}})
	ctx, stop := context.WithCancel(t.Context())
	ch := d.start(ctx, "outbox", "relay", "--sink", "stdout", "--poll-interval", "50ms")
	waitFor(t, pgtest.WaitLimit, "every message delivered", func() bool {
		s, err := outbox.Stats(t.Context(), d.pool, nil)
		return err == nil && len(s) == 0
	})
	stop() // as SIGINT does: main cancels the command's context
	r := await(t, ch, pgtest.WaitLimit)
	if r.code != cli.ExitOK {
		t.Fatalf("relay exit %d, stderr %s", r.code, r.errOut)
	}
	lines := strings.Split(strings.TrimSpace(r.out), "\n")
	if len(lines) != 3 {
		t.Fatalf("stdout %q: want 3 JSON lines", r.out)
	}
	var got []map[string]any
	for _, l := range lines {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("line %q: %v", l, err)
		}
		got = append(got, m)
	}
	// Per-key order only: the relay may deliver o-2 before, between or after o-1's two.
	byKey := map[string][]map[string]any{}
	for _, m := range got {
		k, _ := m["key"].(string)
		byKey[k] = append(byKey[k], m)
	}
	o1, o2 := byKey["o-1"], byKey["o-2"]
	if len(o1) != 2 || len(o2) != 1 || o1[0]["id"] != float64(ids[0]) || o1[1]["id"] != float64(ids[1]) ||
		o2[0]["id"] != float64(ids[2]) || o2[0]["payload_base64"] != "/w==" {
		t.Fatalf("lines %s", r.out)
	}
	if p, _ := json.Marshal(o1[1]["payload"]); string(p) != `{"n":2}` {
		t.Fatalf("JSON payload %s", p)
	}
	if !strings.Contains(r.errOut, "relay stopped: delivered 3, failed 0, dead 0") {
		t.Fatalf("stderr %q: want the final counts", r.errOut)
	}
	if !strings.Contains(r.errOut, "(partition group outbox) delivering to stdout") {
		t.Fatalf("stderr %q: want the start line to name the relay's partition group", r.errOut)
	}
}

// The webhook sink sends the message id as Idempotency-Key; a failing endpoint parks its key.
func TestOutboxRelayWebhook(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	var mu sync.Mutex
	var keys []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		defer mu.Unlock()
		if string(body) == `{"fail":true}` {
			http.Error(w, "no", http.StatusInternalServerError)
			return
		}
		keys = append(keys, r.Header.Get("Idempotency-Key"))
	}))
	defer srv.Close()
	ids := obEnqueue(t, d.pool, obMsg("orders", "bad", `{"fail":true}`), obMsg("orders", "bad", `{"n":2}`), obMsg("orders", "good", `{"n":3}`))
	ctx, stop := context.WithCancel(t.Context())
	ch := d.start(ctx, "outbox", "relay", "--sink", "webhook="+srv.URL, "--backoff", "1h", "--max-backoff", "1h")
	waitFor(t, pgtest.WaitLimit, "the good key delivered and the bad key failed once", func() bool {
		m, err := outbox.Get(t.Context(), d.pool, ids[2])
		f, _ := outbox.Get(t.Context(), d.pool, ids[0])
		return err == nil && m.State == outbox.Delivered && f.Attempts == 1
	})
	stop()
	r := await(t, ch, pgtest.WaitLimit)
	if r.code != cli.ExitOK || !strings.Contains(r.errOut, "delivered 1, failed 1") {
		t.Fatalf("relay exit %d, stderr %s", r.code, r.errOut)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(keys) != 1 || keys[0] != fmt.Sprint(ids[2]) {
		t.Fatalf("Idempotency-Keys %v, want only the good key's message %d", keys, ids[2])
	}
	if m, _ := outbox.Get(t.Context(), d.pool, ids[1]); m.State != outbox.Pending || m.Attempts != 0 {
		t.Fatalf("message behind the failure: %+v; want it waiting, untried", m)
	}
}
