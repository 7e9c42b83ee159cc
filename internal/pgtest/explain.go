package pgtest

import (
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Explainer is a session of the test's own in which auto_explain reports the plan, with
// actual row counts, of every statement run — the statements inside pgcoord's SQL
// functions included — so a test can check the plans the functions really run (custom
// plans for a session's first calls, then the plan cache's choice).
type Explainer struct {
	// Conn is the session: run the statements whose plans matter on it. It is direct, also
	// in pooler mode.
	Conn *pgx.Conn

	t       testing.TB
	mu      sync.Mutex
	notices []string
}

// AutoExplain opens an Explainer on the database and schema of pool; it closes with the
// test.
func AutoExplain(t testing.TB, pool *pgxpool.Pool) *Explainer {
	t.Helper()
	e := &Explainer{t: t}
	cfg := Direct(t, pool).Config().ConnConfig.Copy()
	cfg.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) {
		e.mu.Lock()
		defer e.mu.Unlock()
		e.notices = append(e.notices, n.Message)
	}
	conn, err := pgx.ConnectConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(t.Context()) })
	for _, sql := range []string{
		`LOAD 'auto_explain'`,
		`SET auto_explain.log_min_duration = 0`,
		`SET auto_explain.log_nested_statements = on`,
		`SET auto_explain.log_analyze = on`,
		`SET auto_explain.log_format = json`,
		`SET auto_explain.log_level = notice`,
		`SET client_min_messages = notice`,
	} {
		if _, err := conn.Exec(t.Context(), sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	e.Conn = conn
	return e
}

// Exec runs sql with args on the session, and fails the test if it fails.
func (e *Explainer) Exec(sql string, args ...any) {
	e.t.Helper()
	if _, err := e.Conn.Exec(e.t.Context(), sql, args...); err != nil {
		e.t.Fatalf("%s: %v", sql, err)
	}
}

// Plans runs fn and returns the plans of the statements it ran whose text contains
// match.
func (e *Explainer) Plans(match string, fn func()) []Explained {
	e.t.Helper()
	e.mu.Lock()
	e.notices = nil
	e.mu.Unlock()
	fn()
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []Explained
	for _, msg := range e.notices {
		i := strings.Index(msg, "{")
		if !strings.HasPrefix(msg, "duration:") || i < 0 {
			continue
		}
		var x Explained
		if err := json.Unmarshal([]byte(msg[i:]), &x); err != nil {
			e.t.Fatalf("auto_explain notice: %v\n%s", err, msg)
		}
		if strings.Contains(x.Query, match) {
			out = append(out, x)
		}
	}
	return out
}

// Explained is the plan of one statement, as auto_explain logs it in JSON.
type Explained struct {
	Query string   `json:"Query Text"`
	Plan  PlanNode `json:"Plan"`
	// JIT is set when the statement was compiled with JIT.
	JIT *struct {
		Functions int `json:"Functions"`
	} `json:"JIT"`
}

// PlanNode is a node of a plan, with the actual counts of the run.
type PlanNode struct {
	Type            string     `json:"Node Type"`
	Relation        string     `json:"Relation Name"`
	Index           string     `json:"Index Name"`
	Rows            float64    `json:"Actual Rows"`
	Loops           float64    `json:"Actual Loops"`
	RemovedByFilter float64    `json:"Rows Removed by Filter"`
	RemovedByJoin   float64    `json:"Rows Removed by Join Filter"`
	Plans           []PlanNode `json:"Plans"`
}

// Walk calls fn on n and every node below it.
func (n PlanNode) Walk(fn func(PlanNode)) {
	fn(n)
	for _, c := range n.Plans {
		c.Walk(fn)
	}
}

func (n PlanNode) String() string {
	return fmt.Sprintf("%s (relation %q, index %q; rows %.0f x %.0f loops, removed by filter %.0f, by join filter %.0f)",
		n.Type, n.Relation, n.Index, n.Rows, n.Loops, n.RemovedByFilter, n.RemovedByJoin)
}
