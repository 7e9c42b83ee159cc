package sink_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pgcoord/pgcoord/outbox"
	"github.com/pgcoord/pgcoord/outbox/sink"
	"github.com/pgcoord/pgcoord/pgcoord"
)

func TestWebhook(t *testing.T) {
	t.Parallel()
	type request struct {
		key, ctype, topic, mkey, attempt, trace string
		body                                    string
	}
	var mu sync.Mutex
	var got []request
	status := http.StatusNoContent
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		defer mu.Unlock()
		if r.Method != http.MethodPost {
			t.Errorf("method %s", r.Method)
		}
		got = append(got, request{r.Header.Get("Idempotency-Key"), r.Header.Get("Content-Type"), r.Header.Get("Pgcoord-Topic"),
			r.Header.Get("Pgcoord-Key"), r.Header.Get("Pgcoord-Attempt"), r.Header.Get("Trace-Id"), string(body)})
		w.WriteHeader(status)
		io.WriteString(w, "busy")
	}))
	defer srv.Close()
	h, err := sink.Webhook(srv.URL+"/hook", nil)
	if err != nil {
		t.Fatal(err)
	}
	m := outbox.Message{ID: 42, Topic: "orders", Key: "o-1", Payload: []byte(`{"a":1}`), JSON: true,
		Headers: map[string]string{"Trace-Id": "t1", "bad name": "x"}, Attempts: 2}
	if err := h.Handle(t.Context(), m); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	status = http.StatusServiceUnavailable
	mu.Unlock()
	err = h.Handle(t.Context(), outbox.Message{ID: 43, Topic: "orders", Key: "o-1", Payload: []byte{1, 2}})
	if err == nil || !strings.Contains(err.Error(), "503") || !strings.Contains(err.Error(), "busy") {
		t.Fatalf("non-2xx answer: err = %v, want an error naming the status", err)
	}
	want := []request{
		{"42", "application/json", "orders", "o-1", "3", "t1", `{"a":1}`},
		{"43", "application/octet-stream", "orders", "o-1", "1", "", "\x01\x02"},
	}
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 2 || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("requests %+v\nwant %+v", got, want)
	}
}

func TestWebhookTimeoutAndBadURL(t *testing.T) {
	t.Parallel()
	block := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { <-block }))
	defer srv.Close()
	defer close(block)
	h, err := sink.Webhook(srv.URL, &sink.WebhookOpts{Timeout: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Handle(t.Context(), outbox.Message{ID: 1}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("slow endpoint: err = %v, want a deadline error", err)
	}
	for _, u := range []string{"", "ftp://x", "http://", "::"} {
		if _, err := sink.Webhook(u, nil); !errors.Is(err, pgcoord.ErrInvalidArgument) {
			t.Errorf("Webhook(%q) err = %v", u, err)
		}
	}
}

func TestJSONLines(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	h := sink.JSONLines(&buf)
	created := time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC)
	msgs := []outbox.Message{
		{ID: 1, Topic: "t", Key: "k", Payload: []byte("{\n \"a\": 1}"), JSON: true, CreatedAt: created},
		{ID: 2, Topic: "t", Key: "k", Payload: []byte("raw\n"), Headers: map[string]string{"h": "v"}, Attempts: 1, CreatedAt: created},
	}
	for _, m := range msgs {
		if err := h.Handle(t.Context(), m); err != nil {
			t.Fatal(err)
		}
	}
	lines := strings.Split(strings.TrimSuffix(buf.String(), "\n"), "\n")
	want := []string{
		`{"id":1,"topic":"t","key":"k","payload":{"a":1},"headers":{},"attempt":1,"created_at":"2026-11-30T09:00:00Z"}`,
		`{"id":2,"topic":"t","key":"k","payload_base64":"cmF3Cg==","headers":{"h":"v"},"attempt":2,"created_at":"2026-11-30T09:00:00Z"}`,
	}
	if len(lines) != 2 || lines[0] != want[0] || lines[1] != want[1] {
		t.Fatalf("lines:\n%s\nwant:\n%s", strings.Join(lines, "\n"), strings.Join(want, "\n"))
	}
	for _, l := range lines {
		if !json.Valid([]byte(l)) {
			t.Fatalf("invalid JSON line %s", l)
		}
	}
}

// A webhook endpoint's secrets (user information, query values such as ?api_key=) never
// appear in an error, which the relay stores as the message's last_error and logs; nor do
// the control characters of an endpoint's answer, which would reach an operator's terminal.
func TestWebhookErrorsHideSecrets(t *testing.T) {
	t.Parallel()
	_, err := sink.Webhook("ftp://user:hunter2@files.example/drop?api_key=k3y", nil)
	if err == nil || strings.Contains(err.Error(), "hunter2") || strings.Contains(err.Error(), "k3y") || !strings.Contains(err.Error(), "files.example") {
		t.Fatalf("bad scheme: %v; want an error naming the host without the password or the key", err)
	}

	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusBadGateway)
		io.WriteString(w, "down\x1b]0;pwned\x07\x1b[2J\nfake row")
	}))
	h, err := sink.Webhook(srv.URL+"/hook?api_key=s3cret&v=1", nil)
	if err != nil {
		t.Fatal(err)
	}
	err = h.Handle(t.Context(), outbox.Message{ID: 1, Topic: "t", Key: "k"})
	if err == nil || strings.ContainsAny(err.Error(), "\x1b\x07\n") || !strings.Contains(err.Error(), `\x1b]0;pwned`) {
		t.Fatalf("answer with control characters: %q; want them escaped", err)
	}
	srv.Close() // now nothing listens: the client's error names the URL
	err = h.Handle(t.Context(), outbox.Message{ID: 1, Topic: "t", Key: "k"})
	if err == nil || strings.Contains(err.Error(), "s3cret") || !strings.Contains(err.Error(), "api_key=REDACTED") {
		t.Fatalf("unreachable endpoint: %v; want the URL with its query values redacted", err)
	}
	u := strings.Replace(srv.URL, "http://", "http://ops:pa55@", 1)
	h, _ = sink.Webhook(u+"/hook", nil)
	if err := h.Handle(t.Context(), outbox.Message{ID: 1, Topic: "t", Key: "k"}); err == nil || strings.Contains(err.Error(), "pa55") || strings.Contains(err.Error(), "ops") {
		t.Fatalf("unreachable endpoint with user information: %v; want it redacted", err)
	}
}
