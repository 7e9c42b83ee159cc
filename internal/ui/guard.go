package ui

import (
	"container/list"
	"crypto/rand"
	"encoding/hex"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/pgcoord/pgcoord/internal/httpsec"
)

// What the dashboard holds in memory for its browsers, each bounded.
const (
	// SessionTTL is how long a browser's login lasts; logging out ends it sooner.
	SessionTTL  = 12 * time.Hour
	maxSessions = 1000 // logins kept; past it, the one closest to expiry is dropped
	// Login attempts: a client address may fail loginBurst times, then once per
	// loginEvery; the limiter remembers the maxLoginClients addresses seen last (an IPv6
	// client counts by its /64).
	loginBurst      = 5
	loginEvery      = 10 * time.Second
	maxLoginClients = 10000
	flashTTL        = time.Minute // how long an action's result waits for its page
	maxFlashes      = 1000
)

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
		return httpsec.LoopbackHost(u.Host, s.cfg.Addr)
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

// loginLimiter slows down guessing: each client address may fail a burst of logins, then
// one per loginEvery (a token bucket each). There is no bucket shared by all clients: one
// that many addresses drain would refuse the operator's own correct token, so an address
// that has not failed always gets its token checked. The memory is bounded and never
// reset: it keeps the maxLoginClients addresses seen most recently; a new address past
// that evicts the one idle longest (the bucket closest to full again), one at a time.
type loginLimiter struct {
	mu      sync.Mutex
	max     int // maxLoginClients; a test may set fewer
	clients map[string]*list.Element
	order   list.List // of *client, the least recently seen first
}

type client struct {
	addr string
	b    bucket
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
		b.tokens = min(float64(n), b.tokens+max(now.Sub(b.at), 0).Seconds()/loginEvery.Seconds())
	}
	b.at = now
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

// allow reports whether a login attempt from addr may be checked now, spending one of
// its attempts.
func (l *loginLimiter) allow(addr string, now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.clients == nil {
		l.clients = map[string]*list.Element{}
	}
	if l.max <= 0 {
		l.max = maxLoginClients
	}
	e := l.clients[addr]
	if e == nil {
		for len(l.clients) >= l.max {
			oldest := l.order.Front()
			delete(l.clients, oldest.Value.(*client).addr)
			l.order.Remove(oldest)
		}
		e = l.order.PushBack(&client{addr: addr})
		l.clients[addr] = e
	} else {
		l.order.MoveToBack(e)
	}
	return e.Value.(*client).b.take(loginBurst, now)
}

// forgive gives addr its burst back after a successful login.
func (l *loginLimiter) forgive(addr string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if e := l.clients[addr]; e != nil {
		delete(l.clients, addr)
		l.order.Remove(e)
	}
}

// tracked returns how many addresses l remembers.
func (l *loginLimiter) tracked() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.clients)
}

// clientAddr is r's client address without its port: what the login limiter counts. An
// IPv6 address counts by its /64, which one host usually holds whole. With
// Config.TrustProxy it is the address the proxy appended to X-Forwarded-For (the last
// one: those before it are whatever the client sent), else the connection's: without
// the flag a client cannot pick a fresh address by sending the header.
func (s *Server) clientAddr(r *http.Request) string {
	h, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		h = r.RemoteAddr
	}
	if s.cfg.TrustProxy {
		if xff := r.Header.Values("X-Forwarded-For"); len(xff) > 0 {
			list := strings.Split(xff[len(xff)-1], ",")
			if ip, err := netip.ParseAddr(strings.TrimSpace(list[len(list)-1])); err == nil {
				h = ip.String()
			}
		}
	}
	if ip, err := netip.ParseAddr(h); err == nil && ip.Is6() && !ip.Is4In6() {
		if p, err := ip.Prefix(64); err == nil {
			return p.String()
		}
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
