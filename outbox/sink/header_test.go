package sink_test

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/pgcoord/pgcoord/outbox"
	"github.com/pgcoord/pgcoord/outbox/sink"
	"github.com/pgcoord/pgcoord/pgcoord"
)

// hostile are the headers of a message that tries to speak for someone else through the
// webhook: as a row written through the SQL API (which Enqueue's check never saw).
var hostile = map[string]string{
	"Authorization": "Bearer attacker", "Cookie": "session=attacker", "Proxy-Authorization": "Basic eDp5",
	"Connection": "close", "Host": "evil.example", "X-Forwarded-For": "10.0.0.1", "Idempotency-Key": "1",
	"Pgcoord-Topic": "forged", "Trace-Id": "t-1", "X-Static": "from-message",
}

type seen struct {
	mu  sync.Mutex
	req []*http.Request
}

func (s *seen) serve(t *testing.T) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		s.req = append(s.req, r)
		s.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(srv.Close)
	return srv
}

func (s *seen) last(t *testing.T) *http.Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.req) == 0 {
		t.Fatal("no request reached the endpoint")
	}
	return s.req[len(s.req)-1]
}

// TestWebhookMessageHeadersCannotReplaceCredentials: a message's headers cannot replace the
// credentials of the endpoint URL's user information nor those of WebhookOpts.Header, nor
// set cookies, proxy credentials, hop-by-hop headers, Host or the sink's own headers;
// ordinary headers still pass.
func TestWebhookMessageHeadersCannotReplaceCredentials(t *testing.T) {
	t.Parallel()
	var s seen
	srv := s.serve(t)
	msg := outbox.Message{ID: 7, Topic: "orders", Key: "k", Headers: hostile}

	h, err := sink.Webhook(strings.Replace(srv.URL, "http://", "http://ops:pa55@", 1)+"/hook", nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Handle(t.Context(), msg); err != nil {
		t.Fatal(err)
	}
	r := s.last(t)
	if user, pass, ok := r.BasicAuth(); !ok || user != "ops" || pass != "pa55" {
		t.Errorf("Authorization = %q; want the URL's user information (ops)", r.Header.Get("Authorization"))
	}
	checkHostile(t, r, srv)
	if got := r.Header.Get("X-Static"); got != "from-message" {
		t.Errorf("X-Static = %q, want the message's", got)
	}

	static := http.Header{"Authorization": {"Bearer sink-own"}, "X-Static": {"from-sink"}}
	h, err = sink.Webhook(strings.Replace(srv.URL, "http://", "http://ops:pa55@", 1)+"/hook", &sink.WebhookOpts{Header: static})
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Handle(t.Context(), msg); err != nil {
		t.Fatal(err)
	}
	r = s.last(t)
	if got := r.Header.Values("Authorization"); len(got) != 1 || got[0] != "Bearer sink-own" {
		t.Errorf("Authorization = %q; want the sink's own static header, once", got)
	}
	if got := r.Header.Values("X-Static"); len(got) != 1 || got[0] != "from-sink" {
		t.Errorf("X-Static = %q; want the sink's static header, not the message's", got)
	}
	checkHostile(t, r, srv)
}

func checkHostile(t *testing.T, r *http.Request, srv *httptest.Server) {
	t.Helper()
	for _, name := range []string{"Cookie", "Proxy-Authorization", "X-Forwarded-For"} {
		if got := r.Header.Get(name); got != "" {
			t.Errorf("%s = %q reached the endpoint from the message", name, got)
		}
	}
	if r.Close {
		t.Error("the message's Connection: close reached the endpoint")
	}
	if r.Host != strings.TrimPrefix(srv.URL, "http://") {
		t.Errorf("Host = %q, want the endpoint's", r.Host)
	}
	if r.Header.Get("Idempotency-Key") != "7" || r.Header.Get("Pgcoord-Topic") != "orders" {
		t.Errorf("Idempotency-Key %q, Pgcoord-Topic %q; want the sink's own", r.Header.Get("Idempotency-Key"), r.Header.Get("Pgcoord-Topic"))
	}
	if r.Header.Get("Trace-Id") != "t-1" {
		t.Errorf("Trace-Id = %q, want the message's ordinary header", r.Header.Get("Trace-Id"))
	}
}

// TestWebhookHeaderOptionRefusesBadHeaders: static headers that would frame the request,
// replace the sink's own, or smuggle a line are refused when the sink is made.
func TestWebhookHeaderOptionRefusesBadHeaders(t *testing.T) {
	t.Parallel()
	for _, hd := range []http.Header{
		{"Host": {"x"}}, {"Content-Length": {"1"}}, {"Transfer-Encoding": {"chunked"}}, {"Connection": {"close"}},
		{"Content-Type": {"text/plain"}}, {"Idempotency-Key": {"1"}}, {"Pgcoord-Key": {"k"}},
		{"Bad Name": {"v"}}, {"X-Ok": {"a\r\nInjected: 1"}}, {"X-Ok": {"a\x00"}},
	} {
		if _, err := sink.Webhook("http://hook.example/", &sink.WebhookOpts{Header: hd}); !errors.Is(err, pgcoord.ErrInvalidArgument) {
			t.Errorf("Header %q: err = %v, want ErrInvalidArgument", hd, err)
		}
	}
	if _, err := sink.Webhook("http://hook.example/", &sink.WebhookOpts{Header: http.Header{"Authorization": {"Bearer x"}, "X-Tenant": {"a\tb"}}}); err != nil {
		t.Errorf("credentials in Header: %v", err)
	}
}
