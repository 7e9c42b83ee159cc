package outbox_test

import (
	"fmt"
	"testing"

	"github.com/pgcoord/pgcoord/internal/pgtest"
)

// Shape of TestClaimAndSettlePlansStayBounded: a backlog far larger than a batch.
const (
	planBacklog = 40000
	planBatch   = 500
)

// Claims and settles cost O(batch), not O(backlog), whatever plan the planner picks: on a
// freshly loaded table that autoanalyze has not seen (the planner's estimates for the claim
// token and the state are then far off), every UPDATE that claim and settle run, in each
// of the first 6 calls of a session (custom plans, then the plan cache's choice) and under
// a forced generic plan, reads at most a few times the batch's rows in any plan node and
// filters out at most a batch of them; settle reaches the table through its primary key only.
// The plans are those the functions run, captured by auto_explain in a session of the
// test's own (direct, also in pooler mode).
func TestClaimAndSettlePlansStayBounded(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pgtest.Pool(t)
	ex := pgtest.AutoExplain(t, pool)
	conn := ex.Conn
	for _, sql := range []string{
		`ALTER TABLE pgcoord_outbox SET (autovacuum_enabled = off)`,
		fmt.Sprintf(`INSERT INTO pgcoord_outbox (topic, key, payload)
		             SELECT 't', 'k' || (g %% 100), '\x00' FROM generate_series(1, %d) g`, planBacklog),
	} {
		if _, err := conn.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	// plans returns the plans of the UPDATEs of pgcoord_outbox that fn ran.
	plans := func(fn func()) []pgtest.Explained { return ex.Plans("UPDATE pgcoord_outbox", fn) }
	for call := 1; call <= 7; call++ {
		if call == 7 {
			if _, err := conn.Exec(ctx, `SET plan_cache_mode = force_generic_plan`); err != nil {
				t.Fatal(err)
			}
		}
		var ids []int64
		var token int64
		claim := plans(func() {
			err := conn.QueryRow(ctx, `SELECT array_agg(id ORDER BY id), max(claim_token)
			                           FROM pgcoord_outbox_claim('planner', $1, $1, 1 << 30, interval '1 hour')`,
				planBatch).Scan(&ids, &token)
			if err != nil {
				t.Fatal(err)
			}
		})
		if len(ids) != planBatch {
			t.Fatalf("call %d: claimed %d messages, want %d", call, len(ids), planBatch)
		}
		// Every kind of outcome: 10 failed, 10 released, the rest delivered.
		var settled int
		settle := plans(func() {
			err := conn.QueryRow(ctx, `SELECT delivered + failed + released FROM pgcoord_outbox_settle($1, $2, $3, $4, $5, 5, interval '1 hour', interval '1 hour')`,
				token, ids[20:], ids[:10], make([]string, 10), ids[10:20]).Scan(&settled)
			if err != nil {
				t.Fatal(err)
			}
		})
		if settled != planBatch {
			t.Fatalf("call %d: settled %d messages, want %d", call, settled, planBatch)
		}
		if len(claim) == 0 || len(settle) == 0 {
			t.Fatalf("call %d: auto_explain logged %d claim and %d settle UPDATEs, want some of each", call, len(claim), len(settle))
		}
		for _, p := range append(claim, settle...) {
			checkBounded(t, call, p)
		}
		for _, p := range settle {
			checkByPrimaryKey(t, call, p)
		}
	}
}

// checkBounded fails t if p was compiled with JIT, or a node of it produced more than a
// few times a batch's rows, or filtered out more than a batch.
func checkBounded(t *testing.T, call int, p pgtest.Explained) {
	t.Helper()
	if p.JIT != nil {
		t.Errorf("call %d: compiled with JIT (%d functions), which costs more than the batch's work:\n%s", call, p.JIT.Functions, p.Query)
	}
	p.Plan.Walk(func(n pgtest.PlanNode) {
		if n.Rows*n.Loops > 3*planBatch || n.RemovedByFilter*n.Loops > planBatch || n.RemovedByJoin*n.Loops > planBatch {
			t.Errorf("call %d: a plan node does O(backlog) work: %v\nin the plan of\n%s", call, n, p.Query)
		}
	})
}

// checkByPrimaryKey fails t if p reads pgcoord_outbox other than through its primary key.
func checkByPrimaryKey(t *testing.T, call int, p pgtest.Explained) {
	t.Helper()
	p.Plan.Walk(func(n pgtest.PlanNode) {
		if n.Type == "Seq Scan" && n.Relation == "pgcoord_outbox" || n.Index != "" && n.Index != "pgcoord_outbox_pkey" {
			t.Errorf("call %d: the outbox is read other than by primary key: %v\nin the plan of\n%s", call, n, p.Query)
		}
	})
}
