package ratelimit

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/pgcoord/pgcoord/pgcoord"
)

// MiddlewareConfig configures Middleware.
type MiddlewareConfig struct {
	// Limits says which limits a request is charged to, in one call (e.g. its API key's
	// and its tenant's). Required. An error answers 400 with its text: return errors
	// meant for the client (a missing API key), nothing secret.
	Limits func(r *http.Request) ([]Limit, error)
	// Cost is a request's cost in units (weighted requests). Default: 1.
	Cost func(r *http.Request) int64
	// FailOpen lets requests through when the limiter's database cannot answer. Default:
	// they are refused with 503 (a limit that disappears under load is no limit).
	FailOpen bool
	// Logger gets the limiter's failures. Default: slog.Default().
	Logger *slog.Logger
	// Opts are the options of each call (a Tracer).
	Opts *Opts
}

// Middleware limits the rate of requests (net/http, any router). Each request is one
// Allow of the limits Config.Limits names. A refused request gets 429 with Retry-After
// and an RFC 9457 problem document, and is not passed on. Every answer carries the
// RateLimit-Policy and RateLimit headers of the IETF httpapi draft
// ("The RateLimit header fields for HTTP") for the binding policy: its quota and window,
// and the units left and the seconds until the key is at rest.
func Middleware(db pgcoord.DBTX, cfg MiddlewareConfig) (func(http.Handler) http.Handler, error) {
	if err := check.DB(db); err != nil {
		return nil, err
	}
	if cfg.Limits == nil {
		return nil, check.Invalid("MiddlewareConfig.Limits is required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			limits, err := cfg.Limits(r)
			if err != nil {
				problem(w, http.StatusBadRequest, "Bad Request", err.Error())
				return
			}
			cost := int64(1)
			if cfg.Cost != nil {
				cost = cfg.Cost(r)
			}
			d, err := Allow(r.Context(), db, cost, limits, cfg.Opts)
			if errors.Is(err, pgcoord.ErrInvalidArgument) || errors.Is(err, pgcoord.ErrInvalidName) || errors.Is(err, ErrUnknownPolicy) {
				// A misconfiguration (a bad key or cost, a policy that does not exist): loud,
				// and never a reason to let requests through.
				cfg.Logger.ErrorContext(r.Context(), "ratelimit: the request's limits are wrong", "method", r.Method, "path", r.URL.Path, "error", err)
				problem(w, http.StatusInternalServerError, "Internal Server Error", "the rate limits of this request are misconfigured")
				return
			}
			if err != nil {
				cfg.Logger.ErrorContext(r.Context(), "ratelimit: the limiter failed", "method", r.Method, "path", r.URL.Path, "error", err)
				if cfg.FailOpen {
					next.ServeHTTP(w, r)
					return
				}
				w.Header().Set("Retry-After", "1")
				problem(w, http.StatusServiceUnavailable, "Service Unavailable", "the rate limiter could not decide; retry shortly")
				return
			}
			setHeaders(w.Header(), d)
			if !d.Allowed {
				w.Header().Set("Retry-After", strconv.FormatInt(ceilSeconds(d.RetryAfter), 10))
				problem(w, http.StatusTooManyRequests, "Too Many Requests",
					fmt.Sprintf("rate limit %q exceeded: retry in %d s", d.Policy, ceilSeconds(d.RetryAfter)))
				return
			}
			next.ServeHTTP(w, r)
		})
	}, nil
}

// setHeaders sets the draft's fields for the binding policy: RateLimit-Policy
// `"name";q=quota;w=window` and RateLimit `"name";r=remaining;t=reset`. The quota is the
// policy's burst over its window burst × Period / Rate (what a key at rest may spend at
// once, and the time it takes to earn it back).
func setHeaders(h http.Header, d Decision) {
	name := sfString(d.Policy)
	window := ceilSeconds(time.Duration(float64(d.Quota.Period) / float64(d.Quota.Rate) * float64(d.Quota.Burst)))
	h.Set("RateLimit-Policy", fmt.Sprintf("%s;q=%d;w=%d", name, d.Quota.Burst, max(window, 1)))
	h.Set("RateLimit", fmt.Sprintf("%s;r=%d;t=%d", name, d.Remaining, ceilSeconds(d.ResetAfter)))
}

// sfString is s as an RFC 8941 sf-string: quoted, with '"' and '\' escaped, and each byte
// an sf-string cannot hold (outside printable ASCII, e.g. of 'é') and '%' percent-encoded.
func sfString(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '"' || c == '\\':
			b.WriteByte('\\')
			b.WriteByte(c)
		case c < 0x20 || c > 0x7e || c == '%':
			fmt.Fprintf(&b, "%%%02X", c)
		default:
			b.WriteByte(c)
		}
	}
	b.WriteByte('"')
	return b.String()
}

func ceilSeconds(d time.Duration) int64 { return int64(math.Ceil(d.Seconds())) }

// problem writes an RFC 9457 problem document.
func problem(w http.ResponseWriter, status int, title, detail string) {
	body, _ := json.Marshal(map[string]any{"type": "about:blank", "title": title, "status": status, "detail": detail})
	w.Header().Set("Content-Type", "application/problem+json")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	_, _ = w.Write(body)
}
