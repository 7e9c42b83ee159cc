package bench_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/pgcoord"
	"github.com/pgcoord/pgcoord/ratelimit"
)

// The rate limiter's storage at scale, beside `pgcoord bench --scale --only scale.ratelimit`
// (the cost of a call among 1k or 1M live keys): how long `pgcoord gc` takes to collect a
// million keys at rest, and the plans of a call and of a gc batch on large tables. They
// load millions of rows, so they are benchmarks, run only when asked:
//
//	go test -run '^$' -bench 'Ratelimit(GC|Plans)' -benchtime 1x -v ./internal/bench

// gcPolicy is the policy of the keys loaded here: 1,000 units a second, in bursts of a
// billion (a key a day ahead still admits).
var gcPolicy = ratelimit.Policy{Name: "bench_gc", Rate: 1000, Period: time.Second, Burst: 1_000_000_000}

// loadKeys creates gcPolicy and n keys of it, k1 to kn, their arrival time ahead of the
// database clock (negative: at rest).
func loadKeys(tb testing.TB, pool *pgxpool.Pool, n int, ahead time.Duration) {
	tb.Helper()
	ctx := context.Background()
	if _, err := ratelimit.Set(ctx, pool, gcPolicy); err != nil {
		tb.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `
		INSERT INTO pgcoord_ratelimit_state (policy, key, tat)
		SELECT $1, 'k' || g, pgcoord_clock() + $2::interval FROM generate_series(1, $3::int) g`,
		gcPolicy.Name, ahead, n); err != nil {
		tb.Fatal(err)
	}
}

// BenchmarkRatelimitGC measures pgcoord.GC (what `pgcoord gc` runs, with its default batch
// of 10,000 rows per kind) collecting a million keys at rest, loaded in one statement: alone,
// and interleaved in the heap with a million live keys, which it must keep; on a table
// never analyzed and on one analyzed after the load (as autovacuum would before long; it is
// off for the table, so that neither changes during the run). It checks that exactly the
// keys at rest went, and reports keys/s and the batches it took.
func BenchmarkRatelimitGC(b *testing.B) {
	const idle = 1000000
	for _, live := range []int{0, 1000000} {
		for _, analyzed := range []bool{false, true} {
			b.Run(fmt.Sprintf("idle=1m/live=%s/analyzed=%v", map[int]string{0: "0", 1000000: "1m"}[live], analyzed), func(b *testing.B) {
				pool := pgtest.PoolMax(b, 4)
				ctx := b.Context()
				b.StopTimer()
				for range b.N {
					for _, sql := range []string{`TRUNCATE pgcoord_ratelimit_state`,
						`ALTER TABLE pgcoord_ratelimit_state SET (autovacuum_enabled = false)`} {
						if _, err := pool.Exec(ctx, sql); err != nil {
							b.Fatal(err)
						}
					}
					if _, err := ratelimit.Set(ctx, pool, gcPolicy); err != nil {
						b.Fatal(err)
					}
					// With live keys, odd numbers at rest and even ones live.
					if _, err := pool.Exec(ctx, `
						INSERT INTO pgcoord_ratelimit_state (policy, key, tat)
						SELECT $1, 'k' || g, pgcoord_clock() + CASE WHEN $3 AND g % 2 = 0 THEN interval '1 day' ELSE interval '-1 minute' END
						  FROM generate_series(1, $2::int) g`, gcPolicy.Name, idle+live, live > 0); err != nil {
						b.Fatal(err)
					}
					if analyzed {
						if _, err := pool.Exec(ctx, `ANALYZE pgcoord_ratelimit_state`); err != nil {
							b.Fatal(err)
						}
					}
					batches := 0
					b.StartTimer()
					start := time.Now()
					res, err := pgcoord.GC(ctx, pool, &pgcoord.GCOpts{Progress: func(pgcoord.GCResult) { batches++ }})
					elapsed := time.Since(start)
					b.StopTimer()
					if err != nil {
						b.Fatal(err)
					}
					var left, leftIdle int64
					if err := pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE tat <= pgcoord_clock()) FROM pgcoord_ratelimit_state`).
						Scan(&left, &leftIdle); err != nil {
						b.Fatal(err)
					}
					if res.Removed("ratelimit") != idle || left != int64(live) || leftIdle != 0 {
						b.Fatalf("gc removed %d keys, left %d (%d at rest); want %d removed, the %d live ones left",
							res.Removed("ratelimit"), left, leftIdle, idle, live)
					}
					b.ReportMetric(float64(idle)/elapsed.Seconds(), "keys/s")
					b.ReportMetric(float64(batches), "batches")
				}
			})
		}
	}
}

// BenchmarkRatelimitPlans runs a call (pgcoord_ratelimit_take, through ratelimit.Allow) and
// a gc batch (pgcoord_gc_ratelimit) seven times each on one session, at 10k and 1M keys
// (10 and 1,000 times scale.ratelimit's smallest size), on a fresh table never analyzed
// and again after ANALYZE, and logs the plans auto_explain reports for the statements
// inside them, with their buffers: PL/pgSQL plans a statement's first five runs for their
// values (custom plans) and may then keep a generic one; a last run forces the generic
// plan. It fails if a call scans the state table instead of reaching its key by index.
func BenchmarkRatelimitPlans(b *testing.B) {
	for _, n := range []int{10000, 1000000} {
		for _, analyzed := range []bool{false, true} {
			b.Run(fmt.Sprintf("keys=%d/analyzed=%v", n, analyzed), func(b *testing.B) {
				for range b.N {
					explainRatelimit(b, n, analyzed)
				}
			})
		}
	}
}

func explainRatelimit(b *testing.B, n int, analyzed bool) {
	ctx := b.Context()
	prepare := func(ahead time.Duration) (*pgxpool.Pool, *planLog) {
		pool := pgtest.PoolMax(b, 2) // a fresh schema: a table never analyzed
		if _, err := pool.Exec(ctx, `ALTER TABLE pgcoord_ratelimit_state SET (autovacuum_enabled = false)`); err != nil {
			b.Fatal(err)
		}
		loadKeys(b, pool, n, ahead)
		if analyzed {
			if _, err := pool.Exec(ctx, `ANALYZE pgcoord_ratelimit_state`); err != nil {
				b.Fatal(err)
			}
		}
		return pool, autoExplain(b, pool)
	}

	// Calls on random live keys, then one on a key with no row.
	_, pl := prepare(24 * time.Hour)
	take := func(key string) {
		if _, err := pl.conn.Exec(ctx, `SELECT granted FROM pgcoord_ratelimit_take(ARRAY[$1], ARRAY[$2], 1)`, gcPolicy.Name, key); err != nil {
			b.Fatal(err)
		}
	}
	for i := range 7 {
		pl.run(fmt.Sprintf("take %d", i+1), func() { take(fmt.Sprintf("k%d", 1+(i*7919)%n)) })
	}
	pl.run("take 8 (a new key)", func() { take("new") })
	pl.forceGeneric(b)
	pl.run("take 9 (generic forced)", func() { take(fmt.Sprintf("k%d", n/2)) })
	for _, p := range pl.plans {
		if strings.Contains(p.tree, "Seq Scan on pgcoord_ratelimit_state") {
			b.Errorf("keys=%d analyzed=%v: %s scans the state table:\n%s", n, analyzed, p.call, p.tree)
		}
	}
	pl.log(b, fmt.Sprintf("pgcoord_ratelimit_take, %d live keys, analyzed %v", n, analyzed))

	// gc batches of n/10 (at most the default 10,000) over keys at rest.
	_, pl = prepare(-time.Minute)
	batch := min(10000, n/10)
	gc := func() {
		var removed int64
		if err := pl.conn.QueryRow(ctx, `SELECT pgcoord_gc_ratelimit($1, false)`, batch).Scan(&removed); err != nil {
			b.Fatal(err)
		}
		if removed != int64(batch) {
			b.Fatalf("a gc batch removed %d keys at rest of %d, want %d", removed, n, batch)
		}
	}
	for i := range 7 {
		pl.run(fmt.Sprintf("gc batch %d", i+1), gc)
	}
	pl.forceGeneric(b)
	pl.run("gc batch 8 (generic forced)", gc)
	pl.log(b, fmt.Sprintf("pgcoord_gc_ratelimit(%d), %d keys at rest, analyzed %v", batch, n, analyzed))
}

// planLog is a session in which auto_explain reports the plan, with actual rows and
// buffers, of every statement (those inside functions too), and the plans it collected.
type planLog struct {
	conn *pgx.Conn

	mu      sync.Mutex
	notices []string
	plans   []explained
}

// explained is one statement's plan, rendered: the call that ran it, the statement's first
// line, whether the plan is generic (it shows parameters, not values), the run's duration
// and buffers, and the tree of plan nodes.
type explained struct {
	call, query string
	generic     bool
	ms          float64
	tree        string
}

func autoExplain(tb testing.TB, pool *pgxpool.Pool) *planLog {
	tb.Helper()
	pl := &planLog{}
	cfg := pgtest.Direct(tb, pool).Config().ConnConfig.Copy()
	cfg.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) {
		pl.mu.Lock()
		defer pl.mu.Unlock()
		pl.notices = append(pl.notices, n.Message)
	}
	conn, err := pgx.ConnectConfig(context.Background(), cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { conn.Close(context.Background()) })
	for _, sql := range []string{
		`LOAD 'auto_explain'`,
		`SET auto_explain.log_min_duration = 0`,
		`SET auto_explain.log_nested_statements = on`,
		`SET auto_explain.log_analyze = on`,
		`SET auto_explain.log_buffers = on`,
		`SET auto_explain.log_format = json`,
		`SET auto_explain.log_level = notice`,
		`SET client_min_messages = notice`,
	} {
		if _, err := conn.Exec(context.Background(), sql); err != nil {
			tb.Fatalf("%s: %v", sql, err)
		}
	}
	pl.conn = conn
	return pl
}

// forceGeneric makes the session's next plans generic.
func (pl *planLog) forceGeneric(tb testing.TB) {
	tb.Helper()
	if _, err := pl.conn.Exec(context.Background(), `SET plan_cache_mode = force_generic_plan`); err != nil {
		tb.Fatal(err)
	}
}

// run runs fn and keeps the plans of the statements it ran inside functions that touch
// pgcoord_ratelimit_state.
func (pl *planLog) run(call string, fn func()) {
	pl.mu.Lock()
	pl.notices = nil
	pl.mu.Unlock()
	fn()
	pl.mu.Lock()
	defer pl.mu.Unlock()
	for _, msg := range pl.notices {
		i := strings.Index(msg, "{")
		if !strings.HasPrefix(msg, "duration:") || i < 0 {
			continue
		}
		var x struct {
			Query string   `json:"Query Text"`
			Plan  planNode `json:"Plan"`
		}
		if err := json.Unmarshal([]byte(msg[i:]), &x); err != nil {
			panic(fmt.Sprintf("auto_explain notice: %v\n%s", err, msg))
		}
		var ms float64
		fmt.Sscanf(msg, "duration: %f ms", &ms)
		q := strings.Join(strings.Fields(x.Query), " ")
		if !strings.Contains(q, "pgcoord_ratelimit_state") || strings.Contains(q, "pgcoord_ratelimit_take(") || strings.Contains(q, "pgcoord_gc_ratelimit(") {
			continue
		}
		var tree strings.Builder
		x.Plan.render(&tree, 0)
		pl.plans = append(pl.plans, explained{call: call, query: q, generic: strings.Contains(tree.String(), "$"), ms: ms, tree: tree.String()})
	}
}

// log logs the collected plans under title and forgets them.
func (pl *planLog) log(tb testing.TB, title string) {
	tb.Helper()
	var out strings.Builder
	fmt.Fprintf(&out, "%s:\n", title)
	for _, p := range pl.plans {
		kind := "custom"
		if p.generic {
			kind = "generic"
		}
		fmt.Fprintf(&out, "-- %s, %s plan, %.3f ms: %.90s\n%s", p.call, kind, p.ms, p.query, p.tree)
	}
	tb.Log(out.String())
	pl.plans = nil
}

// planNode is a node of an auto_explain JSON plan.
type planNode struct {
	Type      string     `json:"Node Type"`
	Relation  string     `json:"Relation Name"`
	Alias     string     `json:"Alias"`
	Index     string     `json:"Index Name"`
	IndexCond string     `json:"Index Cond"`
	Filter    string     `json:"Filter"`
	PlanRows  float64    `json:"Plan Rows"`
	Rows      float64    `json:"Actual Rows"`
	Loops     float64    `json:"Actual Loops"`
	Hit       int64      `json:"Shared Hit Blocks"`
	Read      int64      `json:"Shared Read Blocks"`
	Dirtied   int64      `json:"Shared Dirtied Blocks"`
	Written   int64      `json:"Shared Written Blocks"`
	Plans     []planNode `json:"Plans"`
}

// touches reports whether n or a node below it reads relation or one of its indexes.
func (n planNode) touches(relation string) bool {
	if n.Relation == relation || strings.HasPrefix(n.Index, relation) {
		return true
	}
	for _, c := range n.Plans {
		if c.touches(relation) {
			return true
		}
	}
	return false
}

// render writes n and the nodes below it that touch the state table (the gc batch's fold
// of shadow counts into the policies is left out), one a line.
func (n planNode) render(w *strings.Builder, depth int) {
	fmt.Fprintf(w, "%s%s", strings.Repeat("  ", depth), n.Type)
	if n.Index != "" {
		fmt.Fprintf(w, " using %s", n.Index)
	}
	if n.Relation != "" {
		fmt.Fprintf(w, " on %s %s", n.Relation, n.Alias)
	}
	fmt.Fprintf(w, " (est %.0f rows; %.0f rows x %.0f loops; buffers hit %d read %d dirtied %d written %d)",
		n.PlanRows, n.Rows, n.Loops, n.Hit, n.Read, n.Dirtied, n.Written)
	if n.IndexCond != "" {
		fmt.Fprintf(w, " cond %s", n.IndexCond)
	}
	if n.Filter != "" {
		fmt.Fprintf(w, " filter %s", n.Filter)
	}
	w.WriteByte('\n')
	for _, c := range n.Plans {
		if c.touches("pgcoord_ratelimit_state") {
			c.render(w, depth+1)
		}
	}
}
