package ui

import (
	"crypto/subtle"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"
)

// ErrNeedsToken is returned by CheckListen for an address beyond loopback without a token.
var ErrNeedsToken = errors.New("ui: listening beyond loopback needs an auth token")

// CheckListen checks a listen address (host:port) before anything starts: it must parse,
// and an address that is not loopback — an empty host, 0.0.0.0, [::], a LAN address or a
// host name other than localhost — needs a token (ErrNeedsToken).
func CheckListen(addr string, haveToken bool) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("ui: listen address %q: want host:port (e.g. 127.0.0.1:8080): %w", addr, err)
	}
	if _, err := net.LookupPort("tcp", port); err != nil {
		return fmt.Errorf("ui: listen address %q: bad port: %w", addr, err)
	}
	if haveToken || isLoopback(host) {
		return nil
	}
	return fmt.Errorf("%w: %q is reachable from other machines; listen on 127.0.0.1, or require a token", ErrNeedsToken, addr)
}

func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.IsLoopback()
}

// RequireToken serves h only to requests that carry "Authorization: Bearer <token>"; the
// others get 401. An empty token requires nothing. `pgcoord metrics` uses it: Prometheus
// sends the header (authorization.credentials in its scrape config).
func RequireToken(token string, h http.Handler) http.Handler {
	if token == "" {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !bearerOK(r, token) {
			unauthorized(w)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// bearerOK reports whether r carries token as its Bearer credentials.
func bearerOK(r *http.Request, token string) bool {
	tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	return ok && subtle.ConstantTimeCompare([]byte(tok), []byte(token)) == 1
}

// unauthorized answers 401 and says how to authenticate.
func unauthorized(w http.ResponseWriter) {
	w.Header().Set("WWW-Authenticate", `Bearer realm="pgcoord"`)
	http.Error(w, "authentication required: send Authorization: Bearer <token>", http.StatusUnauthorized)
}
