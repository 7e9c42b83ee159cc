package idempotency

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/pgcoord"
)

// Defaults of Config.
const (
	DefaultHeader          = "Idempotency-Key"
	DefaultReplayHeader    = "Idempotent-Replayed"
	DefaultMaxRequestBytes = 1 << 20
)

// Config configures Middleware. A nil *Config means the defaults; a zero field means its
// default.
type Config struct {
	// Header is the request header carrying the key. Default DefaultHeader
	// ("Idempotency-Key"). Its value is read with ParseKey; a request with the header twice
	// is refused with InvalidKeyStatus.
	Header string
	// Methods are the methods the middleware applies to; requests with other methods pass
	// through untouched. Default POST and PATCH (the non-idempotent methods; PUT and DELETE
	// are idempotent by definition).
	Methods []string
	// KeyOptional lets requests without a key pass through, unprotected. By default a
	// request of Methods without a key is refused with MissingKeyStatus.
	KeyOptional bool
	// Scope returns the scope of a request's key: keys are unique per scope. Required:
	// scope keys by what authenticates the client (user or account id), or two clients that
	// send the same key and body would get one stored response — the first client's. An API
	// without authentication, whose clients are all one principal, returns a constant. An
	// error refuses the request with 500, logged.
	Scope func(r *http.Request) (string, error)
	// FingerprintHeaders names request headers that belong to the fingerprint besides the
	// method, path and body (say "Content-Type", or a tenant header).
	FingerprintHeaders []string
	// StoreHeaders names the response headers stored and replayed. Default Content-Type
	// and Location.
	StoreHeaders []string
	// ReplayHeader is set to "true" on replayed responses. Default DefaultReplayHeader
	// ("Idempotent-Replayed").
	ReplayHeader string
	// Retention is how long keys are kept (BeginOpts.Retention). Default DefaultRetention.
	Retention time.Duration
	// Wait, if positive, makes a request whose key is in flight wait up to Wait for the
	// first one to finish, then get its response replayed (or execute, if the first one
	// failed). Zero (the default) answers InFlightStatus at once. As BeginOpts.Wait: a
	// positive Wait is 1ms to 1h.
	Wait time.Duration
	// Lease is how long an attempt holds its key without a renewal (BeginOpts.Lease): a
	// process that dies mid-request leaves its key in flight (409) until then. Default
	// DefaultLease.
	Lease time.Duration
	// Atomic runs the handler inside the key's transaction: Tx(r.Context()) is the pgx.Tx
	// to write with; the writes commit with the stored response, or roll back with it. The
	// transaction holds a connection of the pool while the handler runs: at most half of
	// the pool's MaxConns requests run so at once, and the others are answered 503 with
	// Retry-After (ErrBusy). Without Atomic, no connection is held while the handler runs.
	Atomic bool
	// MaxRequestBytes bounds the request body read for the fingerprint: a larger one is
	// refused with 413 before anything is stored. Default DefaultMaxRequestBytes (1 MiB).
	MaxRequestBytes int64
	// MaxResponseBytes bounds the stored response body (BeginOpts.MaxResponseBytes): a
	// larger response is not sent; the attempt rolls back, nothing is stored, and the client
	// gets TooLargeStatus (as for stored headers over MaxStoredHeaderBytes). Default
	// DefaultMaxResponseBytes (1 MiB); at most MaxStoredBodyBytes (16 MiB).
	MaxResponseBytes int
	// The statuses of the middleware's own answers, by default those of the IETF draft
	// (see the package documentation): MissingKeyStatus 400, InvalidKeyStatus 400,
	// MismatchStatus 422, InFlightStatus 409, ExpiredStatus 422, TooLargeStatus 500. An
	// Atomic request beyond the pool's Atomic share (ErrBusy) is answered 503 with
	// Retry-After.
	MissingKeyStatus, InvalidKeyStatus, MismatchStatus, InFlightStatus, ExpiredStatus, TooLargeStatus int
	// Logger logs store failures (answered 500). Default slog.Default().
	Logger *slog.Logger
	// Tracer, if set, traces each request's Begin (BeginOpts.Tracer). Default nil: not
	// traced.
	Tracer pgcoord.Tracer
}

// Middleware returns net/http middleware that makes the wrapped handler idempotent with
// keys stored in pool (see the package documentation for the semantics). It returns an
// error wrapping pgcoord.ErrInvalidArgument for a nil pool, a nil cfg or Config.Scope, or
// a Config field out of range.
//
// The handler's response is buffered (a streaming handler gets no benefit from Flush) and
// sent only after it is stored, so a client never sees a response that a retry could not
// replay. A response with a 5xx status, and a panic, are not stored: the attempt rolls back
// and the next retry executes. The handler finds its attempt with FromContext (the key,
// the recovery point, derived keys) and, with Atomic, its transaction with Tx.
func Middleware(pool *pgxpool.Pool, cfg *Config) (func(http.Handler) http.Handler, error) {
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	if pool == nil {
		return nil, check.Invalid("nil pool")
	}
	if c.Atomic && pool.Stat().MaxConns() < 2 {
		return nil, check.Invalid("Config.Atomic holds a connection while the handler runs: the pool needs MaxConns of at least 2, not %d", pool.Stat().MaxConns())
	}
	return func(next http.Handler) http.Handler {
		return &middleware{pool: pool, c: c, next: next}
	}, nil
}

func (cfg *Config) withDefaults() (Config, error) {
	var c Config
	if cfg != nil {
		c = *cfg
	}
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	if c.Header == "" {
		c.Header = DefaultHeader
	}
	if c.Methods == nil {
		c.Methods = []string{http.MethodPost, http.MethodPatch}
	}
	if c.Scope == nil {
		return c, check.Invalid("Config.Scope is required: scope keys by what authenticates the client (user or account id), so that two clients never share a stored response")
	}
	if c.StoreHeaders == nil {
		c.StoreHeaders = []string{"Content-Type", "Location"}
	}
	if c.ReplayHeader == "" {
		c.ReplayHeader = DefaultReplayHeader
	}
	if c.Retention == 0 {
		c.Retention = DefaultRetention
	}
	if c.MaxRequestBytes == 0 {
		c.MaxRequestBytes = DefaultMaxRequestBytes
	}
	def(&c.MaxResponseBytes, DefaultMaxResponseBytes)
	def(&c.MissingKeyStatus, http.StatusBadRequest)
	def(&c.InvalidKeyStatus, http.StatusBadRequest)
	def(&c.MismatchStatus, http.StatusUnprocessableEntity)
	def(&c.InFlightStatus, http.StatusConflict)
	def(&c.ExpiredStatus, http.StatusUnprocessableEntity)
	def(&c.TooLargeStatus, http.StatusInternalServerError)
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	for _, s := range []int{c.MissingKeyStatus, c.InvalidKeyStatus, c.MismatchStatus, c.InFlightStatus, c.ExpiredStatus, c.TooLargeStatus} {
		if s < 400 || s > 599 {
			return c, check.Invalid("status %d is not an error status (400 to 599)", s)
		}
	}
	if _, err := c.beginOpts().withDefaults(); err != nil {
		return c, err
	}
	if c.MaxRequestBytes < 0 {
		return c, check.Invalid("negative MaxRequestBytes")
	}
	return c, nil
}

func (c *Config) beginOpts() *BeginOpts {
	return &BeginOpts{Retention: c.Retention, Lease: c.Lease, Wait: c.Wait, Atomic: c.Atomic, MaxResponseBytes: c.MaxResponseBytes, Tracer: c.Tracer}
}

type middleware struct {
	pool *pgxpool.Pool
	c    Config
	next http.Handler
}

func (m *middleware) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !slices.Contains(m.c.Methods, r.Method) {
		m.next.ServeHTTP(w, r)
		return
	}
	values := r.Header.Values(m.c.Header)
	if len(values) > 1 {
		problem(w, m.c.InvalidKeyStatus, "Invalid idempotency key", fmt.Sprintf("this request has %d %s headers; send exactly one", len(values), m.c.Header))
		return
	}
	raw := ""
	if len(values) == 1 {
		raw = values[0]
	}
	if raw == "" {
		if m.c.KeyOptional {
			m.next.ServeHTTP(w, r)
			return
		}
		problem(w, m.c.MissingKeyStatus, "Idempotency key required", fmt.Sprintf("this request needs an %s header", m.c.Header))
		return
	}
	key, err := ParseKey(raw)
	if err != nil {
		problem(w, m.c.InvalidKeyStatus, "Invalid idempotency key", err.Error())
		return
	}
	scope, err := m.c.Scope(r)
	if err == nil {
		err = check.Name("idempotency scope", scope)
	}
	if err != nil {
		m.fail(w, r, "scope", err)
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, m.c.MaxRequestBytes))
	if err != nil {
		if errors.As(err, new(*http.MaxBytesError)) {
			problem(w, http.StatusRequestEntityTooLarge, "Request body too large",
				fmt.Sprintf("an idempotent request body may have at most %d bytes", m.c.MaxRequestBytes))
			return
		}
		problem(w, http.StatusBadRequest, "Unreadable request body", err.Error())
		return
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	fp := Fingerprint(r.Method, r.URL.RequestURI(), body, r.Header, m.c.FingerprintHeaders...)

	ctx := r.Context()
	a, err := Begin(ctx, m.pool, scope, key, fp, m.c.beginOpts())
	switch {
	case errors.Is(err, ErrInFlight):
		w.Header().Set("Retry-After", "1")
		problem(w, m.c.InFlightStatus, "Request in progress", "a request with this idempotency key is still being processed; retry later")
		return
	case errors.Is(err, ErrBusy):
		w.Header().Set("Retry-After", "1")
		problem(w, http.StatusServiceUnavailable, "Too many requests in progress", "too many idempotent requests hold database connections; retry later")
		return
	case errors.Is(err, ErrMismatch):
		problem(w, m.c.MismatchStatus, "Idempotency key reused", "this idempotency key was used for a different request")
		return
	case errors.Is(err, ErrExpired):
		problem(w, m.c.ExpiredStatus, "Idempotency key expired", "this idempotency key has expired and cannot be used again; use a new key")
		return
	case err != nil:
		m.fail(w, r, "begin", err)
		return
	}
	defer a.Close(ctx)
	if rep := a.Replay(); rep != nil {
		w.Header().Set(m.c.ReplayHeader, "true")
		send(w, rep.Header, rep.Status, rep.Body)
		return
	}

	rec := &recorder{header: http.Header{}, limit: m.c.MaxResponseBytes}
	m.run(rec, r.WithContext(context.WithValue(ctx, attemptKey{}, a)), a)
	switch {
	case rec.tooLarge:
		a.Close(ctx)
		problem(w, m.c.TooLargeStatus, "Response too large", fmt.Sprintf("%v: the response exceeds %d bytes; nothing was stored", ErrTooLarge, m.c.MaxResponseBytes))
		return
	case rec.status >= 500:
		a.Close(ctx) // not stored: the next attempt executes
		send(w, rec.header, rec.status, rec.body.Bytes())
		return
	}
	stored := http.Header{}
	for _, name := range m.c.StoreHeaders {
		if v, ok := rec.header[http.CanonicalHeaderKey(name)]; ok {
			stored[http.CanonicalHeaderKey(name)] = v
		}
	}
	if err := a.Complete(ctx, Response{Status: rec.status, Header: stored, Body: rec.body.Bytes()}); err != nil {
		if errors.Is(err, ErrTooLarge) { // the stored headers: nothing was stored
			problem(w, m.c.TooLargeStatus, "Response too large", err.Error())
			return
		}
		m.fail(w, r, "store the response", err)
		return
	}
	send(w, rec.header, rec.status, rec.body.Bytes())
}

// run calls the handler; a panic rolls the attempt back and goes on.
func (m *middleware) run(rec *recorder, r *http.Request, a *Attempt) {
	defer func() {
		if p := recover(); p != nil {
			a.Close(r.Context())
			panic(p)
		}
	}()
	m.next.ServeHTTP(rec, r)
	if rec.status == 0 {
		rec.status = http.StatusOK
	}
}

// fail answers 500 for a failure of the store (or of Scope), logged.
func (m *middleware) fail(w http.ResponseWriter, r *http.Request, what string, err error) {
	m.c.Logger.ErrorContext(r.Context(), "idempotency: "+what+" failed", "method", r.Method, "path", r.URL.Path, "error", err)
	problem(w, http.StatusInternalServerError, "Idempotency store failed", "the request could not be made idempotent; nothing was stored")
}

// send writes a response.
func send(w http.ResponseWriter, header http.Header, status int, body []byte) {
	for k, v := range header {
		w.Header()[k] = v
	}
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// problem writes an RFC 9457 problem document: the middleware's own answers, never stored.
func problem(w http.ResponseWriter, status int, title, detail string) {
	body, _ := json.Marshal(map[string]any{"type": "about:blank", "title": title, "status": status, "detail": detail})
	send(w, http.Header{"Content-Type": {"application/problem+json"}}, status, body)
}

// recorder buffers the handler's response, up to limit bytes of body.
type recorder struct {
	header   http.Header
	status   int
	body     bytes.Buffer
	limit    int
	tooLarge bool
}

func (rec *recorder) Header() http.Header { return rec.header }

func (rec *recorder) WriteHeader(status int) {
	if rec.status == 0 {
		rec.status = status
	}
}

func (rec *recorder) Write(b []byte) (int, error) {
	rec.WriteHeader(http.StatusOK)
	if rec.tooLarge || rec.body.Len()+len(b) > rec.limit {
		rec.tooLarge = true
		rec.body.Reset()
		return len(b), nil
	}
	return rec.body.Write(b)
}

type attemptKey struct{}

// FromContext returns the attempt the middleware runs the handler for, or nil outside the
// middleware (and for requests it let pass through). The handler uses it for the key's
// recovery point (Attempt.RecoveryPoint, Attempt.Checkpoint) and derived keys
// (Attempt.DerivedKey). It must not call Complete or Close: the middleware does.
func FromContext(ctx context.Context) *Attempt {
	a, _ := ctx.Value(attemptKey{}).(*Attempt)
	return a
}

// Tx returns the transaction of the attempt in ctx when the middleware runs with Atomic,
// else nil: the handler's writes through it commit with the stored response or not at all.
func Tx(ctx context.Context) pgx.Tx {
	if a := FromContext(ctx); a != nil {
		return a.Tx()
	}
	return nil
}
