package ui

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/pgcoord/pgcoord/internal/base"
	"github.com/pgcoord/pgcoord/internal/ui/audit"
)

// Cookie names.
const (
	authCookie = "pgcoord_ui_auth" // the login: a random session id (sessions)
	csrfCookie = "pgcoord_ui_csrf" // a random value per browser; forms carry its HMAC
)

// mac returns the hex HMAC-SHA256 of purpose and value under the server's secret.
func (s *Server) mac(purpose, value string) string {
	m := hmac.New(sha256.New, s.secret)
	m.Write([]byte(purpose + "\x00" + value))
	return hex.EncodeToString(m.Sum(nil))
}

// authenticated reports whether r may be served: no token is configured, or r carries it
// as a Bearer header or the cookie of a login that has not expired or logged out.
func (s *Server) authenticated(r *http.Request) bool {
	if s.cfg.Token == "" {
		return true
	}
	if r.Header.Get("Authorization") != "" {
		return bearerOK(r, s.cfg.Token)
	}
	_, ok := s.session(r)
	return ok
}

// session returns r's login, if its cookie names a live one.
func (s *Server) session(r *http.Request) (session, bool) {
	c, err := r.Cookie(authCookie)
	if err != nil {
		return session{}, false
	}
	return s.sessions.get(c.Value, time.Now())
}

// refuseUnauthenticated sends browsers to the login form and tells others to authenticate.
func (s *Server) refuseUnauthenticated(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodGet && strings.Contains(r.Header.Get("Accept"), "text/html") {
		http.Redirect(w, r, "/login?next="+url.QueryEscape(s.safeNext(r.URL.RequestURI())), http.StatusSeeOther)
		return
	}
	unauthorized(w)
}

// actor names who acts, for the audit log: the name given at login and the token's
// fingerprint; a Bearer client by the fingerprint alone; without a token, Config.Actor
// (`pgcoord ui --actor`, by default the OS user and host), the dashboard then listening on
// loopback only.
func (s *Server) actor(r *http.Request) string {
	if s.cfg.Token == "" {
		return s.cfg.Actor
	}
	sum := sha256.Sum256([]byte(s.cfg.Token))
	fp := "token:" + hex.EncodeToString(sum[:4])
	if ses, ok := s.session(r); ok {
		return ses.actor + " (" + fp + ")"
	}
	return "bearer " + fp
}

type loginView struct {
	Next, Name, Error string
}

func (s *Server) loginPage(w http.ResponseWriter, r *http.Request) {
	if s.cfg.Token == "" {
		http.Redirect(w, r, "/", http.StatusSeeOther)
		return
	}
	s.render(w, http.StatusOK, "login", loginView{Next: s.safeNext(r.URL.Query().Get("next"))})
}

// login checks a token, at most a burst of tries per client address (then one every
// loginEvery), and starts a session that lasts SessionTTL.
func (s *Server) login(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, 16<<10)
	if s.cfg.Token == "" || r.ParseForm() != nil {
		http.Redirect(w, r, "/", http.StatusSeeOther)
		return
	}
	next, name := s.safeNext(r.PostForm.Get("next")), strings.TrimSpace(r.PostForm.Get("name"))
	v := loginView{Next: next, Name: name}
	if !s.originAllowed(r) {
		v.Error = "the form was sent from another site"
		s.render(w, http.StatusForbidden, "login", v)
		return
	}
	if !s.limiter.allow(s.clientAddr(r), time.Now()) {
		w.Header().Set("Retry-After", fmt.Sprint(int(loginEvery.Seconds())))
		v.Error = "too many failed sign-ins: wait and try again"
		s.render(w, http.StatusTooManyRequests, "login", v)
		return
	}
	if err := audit.CheckActor(name); err != nil {
		v.Error = "your name, for the audit log: " + err.Error()
		s.render(w, http.StatusBadRequest, "login", v)
		return
	}
	if subtle.ConstantTimeCompare([]byte(r.PostForm.Get("token")), []byte(s.cfg.Token)) != 1 {
		v.Error = "wrong token"
		s.render(w, http.StatusUnauthorized, "login", v)
		return
	}
	s.limiter.forgive(s.clientAddr(r))
	http.SetCookie(w, &http.Cookie{Name: authCookie, Value: s.sessions.start(name, time.Now()), Path: "/",
		MaxAge: int(SessionTTL.Seconds()), HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: s.secure(r)})
	http.Redirect(w, r, next, http.StatusSeeOther)
}

// logout ends r's session (a CSRF-checked POST) and returns to the login form.
func (s *Server) logout(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, 16<<10)
	if err := r.ParseForm(); err != nil {
		s.refuse(w, r, http.StatusBadRequest, "bad form")
		return
	}
	if err := s.checkCSRF(r); err != nil {
		s.refuse(w, r, http.StatusForbidden, err.Error())
		return
	}
	if c, err := r.Cookie(authCookie); err == nil {
		s.sessions.end(c.Value)
	}
	http.SetCookie(w, &http.Cookie{Name: authCookie, Value: "", Path: "/", MaxAge: -1, HttpOnly: true,
		SameSite: http.SameSiteStrictMode, Secure: s.secure(r)})
	http.Redirect(w, r, "/login", http.StatusSeeOther)
}

// secure tells whether cookies for r must be Secure: it came over TLS, or, with
// Config.TrustProxy, through a proxy that says so (without it, X-Forwarded-Proto is what
// any client chose to send).
func (s *Server) secure(r *http.Request) bool {
	return r.TLS != nil || (s.cfg.TrustProxy && strings.EqualFold(r.Header.Get("X-Forwarded-Proto"), "https"))
}

// safeNext keeps a post-login redirect on this dashboard: a page of the table, with its
// query; anything else — another host, a scheme, a control character or a backslash that
// a browser would resolve elsewhere — becomes "/".
func (s *Server) safeNext(next string) string {
	if next == "" || next[0] != '/' || strings.ContainsFunc(next, func(r rune) bool { return r <= ' ' || r == 0x7f || r == '\\' }) {
		return "/"
	}
	u, err := url.Parse(next)
	if err != nil || u.Scheme != "" || u.Host != "" || u.User != nil {
		return "/"
	}
	for _, p := range s.pages {
		if u.Path == p.path {
			return u.RequestURI()
		}
	}
	return "/"
}

// csrfToken returns the CSRF token for r's browser, setting its cookie on first sight.
func (s *Server) csrfToken(w http.ResponseWriter, r *http.Request) string {
	if c, err := r.Cookie(csrfCookie); err == nil && len(c.Value) == 32 {
		return s.mac("csrf", c.Value)
	}
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	v := hex.EncodeToString(b)
	http.SetCookie(w, &http.Cookie{Name: csrfCookie, Value: v, Path: "/", HttpOnly: true,
		SameSite: http.SameSiteStrictMode, Secure: s.secure(r)})
	return s.mac("csrf", v)
}

// checkCSRF accepts a POST that carries the token of its own cookie and, if it says where
// it comes from, comes from this server.
func (s *Server) checkCSRF(r *http.Request) error {
	if !s.originAllowed(r) {
		return errors.New("CSRF check failed: the request comes from another site (Origin " + base.Printable(r.Header.Get("Origin")) + ")")
	}
	c, err := r.Cookie(csrfCookie)
	if err != nil {
		return errors.New("CSRF check failed: no CSRF cookie (reload the page and try again)")
	}
	if !hmac.Equal([]byte(r.PostForm.Get("csrf")), []byte(s.mac("csrf", c.Value))) {
		return errors.New("CSRF check failed: missing or wrong CSRF token (reload the page and try again)")
	}
	return nil
}
