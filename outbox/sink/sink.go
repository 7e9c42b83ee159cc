// Package sink holds the outbox handlers the pgcoord CLI relay offers (`pgcoord outbox
// relay --sink webhook=URL|stdout`), so the relay can run as a sidecar without Go code:
// an HTTP webhook and JSON lines on a stream. They are ordinary outbox.Handlers, usable
// from Go as well; anything else (Kafka, NATS, SQS) is a Handler of your own.
//
// # Guarantees
//
//   - Webhook: a message counts as delivered only when the endpoint answered 2xx. Every
//     request carries the message id in an Idempotency-Key header, the same on every
//     redelivery, so the endpoint can apply each message once.
//   - JSONLines: a message counts as delivered once its line was written to the stream
//     (not necessarily flushed to disk or read by anyone). Lines of concurrent deliveries
//     never interleave.
//
// # Failure modes
//
//   - Delivery is at least once: an endpoint that applied a message but whose answer was
//     lost (timeout, connection reset) gets it again. Deduplicate on Idempotency-Key.
//   - A slow endpoint holds its key (and, with relay Concurrency 1, the relay): set
//     WebhookOpts.Timeout well below the relay's ClaimTTL.
package sink

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/pgcoord/pgcoord/internal/base"
	"github.com/pgcoord/pgcoord/outbox"
)

// check makes this package's argument errors ("sink: cause").
var check = base.Check("sink")

// Headers the webhook sink sets on every request.
const (
	HeaderIdempotencyKey = "Idempotency-Key" // the message id, in decimal
	HeaderTopic          = "Pgcoord-Topic"
	HeaderKey            = "Pgcoord-Key"
	HeaderAttempt        = "Pgcoord-Attempt" // 1 for the first delivery, 2 after one failure, ...
)

// DefaultWebhookTimeout bounds one webhook request when WebhookOpts.Timeout is zero.
const DefaultWebhookTimeout = 10 * time.Second

// WebhookOpts are the options of Webhook. A nil *WebhookOpts means the defaults.
type WebhookOpts struct {
	// Client sends the requests. Default: a client with no overall timeout of its own
	// (Timeout applies per request).
	Client *http.Client
	// Timeout bounds each request. Default DefaultWebhookTimeout (10s).
	Timeout time.Duration
	// Header holds static headers sent with every request (an Authorization the endpoint
	// wants, say). They win over a message's headers of the same name, and an
	// Authorization here wins over the endpoint URL's user information. Names must be HTTP
	// tokens, values must hold no control characters, and the sink's own headers
	// (Content-Type, Idempotency-Key, Pgcoord-*) and those that frame the request (Host,
	// Content-Length, Transfer-Encoding, Connection, Keep-Alive, TE, Trailer, Upgrade,
	// Expect) are refused.
	Header http.Header
}

// Webhook returns a handler that POSTs each message to endpoint (an http or https URL):
// the payload as the body (Content-Type application/json for JSON messages, else
// application/octet-stream), the message id in an Idempotency-Key header, the topic, key
// and attempt in Pgcoord-Topic, Pgcoord-Key and Pgcoord-Attempt, WebhookOpts.Header, and
// the message's headers as request headers: those whose names are valid HTTP header names,
// are not reserved (outbox.ReservedHeader: Authorization, Cookie, Host, Proxy-*, ...; Enqueue
// refuses them, and a message written otherwise, through the SQL API say, has them dropped
// here) and are not in WebhookOpts.Header. So a message can never replace the sink's
// credentials (the endpoint URL's user information, or an Authorization in
// WebhookOpts.Header), set cookies, nor change how the request is framed or routed. A 2xx
// answer means delivered; anything else, or no answer within the timeout, is an error
// (the relay retries the message). A bad endpoint or timeout returns an error wrapping
// pgcoord.ErrInvalidArgument. No error shows the endpoint's user information or query
// values (they are replaced by REDACTED), nor the control characters of an answer's body.
func Webhook(endpoint string, opts *WebhookOpts) (outbox.Handler, error) {
	u, err := url.Parse(endpoint)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, check.Invalid("webhook URL %s: want http(s)://host/...", base.RedactURL(endpoint))
	}
	var o WebhookOpts
	if opts != nil {
		o = *opts
	}
	if o.Timeout == 0 {
		o.Timeout = DefaultWebhookTimeout
	}
	if o.Timeout < 0 {
		return nil, check.Invalid("negative webhook timeout %v", o.Timeout)
	}
	if o.Client == nil {
		o.Client = &http.Client{}
	}
	static := make(http.Header, len(o.Header))
	for name, vs := range o.Header {
		if !validHeaderName(name) {
			return nil, check.Invalid("webhook header name %q is not an HTTP token", name)
		}
		if sinkHeader(name) {
			return nil, check.Invalid("webhook header %q is set by the sink or frames the request: it cannot be set", name)
		}
		for _, v := range vs {
			if strings.ContainsFunc(v, func(r rune) bool { return r < ' ' && r != '\t' || r == 0x7f }) {
				return nil, check.Invalid("webhook header %q: the value holds a control character", name)
			}
			static.Add(name, v)
		}
	}
	o.Header = static
	return &webhook{url: u.String(), opts: o}, nil
}

// webhook's errors never show the endpoint's user information or query values (an API key
// in ?api_key=... would otherwise reach the relay's log, the message's last_error, the CLI
// and the dashboard), nor the raw control characters of an endpoint's answer.
type webhook struct {
	url  string
	opts WebhookOpts
}

func (w *webhook) Handle(ctx context.Context, msg outbox.Message) error {
	ctx, cancel := context.WithTimeout(ctx, w.opts.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, w.url, bytes.NewReader(msg.Payload))
	if err != nil {
		return err
	}
	for name, v := range msg.Headers {
		// Reserved names never come from a message, nor names the sink's options set:
		// Enqueue refuses the former, but a row written through the SQL API has not been
		// through Enqueue.
		if validHeaderName(name) && !outbox.ReservedHeader(name) && w.opts.Header.Values(name) == nil {
			req.Header.Set(name, v)
		}
	}
	for name, vs := range w.opts.Header {
		req.Header[name] = append([]string(nil), vs...)
	}
	req.Header.Set("Content-Type", "application/octet-stream")
	if msg.JSON {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set(HeaderIdempotencyKey, strconv.FormatInt(msg.ID, 10))
	req.Header.Set(HeaderTopic, msg.Topic)
	req.Header.Set(HeaderKey, msg.Key)
	req.Header.Set(HeaderAttempt, strconv.Itoa(msg.Attempts+1))
	resp, err := w.opts.Client.Do(req)
	if err != nil {
		return fmt.Errorf("sink: webhook: %w", base.RedactURLError(err))
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20)) // let the connection be reused
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return fmt.Errorf("sink: webhook answered %s: %s", base.Printable(resp.Status), base.Printable(string(bytes.TrimSpace(body))))
	}
	return nil
}

// sinkHeader reports whether name is a header the sink sets itself, or one that frames
// the request: WebhookOpts.Header may not set it.
func sinkHeader(name string) bool {
	switch strings.ToLower(name) {
	case "content-type", "idempotency-key", "host", "content-length", "transfer-encoding", "connection",
		"keep-alive", "te", "trailer", "upgrade", "expect":
		return true
	}
	return strings.HasPrefix(strings.ToLower(name), "pgcoord-")
}

// validHeaderName reports whether name is an HTTP token (RFC 9110), so it can be sent
// as a header name.
func validHeaderName(name string) bool {
	if name == "" {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
			bytes.IndexByte([]byte("!#$%&'*+-.^_`|~"), c) >= 0
		if !ok {
			return false
		}
	}
	return true
}

// Line is one line the JSONLines sink writes, as JSON. Payload holds a JSON message's
// payload as is; other payloads are in PayloadBase64 (standard encoding).
type Line struct {
	ID            int64             `json:"id"`
	Topic         string            `json:"topic"`
	Key           string            `json:"key"`
	Payload       json.RawMessage   `json:"payload,omitempty"`
	PayloadBase64 *string           `json:"payload_base64,omitempty"`
	Headers       map[string]string `json:"headers"`
	Attempt       int               `json:"attempt"`
	CreatedAt     string            `json:"created_at"`
}

// JSONLines returns a handler that writes each message to w as one line of JSON (see
// Line), safe for concurrent use: `pgcoord outbox relay --sink stdout` writes to standard
// output. A write error fails the delivery (the relay retries it).
func JSONLines(w io.Writer) outbox.Handler {
	if w == nil {
		w = io.Discard
	}
	return &jsonLines{w: w}
}

type jsonLines struct {
	mu sync.Mutex
	w  io.Writer
}

func (j *jsonLines) Handle(_ context.Context, msg outbox.Message) error {
	l := Line{
		ID: msg.ID, Topic: msg.Topic, Key: msg.Key, Headers: msg.Headers, Attempt: msg.Attempts + 1,
		CreatedAt: msg.CreatedAt.UTC().Format(time.RFC3339Nano),
	}
	if l.Headers == nil {
		l.Headers = map[string]string{}
	}
	if msg.JSON && json.Valid(msg.Payload) {
		l.Payload = msg.Payload
	} else {
		s := base64.StdEncoding.EncodeToString(msg.Payload)
		l.PayloadBase64 = &s
	}
	b, err := json.Marshal(l)
	if err != nil {
		return fmt.Errorf("sink: json lines: %w", err)
	}
	b = append(b, '\n')
	j.mu.Lock()
	defer j.mu.Unlock()
	if _, err := j.w.Write(b); err != nil {
		return fmt.Errorf("sink: json lines: %w", err)
	}
	return nil
}
