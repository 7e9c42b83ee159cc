package semaphore_test

import (
	"fmt"
	"testing"

	"github.com/pgcoord/pgcoord/internal/pgtest"
)

// Shape of TestFairAdmissionPlansStayBounded: many keys with demand, the first few of them
// (in virtual-time order) at their limit, so that Next passes over them.
const (
	planKeys    = 20000
	planAtLimit = 10
	planBound   = 100 // rows any plan node may read: a few times the keys a call passes over
)

// Next and AddDemand cost what the keys they look at cost, not what every key with demand
// does: on freshly loaded, unanalyzed tables, in each of a session's first 6 calls (custom
// plans, then the plan cache's choice) and under a forced generic plan, Next's candidates
// come from an index (unsorted, unless restricted to the keys given), and no plan node of it (restricted to keys or not) or of
// AddDemand's look for the key served last reads more than a few times the keys passed
// over; nothing is compiled with JIT (whose compilation alone costs milliseconds).
func TestFairAdmissionPlansStayBounded(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	ex := pgtest.AutoExplain(t, pool)
	exec := func(sql string, args ...any) {
		t.Helper()
		if _, err := ex.Conn.Exec(ctx, sql, args...); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	exec(`ALTER TABLE pgcoord_semaphores SET (autovacuum_enabled = off)`)
	exec(`ALTER TABLE pgcoord_semaphore_permits SET (autovacuum_enabled = off)`)
	exec(`INSERT INTO pgcoord_semaphores (key, permit_limit, demand, vtime, served_at)
	      SELECT 't' || g, 1, 5, g, pgcoord_now() - g * interval '1 ms' FROM generate_series(1, $1::int) g`, planKeys)
	exec(`INSERT INTO pgcoord_semaphore_permits (key, holder, fence_token, acquired_at, expires_at)
	      SELECT 't' || g, 'busy', 1, pgcoord_now(), pgcoord_now() + interval '1 hour' FROM generate_series(1, $1::int) g`, planAtLimit)
	// check fails the test if a plan of plans does O(keys) work; a restricted Next sorts the
	// keys it was given (sortOK).
	check := func(call int, what, match string, plans []pgtest.Explained, sortOK bool) {
		t.Helper()
		if len(plans) == 0 {
			t.Fatalf("call %d of %s: auto_explain logged no statement with %q", call, what, match)
		}
		for _, p := range plans {
			if p.JIT != nil {
				t.Errorf("call %d of %s: compiled with JIT (%d functions):\n%s", call, what, p.JIT.Functions, p.Query)
			}
			p.Plan.Walk(func(n pgtest.PlanNode) {
				if n.Rows*n.Loops > planBound || n.RemovedByFilter*n.Loops > planBound || n.Type == "Sort" && !sortOK ||
					n.Type == "Seq Scan" && n.Relation == "pgcoord_semaphores" {
					t.Errorf("call %d of %s: a plan node does O(keys) work: %v\nin the plan of\n%s", call, what, n, p.Query)
				}
			})
		}
	}
	for call := 1; call <= 7; call++ {
		if call == 7 {
			exec(`SET plan_cache_mode = force_generic_plan`)
		}
		var key string
		const candidates = "ORDER BY k.vtime"
		plans := ex.Plans(candidates, func() {
			err := ex.Conn.QueryRow(ctx, `SELECT key FROM pgcoord_semaphore_next($1, interval '1 hour')`, fmt.Sprint("w", call)).Scan(&key)
			if err != nil {
				t.Fatal(err)
			}
		})
		if want := fmt.Sprint("t", planAtLimit+call); key != want {
			t.Errorf("call %d: Next served %s, want %s (the first key under its limit)", call, key, want)
		}
		check(call, "Next", candidates, plans, false)
		plans = ex.Plans(candidates, func() {
			err := ex.Conn.QueryRow(ctx, `SELECT key FROM pgcoord_semaphore_next($1, interval '1 hour', $2)`,
				fmt.Sprint("x", call), []string{"t1", "t2", fmt.Sprint("t", planKeys-call)}).Scan(&key)
			if err != nil {
				t.Fatal(err)
			}
		})
		if want := fmt.Sprint("t", planKeys-call); key != want {
			t.Errorf("call %d: Next restricted to keys served %s, want %s", call, key, want)
		}
		check(call, "Next restricted to keys", candidates, plans, true)
		const servedLast = "ORDER BY served_at DESC"
		plans = ex.Plans(servedLast, func() {
			exec(`SELECT FROM pgcoord_semaphore_add_demand($1, 1)`, fmt.Sprint("new", call))
		})
		check(call, "AddDemand", servedLast, plans, false)
	}
}
