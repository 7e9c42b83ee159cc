package ui

import (
	"bytes"
	"crypto/rand"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"log/slog"
	"net/http"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/internal/base"
	"github.com/pgcoord/pgcoord/internal/httpsec"
	"github.com/pgcoord/pgcoord/internal/ui/audit"
	"github.com/pgcoord/pgcoord/metrics"
	"github.com/pgcoord/pgcoord/pgcoord"
)

// check makes this package's argument errors (their text is the cause alone).
var check = base.Check("")

// Defaults of Config.
const (
	DefaultRefresh      = 5 * time.Second
	DefaultDoctorEvery  = 30 * time.Second
	DefaultMaxStaleness = metrics.DefaultMaxStaleness
)

// Page sizes: each bounds the rows, and so the queries, one page view costs.
const (
	pageSize     = 50   // leases, semaphore keys, dead messages, idempotency keys per page
	jobsPageSize = 20   // jobs per page: one ListRuns each
	stripTicks   = 30   // ticks per job in the Jobs page's strip
	summaryRows  = 1000 // rows per primitive the Overview reads
)

// Config configures a Server.
type Config struct {
	// Pool is the database. Required.
	Pool *pgxpool.Pool
	// Addr is the address the server listens on (host:port). Without a token the dashboard
	// answers only requests addressed to a loopback name (localhost, 127.0.0.1, [::1]) at
	// this port (at any port when Addr names none), which defeats DNS rebinding.
	Addr string
	// Token, if set, is required of every request (Bearer header or login cookie). New
	// refuses a weak one (httpsec.CheckToken: under 128 bits, or one character or string
	// repeated). It must be set when Addr is beyond loopback (see CheckListen): New refuses
	// such an Addr without one.
	Token string
	// TrustProxy says that the server is reached only through a reverse proxy that sets
	// X-Forwarded-Proto and appends the client's address to X-Forwarded-For: only then
	// does "X-Forwarded-Proto: https" mark cookies Secure, and the login limiter count the
	// address the proxy appended rather than the proxy's own (otherwise any client could
	// send either header). Without it, cookies are Secure when the request itself came
	// over TLS, and the limiter counts the connection's address.
	TrustProxy bool
	// Actor names the operator in the audit log when there is no token (with a token,
	// each browser gives a name at login). Default "local".
	Actor string
	// AllowActions enables the operator actions (expire a lease, set a semaphore limit,
	// retry dead outbox messages, reset a rate limit key, pause, resume or trigger a
	// schedule, rebalance a partition group or drain one of its members).
	AllowActions bool
	// ShowPayloads shows message payloads and stored response bodies (outbox,
	// idempotency); hidden by default.
	ShowPayloads bool
	// Refresh is how often pages refresh themselves. Default DefaultRefresh.
	Refresh time.Duration
	// MaxStaleness is how long past its period a job may go without success before it is
	// overdue. Default DefaultMaxStaleness.
	MaxStaleness time.Duration
	// DoctorEvery is how often the Overview runs the checks of `pgcoord doctor` again
	// (they read every row of each primitive and send a notification: too much for every
	// refresh). Default DefaultDoctorEvery.
	DoctorEvery time.Duration
	// Logger receives request errors. Default slog.Default().
	Logger *slog.Logger
}

// Server is the dashboard: an http.Handler.
type Server struct {
	cfg    Config
	secret []byte // per-server: keys the CSRF tokens
	// What the server keeps for its browsers, each bounded (guard.go).
	sessions sessions
	limiter  loginLimiter
	flashes  flashes
	tmpl     *template.Template
	mux      *http.ServeMux
	pages    []page // the dashboard's table (routes.go), in navigation order
	nav      []navItem
	doctor   doctorCache
}

//go:embed assets
var assets embed.FS

// New returns the dashboard for cfg. It returns an error wrapping
// pgcoord.ErrInvalidArgument for a nil pool, a negative duration, a weak token or an Addr
// beyond loopback without a token.
func New(cfg Config) (*Server, error) {
	if cfg.Pool == nil {
		return nil, check.Invalid("ui: nil pool")
	}
	if cfg.Refresh < 0 || cfg.MaxStaleness < 0 || cfg.DoctorEvery < 0 {
		return nil, check.Invalid("ui: negative Refresh, MaxStaleness or DoctorEvery")
	}
	if cfg.Token != "" {
		if err := httpsec.CheckToken(cfg.Token); err != nil {
			return nil, check.Invalid("ui: %v", err)
		}
	}
	if cfg.Addr != "" {
		if err := CheckListen(cfg.Addr, cfg.Token != ""); err != nil {
			return nil, check.Invalid("%v", err)
		}
	}
	if cfg.Actor == "" {
		cfg.Actor = "local"
	}
	if cfg.Refresh == 0 {
		cfg.Refresh = DefaultRefresh
	}
	if cfg.MaxStaleness == 0 {
		cfg.MaxStaleness = DefaultMaxStaleness
	}
	if cfg.DoctorEvery == 0 {
		cfg.DoctorEvery = DefaultDoctorEvery
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	s := &Server{cfg: cfg, secret: make([]byte, 32), mux: http.NewServeMux()}
	if _, err := rand.Read(s.secret); err != nil {
		return nil, err
	}
	tmpl, err := template.New("").Funcs(funcs).ParseFS(assets, "assets/*.html")
	if err != nil {
		return nil, err
	}
	s.tmpl = tmpl
	coll, err := metrics.New(cfg.Pool, &metrics.Opts{MaxStaleness: cfg.MaxStaleness, Logger: cfg.Logger})
	if err != nil {
		return nil, err
	}

	s.route(dashboard(), metrics.Handler(coll))
	return s, nil
}

// ServeHTTP serves the dashboard: the Host check, security headers, then authentication,
// then the route.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !httpsec.HostAllowed(r.Host, s.cfg.Addr, s.cfg.Token != "") {
		httpsec.MisdirectedRequest(w)
		return
	}
	h := w.Header()
	h.Set("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; form-action 'self'; base-uri 'none'")
	h.Set("X-Frame-Options", "DENY") // frame-ancestors, for browsers that predate it
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "same-origin")
	h.Set("Cache-Control", "no-store")
	if !s.authenticated(r) && !publicPath(r.URL.Path) {
		s.refuseUnauthenticated(w, r)
		return
	}
	s.mux.ServeHTTP(w, r)
}

// userError is an action's refusal to show the operator, with its HTTP status.
type userError struct {
	status int
	msg    string
}

func (e *userError) Error() string { return e.msg }

func userErrorf(status int, format string, args ...any) error {
	return &userError{status: status, msg: fmt.Sprintf(format, args...)}
}

// navItem is one link of the navigation bar.
type navItem struct{ Path, Title string }

// view is what the layout template draws.
type view struct {
	Title, Path  string
	Nav          []navItem
	Data         any
	Body         template.HTML // the page's content, drawn by its template
	CSRF         string
	AllowActions bool
	ShowPayloads bool
	RefreshMS    int64
	SignedIn     bool   // a token is required: the layout offers to sign out
	Message      string // an action's result (flashes), never text from the URL
	Error        string
}

// pageHandler serves page p, whose navigation entry is the one of path nav. The {name}
// wildcard of a detail page's path reaches p.load as the query parameter "name".
func (s *Server) pageHandler(p page, nav string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		if name := r.PathValue("name"); name != "" {
			q.Set("name", name)
		}
		data, err := p.load(r.Context(), s, q)
		v := view{
			Title: p.title, Path: nav, Nav: s.nav, Data: data,
			CSRF: s.csrfToken(w, r), AllowActions: s.cfg.AllowActions, ShowPayloads: s.cfg.ShowPayloads,
			RefreshMS: s.cfg.Refresh.Milliseconds(), Message: s.flashes.get(q.Get("flash"), time.Now()),
			SignedIn: s.cfg.Token != "",
		}
		status, tmpl := http.StatusOK, p.tmpl
		var ue *userError
		switch {
		case errors.As(err, &ue): // a bad filter or page link
			v.Data, v.Error, status, tmpl = nil, ue.msg, ue.status, "error"
		case err != nil:
			s.cfg.Logger.Error("pgcoord ui: page failed", "page", p.path, "err", err)
			v.Data, v.Error, status, tmpl = nil, err.Error(), http.StatusInternalServerError, "error"
		}
		if q.Get("fragment") == "1" { // the page's periodic refresh: its content only
			s.render(w, status, tmpl, v)
			return
		}
		s.renderPage(w, status, tmpl, v)
	}
}

// renderPage draws the content template tmpl inside the layout.
func (s *Server) renderPage(w http.ResponseWriter, status int, tmpl string, v view) {
	var body bytes.Buffer
	if err := s.tmpl.ExecuteTemplate(&body, tmpl, v); err != nil {
		s.templateFailed(w, tmpl, err)
		return
	}
	v.Body = template.HTML(body.String()) // drawn by html/template: already escaped
	s.render(w, status, "layout", v)
}

// render draws the template name alone.
func (s *Server) render(w http.ResponseWriter, status int, name string, v any) {
	var buf bytes.Buffer
	if err := s.tmpl.ExecuteTemplate(&buf, name, v); err != nil {
		s.templateFailed(w, name, err)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write(visibleControls(buf.Bytes()))
}

// visibleControls writes every control character of a drawn page — C0 and C1 controls,
// DEL, the bidirectional controls and the line separators (base.IsControl), and bytes that
// are not UTF-8 — as Go escapes it (\x1b, \u202e), except the tab and the newline: html/template
// escapes HTML but lets ESC through, and stored text (a last_error, a holder, a payload)
// copied from the page into a terminal could then move its cursor or retitle it. The
// templates hold none of them, so only stored or requested text is changed.
func visibleControls(page []byte) []byte {
	hidden := func(r rune) bool { return r != '\n' && r != '\t' && (r == utf8.RuneError || base.IsControl(r)) }
	if bytes.IndexFunc(page, hidden) < 0 {
		return page
	}
	out := make([]byte, 0, len(page)+64)
	for len(page) > 0 {
		r, n := utf8.DecodeRune(page)
		switch {
		case r == utf8.RuneError && n <= 1:
			out = fmt.Appendf(out, `\x%02x`, page[0])
		case r == '\n' || r == '\t' || !base.IsControl(r):
			out = append(out, page[:n]...)
		case r < 0x100:
			out = fmt.Appendf(out, `\x%02x`, r)
		default:
			out = fmt.Appendf(out, `\u%04x`, r)
		}
		page = page[n:]
	}
	return out
}

func (s *Server) templateFailed(w http.ResponseWriter, name string, err error) {
	s.cfg.Logger.Error("pgcoord ui: template failed", "template", name, "err", err)
	http.Error(w, "template error", http.StatusInternalServerError)
}

// actionHandler runs an action of the page at back: enabled, CSRF-checked and
// confirmed, in one transaction with its audit row (written by the action itself when it
// is audited); then it returns to back, or to the action's own back.
func (s *Server) actionHandler(a action, back string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !s.cfg.AllowActions {
			s.refuse(w, r, http.StatusForbidden, "actions are disabled: start the dashboard with --allow-actions")
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, 64<<10)
		if err := r.ParseForm(); err != nil {
			s.refuse(w, r, http.StatusBadRequest, "bad form: "+err.Error())
			return
		}
		if err := s.checkCSRF(r); err != nil {
			s.refuse(w, r, http.StatusForbidden, err.Error())
			return
		}
		if r.PostForm.Get("confirmed") != "yes" {
			s.refuse(w, r, http.StatusBadRequest, "not confirmed: the action needs confirmed=yes (the page asks before it sends)")
			return
		}
		actor := s.actor(r)
		var msg string
		err := pgx.BeginFunc(r.Context(), s.cfg.Pool, func(tx pgx.Tx) error {
			target, details, m, err := a.run(r.Context(), tx, s, r.PostForm, actor)
			if err != nil {
				return err
			}
			msg = m
			if a.audited {
				return nil
			}
			_, err = audit.Record(r.Context(), tx, audit.Entry{
				Actor: actor, RemoteAddr: r.RemoteAddr, Action: a.name, Target: target, Details: details,
			})
			return err
		})
		var ue *userError
		switch {
		case errors.As(err, &ue):
			s.refuse(w, r, ue.status, ue.msg)
			return
		case errors.Is(err, pgcoord.ErrInvalidName) || errors.Is(err, pgcoord.ErrInvalidArgument) || errors.Is(err, audit.ErrInvalid):
			s.refuse(w, r, http.StatusBadRequest, err.Error())
			return
		case err != nil:
			s.cfg.Logger.Error("pgcoord ui: action failed", "action", a.name, "err", err)
			s.refuse(w, r, http.StatusInternalServerError, a.name+" failed: "+err.Error())
			return
		}
		s.cfg.Logger.Info("pgcoord ui: action", "action", a.name, "actor", actor, "remote_addr", r.RemoteAddr, "result", msg)
		if a.back != nil {
			back = a.back(r.PostForm)
		}
		http.Redirect(w, r, back+"?flash="+s.flashes.put(msg, time.Now()), http.StatusSeeOther)
	}
}

// refuse answers with status and a short page (or plain text for non-browsers).
func (s *Server) refuse(w http.ResponseWriter, r *http.Request, status int, msg string) {
	if !strings.Contains(r.Header.Get("Accept"), "text/html") {
		http.Error(w, base.Printable(msg), status) // plain text, maybe for a terminal
		return
	}
	s.renderPage(w, status, "error", view{Title: http.StatusText(status), Nav: s.nav, Error: msg})
}
