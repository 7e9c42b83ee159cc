// Package httpsec holds the defenses every HTTP server of pgcoord shares (the dashboard
// of `pgcoord ui`, `pgcoord metrics`, the examples): the strength check of auth tokens,
// the Host allow-list that defeats DNS rebinding, and an http.Server whose timeouts and
// header size are bounded, so that a slow or greedy client cannot hold a connection.
package httpsec

import (
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"time"
)

// MinTokenBits is the least entropy a token may have, as CheckToken estimates it.
const MinTokenBits = 128

// MaxTokenLen is the longest token CheckToken accepts (a header carries it on every
// request).
const MaxTokenLen = 512

// MakeToken says how to make a good token.
const MakeToken = "make one with `openssl rand -hex 32`"

// ErrWeakToken is returned by CheckToken.
var ErrWeakToken = errors.New("weak token")

// CheckToken refuses a token that is easy to guess or unfit for a header (ErrWeakToken,
// saying how to make a good one): empty or over MaxTokenLen bytes, one character repeated, a shorter string repeated, a run of neighbouring
// characters (abcd…, 9876…) for half its length or more, or fewer than MinTokenBits bits
// at the most its length and alphabet could hold (length × log2 of the alphabet: 16 for
// hex, 10 for digits, 26 or 52 for letters, 62 or more with digits and symbols). The
// estimate is an upper bound: a token a person chose may pass and still be guessable;
// one from `openssl rand -hex 32` (256 bits) always passes, and so does one from
// `openssl rand -hex 16` (128).
func CheckToken(token string) error {
	n := len(token)
	switch {
	case n == 0:
		return fmt.Errorf("%w: the token is empty: %s", ErrWeakToken, MakeToken)
	case n > MaxTokenLen:
		return fmt.Errorf("%w: the token is %d bytes, over %d: %s", ErrWeakToken, n, MaxTokenLen, MakeToken)
	case strings.Count(token, token[:1]) == n:
		return fmt.Errorf("%w: the token is one character repeated: %s", ErrWeakToken, MakeToken)
	case period(token) <= n/2:
		return fmt.Errorf("%w: the token repeats a string of %d characters: %s", ErrWeakToken, period(token), MakeToken)
	case n > 2 && 2*steps(token) >= n-1:
		return fmt.Errorf("%w: the token is mostly a run of neighbouring characters: %s", ErrWeakToken, MakeToken)
	}
	for _, c := range []byte(token) {
		if c < 0x21 || c > 0x7e {
			return fmt.Errorf("%w: the token has a space, a control character or a non-ASCII byte: %s", ErrWeakToken, MakeToken)
		}
	}
	if bits := TokenBits(token); bits < MinTokenBits {
		return fmt.Errorf("%w: the token holds at most %d bits, fewer than %d: %s", ErrWeakToken, bits, MinTokenBits, MakeToken)
	}
	return nil
}

// TokenBits is the most entropy token can hold: its length times log2 of the size of the
// smallest alphabet it is written in (digits 10, hex 16, letters 26 or 52, with digits 36
// or 62, with other printable characters 32 more).
func TokenBits(token string) int {
	if token == "" {
		return 0
	}
	size := 0
	switch {
	case strings.Trim(token, "0123456789") == "":
		size = 10
	case strings.Trim(token, "0123456789abcdef") == "" || strings.Trim(token, "0123456789ABCDEF") == "":
		size = 16
	default:
		for _, class := range []struct {
			chars string
			n     int
		}{{"0123456789", 10}, {"abcdefghijklmnopqrstuvwxyz", 26}, {"ABCDEFGHIJKLMNOPQRSTUVWXYZ", 26}} {
			if strings.ContainsAny(token, class.chars) {
				size += class.n
			}
		}
		if strings.ContainsFunc(token, func(r rune) bool {
			return !(r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z')
		}) {
			size += 32
		}
	}
	return int(float64(len(token)) * math.Log2(float64(size)))
}

// period is the length of the shortest string that token repeats (len(token) when none).
func period(s string) int {
	for p := 1; p < len(s); p++ {
		if s[p:] == s[:len(s)-p] {
			return p
		}
	}
	return len(s)
}

// steps counts the neighbours in s that differ by one (ab, ba, 01, 10).
func steps(s string) int {
	k := 0
	for i := 1; i < len(s); i++ {
		if d := int(s[i]) - int(s[i-1]); d == 1 || d == -1 {
			k++
		}
	}
	return k
}

// HostAllowed reports whether a request addressed to host (its Host header, host[:port])
// may be served by a server listening at served (host:port) that requires a token or not.
// Without a token only a loopback name (localhost, 127.0.0.0/8, ::1) at the served port
// (any port when served names none) is allowed: a page of another site whose name an
// attacker pointed at 127.0.0.1 (DNS rebinding) names its own host, and is refused. With a
// token, any host: a rebound page has no token.
func HostAllowed(host, served string, haveToken bool) bool {
	return haveToken || LoopbackHost(host, served)
}

// LoopbackHost reports whether host (host[:port], as in a Host header or an Origin) is a
// loopback name (localhost, or an address in 127.0.0.0/8 or ::1) at the port of served
// (any port when served names none).
func LoopbackHost(host, served string) bool {
	name, port, err := net.SplitHostPort(host)
	if err != nil {
		name, port = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]"), ""
	}
	if ip, err := netip.ParseAddr(name); !strings.EqualFold(name, "localhost") && (err != nil || !ip.IsLoopback()) {
		return false
	}
	_, want, err := net.SplitHostPort(served)
	if err != nil || want == "" || want == "0" {
		return true
	}
	return port == want
}

// GuardHost serves h only to requests whose Host HostAllowed allows; the others get
// 421 Misdirected Request.
func GuardHost(served string, haveToken bool, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !HostAllowed(r.Host, served, haveToken) {
			MisdirectedRequest(w)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// MisdirectedRequest answers 421 to a request addressed to a name the server does not
// answer to.
func MisdirectedRequest(w http.ResponseWriter) {
	http.Error(w, "misdirected request: without a token this server answers only at localhost, 127.0.0.1 or [::1]", http.StatusMisdirectedRequest)
}

// The bounds of NewServer's servers: a variable so that this package's tests can shorten
// them.
var limits = struct {
	readHeader, read, idle time.Duration
	maxHeaderBytes         int
}{readHeader: 10 * time.Second, read: 30 * time.Second, idle: 2 * time.Minute, maxHeaderBytes: 64 << 10}

// NewServer returns a server of h whose clients must send a request's headers within 10
// seconds and the whole request within 30, whose idle keep-alive connections close after
// 2 minutes, and which refuses headers over 64 KiB (431): a client that sends its headers
// byte by byte (slowloris) or keeps connections open cannot hold the server's
// connections. Responses have no time limit (a long /metrics scrape still finishes).
func NewServer(h http.Handler) *http.Server {
	return &http.Server{Handler: h, ReadHeaderTimeout: limits.readHeader, ReadTimeout: limits.read,
		IdleTimeout: limits.idle, MaxHeaderBytes: limits.maxHeaderBytes}
}
