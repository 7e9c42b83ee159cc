package ui

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"net/http"
	"net/url"
	"strings"
)

// Cookie names.
const (
	authCookie = "pgcoord_ui_auth" // the login: an HMAC of the token under the server's secret
	csrfCookie = "pgcoord_ui_csrf" // a random value per browser; forms carry its HMAC
)

// mac returns the hex HMAC-SHA256 of purpose and value under the server's secret.
func (s *Server) mac(purpose, value string) string {
	m := hmac.New(sha256.New, s.secret)
	m.Write([]byte(purpose + "\x00" + value))
	return hex.EncodeToString(m.Sum(nil))
}

// publicPath reports whether path is served without authentication: the login form and
// the CSS/JS it needs.
func publicPath(path string) bool {
	return path == "/login" || strings.HasPrefix(path, "/static/")
}

// authenticated reports whether r may be served: no token is configured, or r carries it
// as a Bearer header or the login cookie.
func (s *Server) authenticated(r *http.Request) bool {
	if s.cfg.Token == "" {
		return true
	}
	if r.Header.Get("Authorization") != "" {
		return bearerOK(r, s.cfg.Token)
	}
	c, err := r.Cookie(authCookie)
	return err == nil && hmac.Equal([]byte(c.Value), []byte(s.mac("auth", s.cfg.Token)))
}

// refuseUnauthenticated sends browsers to the login form and tells others to authenticate.
func (s *Server) refuseUnauthenticated(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodGet && strings.Contains(r.Header.Get("Accept"), "text/html") {
		http.Redirect(w, r, "/login?next="+url.QueryEscape(r.URL.RequestURI()), http.StatusSeeOther)
		return
	}
	unauthorized(w)
}

// identity names who acts, for the audit log: the token's fingerprint, or "local" when
// the dashboard has no token (it then listens on loopback only).
func (s *Server) identity() string {
	if s.cfg.Token == "" {
		return "local"
	}
	sum := sha256.Sum256([]byte(s.cfg.Token))
	return "token:" + hex.EncodeToString(sum[:4])
}

type loginView struct {
	Next, Error string
}

func (s *Server) loginPage(w http.ResponseWriter, r *http.Request) {
	if s.cfg.Token == "" {
		http.Redirect(w, r, "/", http.StatusSeeOther)
		return
	}
	s.render(w, http.StatusOK, "login", loginView{Next: safeNext(r.URL.Query().Get("next"))})
}

func (s *Server) login(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, 16<<10)
	if s.cfg.Token == "" || r.ParseForm() != nil {
		http.Redirect(w, r, "/", http.StatusSeeOther)
		return
	}
	next := safeNext(r.PostForm.Get("next"))
	if subtle.ConstantTimeCompare([]byte(r.PostForm.Get("token")), []byte(s.cfg.Token)) != 1 {
		s.render(w, http.StatusUnauthorized, "login", loginView{Next: next, Error: "wrong token"})
		return
	}
	http.SetCookie(w, &http.Cookie{Name: authCookie, Value: s.mac("auth", s.cfg.Token), Path: "/",
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil})
	http.Redirect(w, r, next, http.StatusSeeOther)
}

// safeNext keeps a post-login redirect on this server.
func safeNext(next string) string {
	if !strings.HasPrefix(next, "/") || strings.HasPrefix(next, "//") || strings.Contains(next, `\`) {
		return "/"
	}
	return next
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
		SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil})
	return s.mac("csrf", v)
}

// checkCSRF accepts a POST that carries the token of its own cookie and, if it says where
// it comes from, comes from this server.
func (s *Server) checkCSRF(r *http.Request) error {
	if o := r.Header.Get("Origin"); o != "" {
		u, err := url.Parse(o)
		if err != nil || u.Host != r.Host {
			return errors.New("CSRF check failed: the request comes from another site (Origin " + o + ")")
		}
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
