package ui

import (
	"crypto/rand"
	"encoding/hex"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"
)

// What the dashboard holds in memory for its browsers, each bounded.
const (
	// MinTokenLen is the shortest token New accepts: 32 characters, such as
	// `openssl rand -hex 16` prints (128 bits).
	MinTokenLen = 32
	// SessionTTL is how long a browser's login lasts; logging out ends it sooner.
	SessionTTL  = 12 * time.Hour
	maxSessions = 1000 // logins kept; past it, the one closest to expiry is dropped
	// Login attempts: a client address may fail loginBurst times, then once per
	// loginEvery; all clients together globalLoginBurst times, then once per loginEvery.
	loginBurst       = 5
	globalLoginBurst = 50
	loginEvery       = 10 * time.Second
	maxLoginClients  = 10000
	flashTTL         = time.Minute // how long an action's result waits for its page
	maxFlashes       = 1000
)

// hostAllowed reports whether r may be served at the Host it names. Without a token the
// dashboard answers only to a loopback name (localhost, 127.0.0.1, [::1]) at the port it
// serves: a page of another site whose name an attacker pointed at 127.0.0.1 (DNS
// rebinding) names its own host, and is refused. With a token, any Host: a rebound page
// has no session and no token.
func (s *Server) hostAllowed(host string) bool {
	if s.cfg.Token != "" {
		return true
	}
	return s.loopbackHost(host)
}

// loopbackHost reports whether host (host[:port], as in a Host header or an Origin) is a
// loopback name (localhost, or an address in 127.0.0.0/8 or ::1) at the served port (any
// port when Config.Addr names none).
func (s *Server) loopbackHost(host string) bool {
	name, port, err := net.SplitHostPort(host)
	if err != nil {
		name, port = host, ""
	}
	if ip := net.ParseIP(name); !strings.EqualFold(name, "localhost") && (ip == nil || !ip.IsLoopback()) {
		return false
	}
	_, served, err := net.SplitHostPort(s.cfg.Addr)
	if err != nil || served == "" || served == "0" {
		return true
	}
	return port == served
}

// originAllowed reports whether a POST's Origin header, if present, is this dashboard as
// its operator reaches it: without a token a loopback name at the served port, with one
// the host the request was sent to (the login cookie and the CSRF cookie are that host's
// alone). It is compared with the served address, never with a Host the client chose
// alone.
func (s *Server) originAllowed(r *http.Request) bool {
	o := r.Header.Get("Origin")
	if o == "" {
		return true // not sent by older browsers and by scripts; the CSRF token still holds
	}
	u, err := url.Parse(o)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Path != "" {
		return false
	}
	if s.cfg.Token == "" {
		return s.loopbackHost(u.Host)
	}
	return strings.EqualFold(u.Host, r.Host)
}

// sessions are the browsers that logged in: a random id in their cookie, its expiry and
// the operator's name here, so that logging out (or expiry) ends a login for good.
type sessions struct {
	mu  sync.Mutex
	exp map[string]session
}

type session struct {
	exp   time.Time
	actor string // the name given at login, for the audit log
}

func (ss *sessions) start(actor string, now time.Time) string {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	id := hex.EncodeToString(b)
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.exp == nil {
		ss.exp = map[string]session{}
	}
	if len(ss.exp) >= maxSessions {
		oldest, first := "", time.Time{}
		for k, e := range ss.exp {
			if oldest == "" || e.exp.Before(first) {
				oldest, first = k, e.exp
			}
		}
		delete(ss.exp, oldest)
	}
	ss.exp[id] = session{exp: now.Add(SessionTTL), actor: actor}
	return id
}

// get returns the session of id, if it has not expired.
func (ss *sessions) get(id string, now time.Time) (session, bool) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	e, ok := ss.exp[id]
	if ok && !now.Before(e.exp) {
		delete(ss.exp, id)
		return session{}, false
	}
	return e, ok
}

func (ss *sessions) end(id string) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	delete(ss.exp, id)
}

// loginLimiter slows down guessing: each client address, and all of them together, may
// fail a burst of logins, then one per loginEvery (a token bucket each).
type loginLimiter struct {
	mu      sync.Mutex
	clients map[string]*bucket
	global  bucket
}

type bucket struct {
	tokens float64
	at     time.Time
}

// take spends one attempt of b (burst n), reporting whether one was left.
func (b *bucket) take(n int, now time.Time) bool {
	if b.at.IsZero() {
		b.tokens = float64(n)
	} else {
		b.tokens = min(float64(n), b.tokens+now.Sub(b.at).Seconds()/loginEvery.Seconds())
	}
	b.at = now
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

// allow reports whether a login attempt from addr may be checked now; a refused attempt
// spends nothing.
func (l *loginLimiter) allow(addr string, now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.clients == nil {
		l.clients = map[string]*bucket{}
	}
	c := l.clients[addr]
	if c == nil {
		if len(l.clients) >= maxLoginClients {
			clear(l.clients) // forgetting clients only gives them their burst back
		}
		c = &bucket{}
		l.clients[addr] = c
	}
	saveC, saveG := *c, l.global
	if !c.take(loginBurst, now) || !l.global.take(globalLoginBurst, now) {
		*c, l.global = saveC, saveG
		return false
	}
	return true
}

// forgive gives addr its burst back after a successful login.
func (l *loginLimiter) forgive(addr string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.clients, addr)
}

// clientAddr is r's client address without its port: what the login limiter counts.
func clientAddr(r *http.Request) string {
	h, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return h
}

// flashes hold each action's result for the page it returns to, which shows it by id:
// a link cannot make the dashboard show a sentence of its own.
type flashes struct {
	mu  sync.Mutex
	msg map[string]flash
}

type flash struct {
	text string
	exp  time.Time
}

func (f *flashes) put(text string, now time.Time) string {
	b := make([]byte, 12)
	_, _ = rand.Read(b)
	id := hex.EncodeToString(b)
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.msg == nil {
		f.msg = map[string]flash{}
	}
	if len(f.msg) >= maxFlashes {
		for k, v := range f.msg {
			if !now.Before(v.exp) {
				delete(f.msg, k)
			}
		}
		if len(f.msg) >= maxFlashes {
			clear(f.msg) // a flood of actions within a minute: older results go unshown
		}
	}
	f.msg[id] = flash{text: text, exp: now.Add(flashTTL)}
	return id
}

// get returns the message stored under id, if it has not expired.
func (f *flashes) get(id string, now time.Time) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	m, ok := f.msg[id]
	if !ok || !now.Before(m.exp) {
		return ""
	}
	return m.text
}
