package ui

import (
	"context"
	"io/fs"
	"net/http"
	"net/url"
	"strings"

	"github.com/jackc/pgx/v5"
)

// dashboard is the whole dashboard: its pages in navigation order, each with its card on
// the Overview (summarize) and its operator actions. New builds the server from it.
//
// Every page is a GET of its path, and its detail page, if any, a GET of the detail's
// path; "?fragment=1" is their periodic refresh (pageHandler). Every action is a POST of
// its path, refused with 403 unless Config.AllowActions (--allow-actions), CSRF-checked,
// confirmed, run in one transaction with its audit row, and answered with a redirect to
// its page (actionHandler). Besides these, route serves
// /static/ and /login without authentication (publicPath) and /metrics; the navigation
// bar ends with a link to /metrics (layout.html).
func dashboard() []page {
	return []page{
		{path: "/", title: "Overview", tmpl: "overview", load: loadOverview},
		{path: "/leases", title: "Leases", tmpl: "leases", load: loadLeases, summarize: summarizeLeases,
			actions: []action{
				{path: "/actions/lease/expire", name: "lease.expire", run: expireLease},
			}},
		{path: "/jobs", title: "Jobs", tmpl: "jobs", load: loadJobs, summarize: summarizeJobs},
		{path: "/schedules", title: "Schedules", tmpl: "schedules", load: loadSchedules, summarize: summarizeSchedules,
			detail: &page{path: "/schedules/{name}", title: "Schedule", tmpl: "schedule", load: loadSchedule},
			actions: []action{
				{path: "/actions/schedule/pause", name: "schedule.pause", run: pauseSchedule, audited: true, back: scheduleBack},
				{path: "/actions/schedule/resume", name: "schedule.resume", run: resumeSchedule, audited: true, back: scheduleBack},
				{path: "/actions/schedule/trigger", name: "schedule.trigger", run: triggerSchedule, audited: true, back: scheduleBack},
			}},
		{path: "/partitions", title: "Partitions", tmpl: "partitions", load: loadPartitions, summarize: summarizePartitions,
			detail: &page{path: "/partitions/{name}", title: "Partition group", tmpl: "partition", load: loadPartitionGroup},
			actions: []action{
				{path: "/actions/partitions/rebalance", name: "partitions.rebalance", run: rebalancePartitions, audited: true, back: partitionBack},
				{path: "/actions/partitions/drain", name: "partitions.drain", run: drainPartitionMember, audited: true, back: partitionBack},
			}},
		{path: "/semaphores", title: "Semaphores", tmpl: "semaphores", load: loadSemaphores, summarize: summarizeSemaphores,
			actions: []action{
				{path: "/actions/semaphore/set-limit", name: "semaphore.set_limit", run: setSemaphoreLimit},
			}},
		{path: "/outbox", title: "Outbox", tmpl: "outbox", load: loadOutbox, summarize: summarizeOutbox,
			actions: []action{
				{path: "/actions/outbox/retry", name: "outbox.retry", run: retryMessage},
				{path: "/actions/outbox/retry-topic", name: "outbox.retry_topic", run: retryTopic},
			}},
		{path: "/idempotency", title: "Idempotency", tmpl: "idempotency", load: loadIdempotency, summarize: summarizeIdempotency},
		{path: "/ratelimits", title: "Rate limits", tmpl: "ratelimits", load: loadRatelimits, summarize: summarizeRatelimits,
			actions: []action{
				{path: "/actions/ratelimit/reset", name: "ratelimit.reset", run: resetRatelimitKey},
			}},
	}
}

// publicPath reports whether path is served without authentication: the login form and
// the CSS/JS it needs.
func publicPath(path string) bool {
	return path == "/login" || strings.HasPrefix(path, "/static/")
}

// route serves the static assets, the login form, metricsHandler at /metrics and the
// pages and actions of the table.
func (s *Server) route(pages []page, metricsHandler http.Handler) {
	static, _ := fs.Sub(assets, "assets/static")
	s.mux.Handle("GET /static/", http.StripPrefix("/static/", http.FileServerFS(static)))
	s.mux.HandleFunc("GET /login", s.loginPage)
	s.mux.HandleFunc("POST /login", s.login)
	s.mux.HandleFunc("POST /logout", s.logout)
	s.mux.Handle("GET /metrics", metricsHandler)
	s.pages = pages
	for _, p := range pages {
		s.nav = append(s.nav, navItem{Path: p.path, Title: p.title})
		s.mux.HandleFunc("GET "+muxPath(p.path), s.pageHandler(p, p.path))
		if p.detail != nil {
			s.mux.HandleFunc("GET "+p.detail.path, s.pageHandler(*p.detail, p.path))
		}
		for _, a := range p.actions {
			s.mux.HandleFunc("POST "+a.path, s.actionHandler(a, p.path))
		}
	}
}

// muxPath is the route of a page: "/" matches only itself.
func muxPath(p string) string {
	if p == "/" {
		return "/{$}"
	}
	return p
}

// page is one dashboard page, a row of the table.
type page struct {
	path  string // "/leases"
	title string // in the navigation bar
	tmpl  string // the template that draws the page's content
	// load reads the page's data with a bounded number of queries.
	load func(ctx context.Context, s *Server, q url.Values) (any, error)
	// summarize, if set, counts the primitive for its card on the Overview (named and
	// linked by title and path), with a bounded number of queries.
	summarize func(ctx context.Context, s *Server) ([]count, error)
	// detail, if set, is the page of one row, at a path below this one that ends with the
	// wildcard {name} ("/schedules/{name}"): its load gets the name as the query parameter
	// "name", and the navigation bar marks this page.
	detail *page
	// actions are the operator actions taken from the page (or its detail); each returns
	// to it, or where its back says.
	actions []action
}

// summary is one primitive's card on the Overview: its counts, or why they are missing.
type summary struct {
	Name, Path string
	Counts     []count
	Err        string
}

type count struct {
	Label   string
	Value   int
	AtLeast bool // the primitive had more rows than the Overview reads
}

// action is one operator action.
type action struct {
	path string // POST route, "/actions/lease/expire"
	name string // audit action, "lease.expire"
	// run performs the action in tx from the form's fields and returns its target, the
	// details to audit and a sentence for the operator. A *userError is shown as is.
	run func(ctx context.Context, tx pgx.Tx, s *Server, form url.Values, actor string) (target string, details map[string]any, msg string, err error)
	// audited says that run's own call writes the action's audit row in tx, with actor
	// (packages schedules and partition audit each change they make): the handler writes
	// none, so that the action has exactly one row. That row has no client address.
	audited bool
	// back, if set, is the dashboard path the action returns to, from its form; by default
	// its page's path.
	back func(form url.Values) string
}
