//go:build unix

package integration_test

import (
	"cmp"
	"fmt"
	"maps"
	"math"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/jackc/pgx/v5"

	"github.com/pgcoord/pgcoord/internal/pgtest"
)

// check checks the history and the database against every invariant, and returns the
// history it parsed.
func (h *faultHarness) check() *faultHistory {
	h.awaitWorkerSessions()
	if path := os.Getenv(envFaultHistory); path != "" {
		var b strings.Builder
		for _, l := range h.lines {
			fmt.Fprintf(&b, "%s %s\n", l.worker.Name(), l.line)
		}
		if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
			h.t.Error(err)
		}
	}
	hist := parseFaultHistory(h.t, h.lines)
	h.t.Logf("history: %d register writes (%d ok, %d stale, %d unknown), %d grants, %d permits, %d ticks",
		hist.count("ok")+hist.count("stale")+hist.count(""), hist.count("ok"), hist.count("stale"), hist.count(""),
		len(hist.grants), len(hist.permits), hist.ticks)
	var ledger string
	if err := h.admin.QueryRow(h.ctx, `SELECT coalesce(string_agg(state || ' ' || n, ', '), 'empty') FROM
			(SELECT state, count(*) AS n FROM pgcoord_job_runs GROUP BY state ORDER BY state) s`).Scan(&ledger); err != nil {
		h.t.Fatal(err)
	}
	h.t.Logf("cron ledger: %s", ledger)
	h.logRunErrors()
	if hist.idle() {
		h.t.Fatalf("a workload did nothing: the run proves nothing (register writes accepted %d, permits %d, ticks %d, "+
			"partition writes accepted %d and refused %d; the partition workload's failures: %v)",
			hist.count("ok"), len(hist.permits), hist.ticks, len(hist.partOK), hist.partStale, hist.partErrs)
	}
	h.checkRegisters(hist)
	h.checkGrants(hist)
	h.checkPermits(hist)
	h.checkTicks()
	h.checkCharges()
	h.checkOutbox()
	h.checkRatelimit(hist)
	h.checkPartitions(hist)
	return hist
}

// checkRatelimit checks the rate-limited calls: every acknowledged admission is on the
// surviving primary (a failover may lose some only with asynchronous replication, where
// their calls may then be admitted again: counted as ratelimit-lost), and the surviving
// admissions never exceed the limit over any stretch of up to 10 s, nor over the whole run
// (ratelimit-excess).
func (h *faultHarness) checkRatelimit(hist *faultHistory) {
	rows, err := h.admin.Query(h.ctx, `SELECT id, before_at, after_at FROM fault_rl_calls`)
	if err != nil {
		h.t.Fatal(err)
	}
	type call struct {
		id string
		bracketedCall
	}
	calls, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (call, error) {
		var c call
		return c, r.Scan(&c.id, &c.before, &c.after)
	})
	if err != nil {
		h.t.Fatal(err)
	}
	kept := map[string]bool{}
	for _, c := range calls {
		kept[c.id] = true
	}
	lost := 0
	for _, id := range hist.rlAcked {
		if !kept[id] {
			lost++
		}
	}
	h.t.Logf("rate limit: %d admissions acknowledged, %d on the primary, %d acknowledged ones lost", len(hist.rlAcked), len(calls), lost)
	if len(hist.rlAcked) == 0 {
		h.t.Error("no rate-limited call was admitted: the workload did nothing")
	}
	if lost > 0 {
		h.violated("ratelimit-lost", "%d acknowledged rate-limited admissions are not on the surviving primary: their calls may be admitted again", lost)
	}
	brackets := make([]bracketedCall, len(calls))
	for i, c := range calls {
		brackets[i] = c.bracketedCall
	}
	// Stretches of up to 10 s, and the whole run (a long HA run has too many calls to check
	// every stretch).
	if err := checkRateBound(brackets, faultRate, faultRateBurst, 10*time.Second); err != nil {
		h.violated("ratelimit-excess", "%v", err)
	}
}

// violated reports a broken invariant of the given kind: a test failure, unless the run
// tolerates that kind (h.tolerated: an asynchronous cluster may lose acknowledged commits),
// when it is logged and counted in h.weakened.
func (h *faultHarness) violated(kind, format string, args ...any) {
	h.t.Helper()
	if !h.tolerated[kind] {
		h.t.Errorf(format, args...)
		return
	}
	h.mu.Lock()
	if h.weakened == nil {
		h.weakened = map[string]int{}
	}
	h.weakened[kind]++
	h.mu.Unlock()
	h.t.Logf("weakened (%s): "+format, append([]any{kind}, args...)...)
}

// awaitWorkerSessions waits until the database runs nothing more for the stopped workers:
// a worker's backend may still run what the worker sent before it exited (a COMMIT behind
// a row lock, on a loaded machine), and a write that commits after resolveWrites read the
// log but before the final reads would look lost and yet be read. Sessions still there
// after WaitLimit are terminated, which settles what they were doing. It never fails the
// test: a session it cannot see or end is logged, and the checks go on as before.
func (h *faultHarness) awaitWorkerSessions() {
	const workers = `application_name LIKE 'pgcoord-worker %'`
	left := func() (n int, err error) {
		err = h.admin.QueryRow(h.ctx, `SELECT count(*) FROM pg_stat_activity WHERE `+workers).Scan(&n)
		return n, err
	}
	wait := func() (int, error) {
		deadline := time.Now().Add(pgtest.WaitLimit)
		for {
			n, err := left()
			if err != nil || n == 0 || time.Now().After(deadline) {
				return n, err
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	n, err := wait()
	if err == nil && n > 0 {
		h.t.Logf("%d sessions of the stopped workers still there after %v: terminating them", n, pgtest.WaitLimit)
		if _, err = h.admin.Exec(h.ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE `+workers); err == nil {
			n, err = wait()
		}
	}
	if err != nil || n > 0 {
		h.t.Logf("the stopped workers' sessions: %d left (%v); checking as they are", n, err)
	}
}

// idle reports whether a workload of the history did nothing the checks can judge: no
// register write accepted, no permit, no tick or no partition write accepted.
func (hist *faultHistory) idle() bool {
	return hist.count("ok") == 0 || len(hist.permits) == 0 || hist.ticks == 0 || len(hist.partOK) == 0
}

// settle lets the workers run on, without faults, until every workload has done something
// the checks can judge, or limit passes (check then says which did nothing): on a loaded
// machine the fault window can end before a workload got going.
func (h *faultHarness) settle(limit time.Duration) {
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		h.mu.Lock()
		lines := slices.Clone(h.lines)
		h.mu.Unlock()
		if !parseFaultHistory(h.t, lines).idle() {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// checkOutbox drains what the workers' relays left, then checks that every committed
// message was applied exactly once, no rolled-back one was, and each key's messages were
// first applied in order.
func (h *faultHarness) checkOutbox() {
	relay, err := newFaultRelay(h.admin, "drain")
	if err != nil {
		h.t.Fatal(err)
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		var pending int
		if err := h.admin.QueryRow(h.ctx, `SELECT count(*) FROM pgcoord_outbox WHERE topic = $1 AND state = 'pending'`,
			faultTopic).Scan(&pending); err != nil {
			h.t.Fatal(err)
		}
		if pending == 0 {
			break
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("%d outbox messages still pending 60s after the faults", pending)
		}
		if n, err := relay.RunBatch(h.ctx); err != nil {
			h.t.Fatal(err)
		} else if n == 0 {
			time.Sleep(50 * time.Millisecond) // the rest are in backoff or under an expiring claim
		}
	}
	var messages, notOnce, phantom, outOfOrder int
	err = h.admin.QueryRow(h.ctx, `SELECT
			(SELECT count(*) FROM pgcoord_outbox WHERE topic = $1),
			(SELECT count(*) FROM pgcoord_outbox o WHERE o.topic = $1
			   AND (SELECT count(*) FROM fault_applied a WHERE a.message_id = o.id) <> 1),
			(SELECT count(*) FROM fault_applied a WHERE NOT EXISTS (SELECT FROM pgcoord_outbox o WHERE o.id = a.message_id)),
			(SELECT count(*) FROM (SELECT message_id, lag(message_id) OVER (PARTITION BY key ORDER BY seq) AS prev
			                         FROM fault_applied) x WHERE prev > message_id)`, faultTopic).
		Scan(&messages, &notOnce, &phantom, &outOfOrder)
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Logf("outbox: %d committed messages", messages)
	if messages == 0 {
		h.t.Error("no outbox message committed: the workload did nothing")
	}
	if notOnce > 0 {
		h.violated("outbox-once", "%d committed outbox messages not applied exactly once", notOnce)
	}
	if phantom > 0 {
		h.violated("outbox-phantom", "%d applied messages were never committed (rolled back)", phantom)
	}
	if outOfOrder > 0 {
		h.violated("outbox-order", "%d messages first applied before an earlier message of their key", outOfOrder)
	}
}

// checkCharges checks that each idempotency key charged at most once, and exactly once if
// its response was stored.
func (h *faultHarness) checkCharges() {
	var keys, doubled, missing int
	err := h.admin.QueryRow(h.ctx, `SELECT
			(SELECT count(*) FROM pgcoord_idempotency_keys WHERE scope = $1 AND state = 'completed'),
			(SELECT count(*) FROM (SELECT key FROM fault_charges GROUP BY key HAVING count(*) > 1) d),
			(SELECT count(*) FROM pgcoord_idempotency_keys k WHERE k.scope = $1 AND k.state = 'completed'
			   AND NOT EXISTS (SELECT FROM fault_charges c WHERE c.key = k.key))`, faultPayScope).Scan(&keys, &doubled, &missing)
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Logf("idempotency: %d keys completed", keys)
	if keys == 0 {
		h.t.Error("no idempotency key completed: the workload did nothing")
	}
	if doubled > 0 {
		h.violated("charge-twice", "%d idempotency keys charged more than once", doubled)
	}
	if missing > 0 {
		h.violated("charge-missing", "%d idempotency keys completed without their charge", missing)
	}
}

// checkRegisters checks the registers' history for linearizability, with the test's own
// final read of each register, and their committed tokens for monotonicity.
func (h *faultHarness) checkRegisters(hist *faultHistory) {
	h.resolveGrants(hist)
	h.resolveWrites(hist)
	ops := hist.porcupineOps()
	for i := range faultRegisters {
		reg := fmt.Sprintf("reg-%d", i)
		call := time.Now().UnixNano()
		var token, value int64
		if err := h.admin.QueryRow(h.ctx, `SELECT token, value FROM fault_register WHERE name = $1`, reg).Scan(&token, &value); err != nil {
			h.t.Fatal(err)
		}
		ops = append(ops, porcupine.Operation{ClientId: len(hist.clients), Call: call, Return: time.Now().UnixNano(),
			Input: regInput{reg: reg}, Output: regOutput{known: true, token: token, value: value}})
	}
	// Each write of unknown outcome doubles what porcupine may have to try; resolveWrites
	// leaves few, but a long run (make ha-soak) has many operations.
	res, _ := porcupine.CheckOperationsVerbose(registerModel, ops, time.Minute+time.Duration(len(ops))*10*time.Millisecond)
	switch res {
	case porcupine.Ok:
	case porcupine.Illegal:
		h.violated("linearizable", "the fenced registers' history is not linearizable: a stale write was accepted or a read saw a lost write")
		if !h.tolerated["linearizable"] {
			h.explainRegisters(hist, ops)
		}
	default:
		h.t.Error("porcupine could not decide within a minute")
	}

	rows, err := h.admin.Query(h.ctx, `SELECT name, token FROM fault_register_log ORDER BY id`)
	if err != nil {
		h.t.Fatal(err)
	}
	defer rows.Close()
	last := map[string]int64{}
	for rows.Next() {
		var name string
		var token int64
		if err := rows.Scan(&name, &token); err != nil {
			h.t.Fatal(err)
		}
		if token < last[name] {
			h.violated("token-order", "%s: a write with token %d committed after one with token %d", name, token, last[name])
		}
		last[name] = token
	}
	if err := rows.Err(); err != nil {
		h.t.Fatal(err)
	}
}

// explainRegisters logs, for each register whose history alone is not linearizable, where
// it stops being so: the shortest prefix of its history (up to a call or a return) that
// porcupine finds illegal, and the operations, grants and committed writes of the last seconds
// before that prefix's end (times in ms from the first call; a commit's time is the
// database's clock, which a container shares with the host), so that a failure in CI can
// be read without a replay.
func (h *faultHarness) explainRegisters(hist *faultHistory, ops []porcupine.Operation) {
	byReg := map[string][]porcupine.Operation{}
	var first int64 = math.MaxInt64
	for _, op := range ops {
		r := op.Input.(regInput).reg
		byReg[r] = append(byReg[r], op)
		first = min(first, op.Call)
	}
	ms := func(t int64) string {
		if t == math.MaxInt64 || t == 0 {
			return "-"
		}
		return strconv.FormatFloat(float64(t-first)/1e6, 'f', 1, 64)
	}
	for _, reg := range slices.Sorted(maps.Keys(byReg)) {
		regOps := slices.SortedFunc(slices.Values(byReg[reg]), func(a, b porcupine.Operation) int { return cmp.Compare(a.Call, b.Call) })
		if porcupine.CheckOperations(registerModel, regOps) {
			continue
		}
		// The shortest illegal prefix, cut at a call or a return: a longer prefix only
		// constrains more, so the first illegal one is found by bisection.
		var events []int64
		for _, op := range regOps {
			events = append(events, op.Call)
			if op.Return != math.MaxInt64 {
				events = append(events, op.Return)
			}
		}
		slices.Sort(events)
		events = slices.Compact(events)
		n := sort.Search(len(events), func(i int) bool {
			return !porcupine.CheckOperations(registerModel, historyUntil(regOps, events[i]))
		})
		end := events[min(n, len(events)-1)] // none illegal: only the pending writes' outcomes decide
		from := end - explainWindow.Nanoseconds()
		type line struct {
			at   int64
			text string
		}
		var lines []line
		for _, op := range historyUntil(regOps, end) {
			if op.Return < from {
				continue
			}
			in, out := op.Input.(regInput), op.Output.(regOutput)
			what := fmt.Sprintf("read -> token %d value %d (from %s)", out.token, out.value, out.server)
			if in.write {
				outcome := "unknown"
				if out.known && out.accepted {
					outcome = "accepted"
				} else if out.known {
					outcome = "refused"
				}
				what = fmt.Sprintf("write token %d value %d (refusable %v, mustRefuse %v) -> %s", in.token, in.value, in.refusable, in.mustRefuse, outcome)
			}
			lines = append(lines, line{op.Call, fmt.Sprintf("%10s..%-10s client %d %s", ms(op.Call), ms(op.Return), op.ClientId, what)})
		}
		for _, id := range hist.order {
			if op := hist.ops[id]; op.grant && op.outcome == "granted" && op.reg == reg && op.call <= end && (op.ret == 0 || op.ret >= from) {
				ret := op.ret
				if ret > end {
					ret = 0 // not returned then
				}
				lines = append(lines, line{op.call, fmt.Sprintf("%10s..%-10s grant %s to %s: %s %d", ms(op.call), ms(ret), id, op.worker, op.outcome, op.token)})
			}
		}
		rows, err := h.admin.Query(h.ctx, `SELECT (extract(epoch FROM at) * 1e9)::bigint, token, value FROM fault_register_log
			WHERE name = $1 AND at BETWEEN to_timestamp($2 / 1e9) AND to_timestamp($3 / 1e9) ORDER BY id`, reg, from, end)
		if err != nil {
			h.t.Fatal(err)
		}
		for rows.Next() {
			var at, token, value int64
			if err := rows.Scan(&at, &token, &value); err != nil {
				h.t.Fatal(err)
			}
			lines = append(lines, line{at, fmt.Sprintf("%10s             committed token %d value %d", ms(at), token, value)})
		}
		if err := rows.Err(); err != nil {
			h.t.Fatal(err)
		}
		slices.SortStableFunc(lines, func(a, b line) int { return cmp.Compare(a.at, b.at) })
		var b strings.Builder
		for _, l := range lines {
			b.WriteString(l.text)
			b.WriteByte('\n')
		}
		h.t.Logf("%s is not linearizable alone (%d operations): its history up to %s ms is not. Its last %v, with the grants made (call..return, ms; - not returned then):\n%s",
			reg, len(regOps), ms(end), explainWindow, b.String())
	}
}

// explainWindow is how much of a register's history, up to the end of its shortest illegal
// prefix, explainRegisters shows.
const explainWindow = 3 * time.Second

// historyUntil returns ops as they stood at time end: those called by then, a write not
// returned by then as pending (its outcome unknown), a read not returned left out.
func historyUntil(ops []porcupine.Operation, end int64) []porcupine.Operation {
	var out []porcupine.Operation
	for _, op := range ops {
		if op.Call > end {
			continue
		}
		if op.Return > end {
			if !op.Input.(regInput).write {
				continue
			}
			op.Return, op.Output = math.MaxInt64, regOutput{}
		}
		out = append(out, op)
	}
	return out
}

// resolveWrites settles the register writes whose reply was lost by the database's log of
// committed writes: one that is in it committed (its value is unique), one that is not had
// no effect that survived and is dropped ("lost"). porcupine then need not try both for
// each. A read that saw a lost write is dropped too ("read-lost"), and counted: the write
// committed on a primary that a failover then left behind, and the read saw it there —
// PostgreSQL shows a commit waiting for its synchronous standby to other sessions before
// the standby has it (docs/ha.md, the first caution). That is the server's doing; the
// checks judge what pgcoord acknowledged and what the fence accepted. So is a read that a
// deposed primary answered (dropDeposedReads).
func (h *faultHarness) resolveWrites(hist *faultHistory) {
	type write struct {
		reg          string
		token, value int64
	}
	committed := map[write]bool{}
	rows, err := h.admin.Query(h.ctx, `SELECT name, token, value FROM fault_register_log`)
	if err != nil {
		h.t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var w write
		if err := rows.Scan(&w.reg, &w.token, &w.value); err != nil {
			h.t.Fatal(err)
		}
		committed[w] = true
	}
	if err := rows.Err(); err != nil {
		h.t.Fatal(err)
	}
	lost := map[write]bool{}
	for _, op := range hist.ops {
		if op.write && op.outcome == "" {
			w := write{op.reg, op.token, op.val}
			op.outcome = "ok"
			if !committed[w] {
				op.outcome, lost[w] = "lost", true
			}
		}
	}
	readLost := 0
	for _, op := range hist.ops {
		if op.outcome == "read" && lost[write{op.reg, op.token, op.val}] {
			op.outcome = "read-lost"
			readLost++
		}
	}
	if readLost > 0 {
		h.t.Logf("%d register reads saw a write of unknown outcome that a failover then lost (a commit visible before it reached the standby): left out", readLost)
	}
	if deposed := hist.dropDeposedReads(); deposed > 0 {
		h.t.Logf("%d register reads were answered by a deposed primary (its timeline older than a token acknowledged before the read): left out", deposed)
	}
}

// dropDeposedReads drops ("read-deposed") each read whose server wrote on an older timeline
// than a token acknowledged before the read was called (a token's timeline is in its high
// bits: the timeline floor), and says how many it dropped. A newer primary existed, and the
// read came from a primary that a failover had deposed and that had not yet stepped down (a
// frozen primary, thawed, answers on its open connections until Patroni demotes it): it may
// be stale, and that is the server's doing, as a read of a lost write is. A write there
// cannot commit without the standbys, which follow the new primary.
func (hist *faultHistory) dropDeposedReads() int {
	var acked []*faultOp // the answered grants and accepted writes, of any register
	for _, op := range hist.ops {
		if op.ret != 0 && (op.outcome == "granted" || op.write && op.outcome == "ok") {
			acked = append(acked, op)
		}
	}
	deposed := 0
	for _, op := range hist.ops {
		if op.outcome != "read" || op.timeline == 0 {
			continue
		}
		for _, a := range acked {
			if a.ret < op.call && tokenTimeline(a.token) > op.timeline {
				op.outcome = "read-deposed"
				deposed++
				break
			}
		}
	}
	return deposed
}

// tokenTimeline is the timeline a fence token was issued on: tokens start above
// (timeline - 1) << 44 (pgcoord_token_floor).
func tokenTimeline(token int64) int64 { return token>>44 + 1 }

// resolveGrants gives each grant attempt whose reply was lost the token it committed, from
// the database's log of grants, or drops it when it committed none: the attempt's holder
// was granted, on that register, a token above the one of its latest answered attempt
// before it. (If that grant was in fact made by a later attempt of the holder, placing it
// at the lost attempt — which porcupine may linearize anywhere after its call — only adds
// possible orders.)
func (h *faultHarness) resolveGrants(hist *faultHistory) {
	type holderReg struct{ holder, reg string }
	logged := map[holderReg][]int64{}
	rows, err := h.admin.Query(h.ctx, `SELECT holder, name, token FROM fault_grant_log ORDER BY token`)
	if err != nil {
		h.t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var k holderReg
		var token int64
		if err := rows.Scan(&k.holder, &k.reg, &token); err != nil {
			h.t.Fatal(err)
		}
		logged[k] = append(logged[k], token)
	}
	if err := rows.Err(); err != nil {
		h.t.Fatal(err)
	}
	answered := map[holderReg]int64{} // the token of the holder's latest answered grant
	for _, id := range hist.order {
		op := hist.ops[id]
		if !op.grant {
			continue
		}
		k := holderReg{op.worker, op.reg}
		switch op.outcome {
		case "granted":
			answered[k] = op.token
		case "":
			op.outcome = "lost" // committed nothing, unless the log says otherwise
			for _, token := range logged[k] {
				if token > answered[k] {
					op.outcome, op.token = "granted", token
					break
				}
			}
		}
	}
}

// checkGrants checks that no token was granted twice and no two grants were trusted at once.
func (h *faultHarness) checkGrants(hist *faultHistory) {
	type key struct {
		reg   string
		token int64
	}
	seen := map[key]string{}
	byReg := map[string][]faultGrant{}
	for _, g := range hist.grants {
		k := key{g.reg, g.token}
		if w, dup := seen[k]; dup && w != g.worker {
			h.violated("token-reused", "%s: token %d granted to %s and to %s", g.reg, g.token, w, g.worker)
		}
		seen[k] = g.worker
		byReg[g.reg] = append(byReg[g.reg], g)
	}
	for reg, gs := range byReg {
		// A grant whose holder was paused between its reply and its trust line may have an
		// empty interval: it never trusted the grant at all.
		gs = slices.DeleteFunc(gs, func(g faultGrant) bool { return g.until <= g.from })
		slices.SortFunc(gs, func(a, b faultGrant) int { return int(a.from - b.from) })
		for i, a := range gs {
			for _, b := range gs[i+1:] {
				if b.from >= a.until {
					break
				}
				if a.token != b.token {
					h.violated("trusted-twice", "%s: grant %d (%s) trusted until %v, grant %d (%s) from %v: two holders trusted at once",
						reg, a.token, a.worker, time.Unix(0, a.until), b.token, b.worker, time.Unix(0, b.from))
				}
			}
		}
	}
}

// checkPermits checks that no instant of the database clock had more than the limit of
// live permits.
func (h *faultHarness) checkPermits(hist *faultHistory) {
	type edge struct {
		at    int64
		delta int
	}
	var edges []edge
	for _, p := range hist.permits {
		edges = append(edges, edge{p.start, +1}, edge{p.end, -1})
	}
	// At equal instants, ends before starts: a slot freed at t can be taken at t.
	slices.SortFunc(edges, func(a, b edge) int {
		if a.at != b.at {
			return int(a.at - b.at)
		}
		return a.delta - b.delta
	})
	live, most := 0, 0
	for _, e := range edges {
		live += e.delta
		most = max(most, live)
	}
	if most > faultSemLimit {
		h.violated("permits", "%d permits of %s live at one instant, limit %d", most, faultSemKey, faultSemLimit)
	}
}

// checkTicks checks the cron job's effects against its ledger.
func (h *faultHarness) checkTicks() {
	var doubled, missing int
	err := h.admin.QueryRow(h.ctx, `SELECT
			(SELECT count(*) FROM (SELECT tick FROM fault_effects GROUP BY tick HAVING count(*) > 1) d),
			(SELECT count(*) FROM pgcoord_job_runs r WHERE r.job = $1 AND r.state = 'succeeded'
			   AND NOT EXISTS (SELECT FROM fault_effects e WHERE e.tick = (extract(epoch FROM r.scheduled_for) * 1e6)::bigint))`,
		faultCronJob).Scan(&doubled, &missing)
	if err != nil {
		h.t.Fatal(err)
	}
	if doubled > 0 {
		h.violated("tick-twice", "%d cron ticks recorded their effect more than once", doubled)
	}
	if missing > 0 {
		h.violated("tick-missing", "%d cron ticks succeeded in the ledger without their effect", missing)
	}
}

// logRunErrors logs why the cron runs that did not succeed ended, most frequent first: a run
// where no tick succeeded must say why.
func (h *faultHarness) logRunErrors() {
	rows, err := h.admin.Query(h.ctx, `SELECT state, coalesce(error, ''), count(*) FROM pgcoord_job_runs
		WHERE job = $1 AND state <> 'succeeded' GROUP BY 1, 2 ORDER BY 3 DESC LIMIT 10`, faultCronJob)
	if err != nil {
		h.t.Error(err)
		return
	}
	for rows.Next() {
		var state, why string
		var n int
		if err := rows.Scan(&state, &why, &n); err != nil {
			h.t.Error(err)
			return
		}
		h.t.Logf("cron runs %s ×%d: %s", state, n, why)
	}
	if err := rows.Err(); err != nil {
		h.t.Error(err)
	}
}
