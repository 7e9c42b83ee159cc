//go:build unix

package integration_test

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/internal/workerproc"
	"github.com/pgcoord/pgcoord/ratelimit"
)

// Rate limits across real processes: each worker process runs goroutines that call
// ratelimit.Allow in a transaction that also records the admitted call, so a charge and its
// record commit together or not at all (ratelimit_worker_test.go).

const rlSchema = `
CREATE TABLE rl_exact_calls (worker text NOT NULL, before_at timestamptz NOT NULL, after_at timestamptz NOT NULL);
CREATE TABLE rl_nested_calls (worker text NOT NULL, key text NOT NULL, tenant text NOT NULL, cost bigint NOT NULL);
CREATE TABLE rl_line_calls (waiter text PRIMARY KEY, arrived_at timestamptz NOT NULL, judged_at timestamptz NOT NULL, slot_at timestamptz NOT NULL, woke_at timestamptz NOT NULL);
`

// rlRun starts procs worker processes of mode with goroutines each, lets them run until
// until reports done (polled; it also reports their progress, so that a busy machine's
// slower run is not taken for a stuck one), tells them to quit, and returns their "done"
// lines' fields.
func rlRun(t *testing.T, pool *pgxpool.Pool, schema, mode string, procs, goroutines int, until func() (bool, int64)) [][]string {
	t.Helper()
	var ps []*workerproc.Proc
	for i := range procs {
		name := fmt.Sprintf("%s%d", mode, i)
		p, err := startWorker(t, name, rlRole, pgtest.URL(t), schema, map[string]string{
			"NAME": name, "MODE": mode, "SEED": fmt.Sprint(i + 1), "GOROUTINES": fmt.Sprint(goroutines)})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := p.Expect(pgtest.WaitLimit, "ready"); err != nil {
			t.Fatal(err)
		}
		ps = append(ps, p)
	}
	pgtest.UntilProgress(t, "the run's end", until)
	var done [][]string
	for _, p := range ps {
		if err := p.Send("quit"); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range ps {
		line, err := p.Expect(pgtest.WaitLimit, "done")
		if err != nil {
			t.Fatal(err)
		}
		done = append(done, strings.Fields(line))
	}
	return done
}

// 3 processes × 16 goroutines on one key at 100/s, burst 10, for 10 s: over every stretch
// of the run, the admitted calls never exceed stretch × 100 + 10. And the key admits: at
// least half of that allowance over the whole run, when its callers asked for at least
// the allowance. (On an idle machine it admits 99% of it; the threshold is low because a
// machine starved of CPU stalls all 48 callers at once, and a key nobody calls for longer
// than its burst's time loses that time's units, as GCRA should. Callers that asked for
// less than the allowance, admitted and refused together, were slowed by the machine, not
// by the limiter: this test must not fail for a busy machine's stalls.)
func TestRatelimitExactAcrossProcesses(t *testing.T) {
	t.Parallel()
	pool, schema := workerDB(t, rlSchema)
	if _, err := ratelimit.Set(t.Context(), pool, ratelimit.Policy{Name: "rl_exact", Rate: 100, Period: time.Second, Burst: 10}); err != nil {
		t.Fatal(err)
	}
	var first time.Time
	done := rlRun(t, pool, schema, "exact", 3, 16, func() (bool, int64) {
		var n int
		var at *time.Time
		if err := pool.QueryRow(t.Context(), `SELECT count(*), min(before_at) FROM rl_exact_calls`).Scan(&n, &at); err != nil {
			t.Fatal(err)
		}
		if at != nil {
			first = *at
		}
		// Ten seconds of the database clock since the first admission.
		return at != nil && n >= 1010 && time.Since(first) > 0 && dbSince(t, pool, first) >= 10*time.Second, int64(n)
	})

	rows, err := pool.Query(t.Context(), `SELECT before_at, after_at FROM rl_exact_calls ORDER BY before_at`)
	if err != nil {
		t.Fatal(err)
	}
	calls, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (bracketedCall, error) {
		var c bracketedCall
		return c, r.Scan(&c.before, &c.after)
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := checkRateBound(calls, 100, 10, 0); err != nil {
		t.Fatal(err)
	}
	whole := calls[len(calls)-1].after.Sub(calls[0].before)
	allowance := whole.Seconds()*100 + 10
	var asked int64 // the calls the workers made, admitted or refused
	for _, f := range done {
		var admitted, refused int64
		fmt.Sscan(f[1], &admitted)
		fmt.Sscan(f[6], &refused)
		asked += admitted + refused
	}
	t.Logf("%d calls admitted in %v: %.1f%% of the allowance %.0f; %d asked", len(calls), whole, 100*float64(len(calls))/allowance, allowance, asked)
	if float64(len(calls)) < 0.5*allowance && float64(asked) >= allowance {
		t.Fatalf("%d calls admitted in %v, less than half the allowance %.0f, of %d asked: the limiter starved its callers", len(calls), whole, allowance, asked)
	}
}

// bracketedCall is an admitted call, with the database clock read before it and after it:
// its charge happened in between.
type bracketedCall struct{ before, after time.Time }

// checkRateBound checks that calls never exceed rate per second with a burst over any
// stretch of time up to horizon (0: any): for a stretch starting at a call's before, the
// calls wholly inside [before, e] number at most (e - before) × rate + burst, checked at
// every call's after (the whole run is checked from the first call).
func checkRateBound(calls []bracketedCall, rate, burst float64, horizon time.Duration) error {
	slices.SortFunc(calls, func(a, b bracketedCall) int { return a.before.Compare(b.before) })
	for i := range calls {
		afters := make([]time.Time, 0, len(calls)-i)
		for _, c := range calls[i:] {
			if i > 0 && horizon > 0 && c.before.Sub(calls[i].before) > horizon {
				break
			}
			afters = append(afters, c.after)
		}
		slices.SortFunc(afters, time.Time.Compare)
		for m, e := range afters {
			if bound := e.Sub(calls[i].before).Seconds()*rate + burst; float64(m+1) > bound {
				return fmt.Errorf("%d calls admitted within %v from %v: more than %.1f at %v/s, burst %v",
					m+1, e.Sub(calls[i].before), calls[i].before.UTC(), bound, rate, burst)
			}
		}
	}
	return nil
}

// dbSince is how long ago at was, by the database clock.
func dbSince(t *testing.T, pool *pgxpool.Pool, at time.Time) time.Duration {
	t.Helper()
	var d time.Duration
	if err := pool.QueryRow(t.Context(), `SELECT clock_timestamp() - $1::timestamptz`, at).Scan(&d); err != nil {
		t.Fatal(err)
	}
	return d
}

// Nested limits under concurrency, with refusals at each level and backends killed
// mid-call: afterwards every limit's charges equal exactly the admitted calls' costs. The
// clock is frozen at t0, so a key's arrival time is t0 + the units charged to it (one unit
// a second), whatever the order of the calls.
func TestRatelimitNestedChargesMatchAdmissions(t *testing.T) {
	t.Parallel()
	pool, schema := workerDB(t, rlSchema)
	t0 := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	pgtest.NewClock(t, pool).Freeze(t0)
	// k0 takes 45% of the calls and spends its 300 first; tenant t0 (k0-k3) spends its 500
	// at about 1,040 units of the global 1,300, so the last 260 leave each level refusing
	// with a wide margin (a tenant limit of 600 was spent only at about 1,400 of 1,500, and a
	// run with many killed calls could end before it refused).
	bursts := map[string]int64{"per_key": 300, "per_tenant": 500, "global": 1300}
	for name, burst := range bursts {
		if _, err := ratelimit.Set(t.Context(), pool, ratelimit.Policy{Name: name, Rate: 1, Period: time.Second, Burst: burst}); err != nil {
			t.Fatal(err)
		}
	}
	// Kill a worker's backend every 30-60 ms until the global limit is spent (not behind a
	// pooler, where the server connections are PgBouncer's).
	kills := 0
	rng := rand.New(rand.NewPCG(3, 4))
	done := rlRun(t, pool, schema, "nested", 3, 8, func() (bool, int64) {
		if !pgtest.BehindPooler() {
			var killed bool
			if err := pool.QueryRow(t.Context(), `SELECT coalesce(bool_or(pg_terminate_backend(pid)), false) FROM (
				SELECT pid FROM pg_stat_activity WHERE application_name LIKE 'pgcoord-worker nested%'
				 ORDER BY random() LIMIT 1) s`).Scan(&killed); err != nil {
				t.Fatal(err)
			}
			if killed {
				kills++
			}
			time.Sleep(time.Duration(10+rng.IntN(30)) * time.Millisecond)
		}
		st, err := ratelimit.State(t.Context(), pool, ratelimit.Limit{Policy: "global", Key: "all"})
		if err != nil {
			t.Fatal(err)
		}
		return st.Remaining < 3, bursts["global"] - st.Remaining // no call of cost 3 fits any more
	})
	var refusedBy [3]int64
	var failed int64
	for _, f := range done {
		for i := range 3 {
			var n int64
			fmt.Sscan(f[2+i], &n)
			refusedBy[i] += n
		}
		var n int64
		fmt.Sscan(f[5], &n)
		failed += n
	}
	t.Logf("refusals by per_key %d, per_tenant %d, global %d; %d backends killed, %d calls failed", refusedBy[0], refusedBy[1], refusedBy[2], kills, failed)
	for i, name := range []string{"per_key", "per_tenant", "global"} {
		if refusedBy[i] == 0 {
			t.Errorf("%s never refused: the test did not exercise its level", name)
		}
	}
	// Each key's charged units, from its arrival time, against the recorded admissions.
	rows, err := pool.Query(t.Context(), `
		WITH charged AS (
			SELECT s.policy, s.key, (extract(epoch FROM s.tat - $1::timestamptz))::bigint AS units FROM pgcoord_ratelimit_state s),
		admitted AS (
			SELECT 'per_key' AS policy, key, sum(cost) AS units FROM rl_nested_calls GROUP BY key
			UNION ALL SELECT 'per_tenant', tenant, sum(cost) FROM rl_nested_calls GROUP BY tenant
			UNION ALL SELECT 'global', 'all', sum(cost) FROM rl_nested_calls)
		SELECT coalesce(c.policy, a.policy), coalesce(c.key, a.key), coalesce(c.units, 0), coalesce(a.units, 0)
		  FROM charged c FULL JOIN admitted a ON a.policy = c.policy AND a.key = c.key
		 ORDER BY 1, 2`, t0)
	if err != nil {
		t.Fatal(err)
	}
	type pair struct {
		policy, key       string
		charged, admitted int64
	}
	pairs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (pair, error) {
		var p pair
		return p, r.Scan(&p.policy, &p.key, &p.charged, &p.admitted)
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(pairs) != 12+3+1 {
		t.Fatalf("%d (policy, key) pairs, want 16: %+v", len(pairs), pairs)
	}
	for _, p := range pairs {
		if p.charged != p.admitted {
			t.Errorf("%s/%s: charged %d units, admitted calls cost %d", p.policy, p.key, p.charged, p.admitted)
		}
		if p.charged > bursts[p.policy] {
			t.Errorf("%s/%s: charged %d units, more than its burst %d", p.policy, p.key, p.charged, bursts[p.policy])
		}
	}
}

// Waiting in line: 200 waiters across 4 processes, arriving one every 10 ms (interleaved
// across the processes), on a limit of 50 a second with a burst of 1: first come, first
// served — a waiter whose call had reached the key's row before another waiter even
// arrived gets the earlier slot, every time (arrivals and judgements on the database
// clock) — at 50 a second (the slots of waiters that stood in line exactly 20 ms apart,
// and no two slots closer), and none wakes before its slot.
func TestRatelimitWaitersServedInArrivalOrder(t *testing.T) {
	// Behind a transaction pooler a waiter's arrival (its clock read) and its reservation
	// are two statements that may each wait in the pooler's own queue for a server
	// connection, which reorders them before they reach the key's row: the order measured
	// would be the pooler's.
	pgtest.NeedsSession(t, "arrival order: a pooler queues each statement for a server connection")
	t.Parallel()
	pool, schema := workerDB(t, rlSchema)
	if _, err := ratelimit.Set(t.Context(), pool, ratelimit.Policy{Name: "rl_line", Rate: 50, Period: time.Second, Burst: 1}); err != nil {
		t.Fatal(err)
	}
	const procs, per, spacing = 4, 50, 10 * time.Millisecond
	// A starved machine can hold every waiter back on its way to the row, leaving too few
	// pairs (or too few waiters in line) to judge: such a run is run again, up to 3 times,
	// unless it already broke a promise.
	var v lineVerdict
	for try := 1; ; try++ {
		v = judgeLine(runLine(t, pool, schema, try, procs, per, spacing))
		t.Logf("try %d: %d of %d pairs judged (%d waiters took over 100 ms to reach the row); %d inverted; %d waiters stood in line; %d woke before their slot",
			try, v.pairs, v.all, v.slow, v.inverted, v.queued, v.early)
		if v.judgeable() || v.broken() || try == 3 {
			break
		}
		if _, err := pool.Exec(t.Context(), `TRUNCATE rl_line_calls`); err != nil {
			t.Fatal(err)
		}
	}
	if v.early > 0 {
		t.Errorf("%d waiters woke before their slot", v.early)
	}
	if v.pairs < v.all/4 {
		t.Errorf("only %d of %d pairs had the earlier waiter reach the row before the later arrived: too few to judge the line", v.pairs, v.all)
	}
	if v.inverted > 0 {
		t.Errorf("%d of %d pairs of waiters served out of turn: the earlier had reached the row before the later arrived, and got the later slot", v.inverted, v.pairs)
	}
	if v.tooClose > 0 {
		t.Errorf("%d slots less than %v after the one before: faster than 50/s", v.tooClose, lineInterval)
	}
	if v.idle > 0 {
		t.Errorf("%d waiters that stood in line were not given the slot %v after the one ahead", v.idle, lineInterval)
	}
	if v.queued < v.waiters/4 {
		t.Errorf("only %d of %d waiters stood in line: too few to judge the rate", v.queued, v.waiters)
	}
}

// lineWaiter is a waiter of TestRatelimitWaitersServedInArrivalOrder as rl_line_calls
// recorded it.
type lineWaiter struct{ arrived, judged, slot, woke time.Time }

// lineInterval is the line's rate, 50/s, as the time between slots.
const lineInterval = time.Second / 50

// runLine runs procs processes of per waiters each, arriving spacing apart, through the
// key of the policy rl_line in schema, and returns what they recorded, in order of arrival.
func runLine(t *testing.T, pool *pgxpool.Pool, schema string, try, procs, per int, spacing time.Duration) []lineWaiter {
	t.Helper()
	// The schedule starts once every process can have started; a late one only makes its
	// waiters arrive later, and arrival is what the order is judged by.
	start := time.Now().Add(3 * time.Second).UnixNano()
	var ps []*workerproc.Proc
	for i := range procs {
		name := fmt.Sprintf("line%d.%d", try, i)
		p, err := startWorker(t, name, rlRole, pgtest.URL(t), schema, map[string]string{
			"NAME": name, "MODE": "line", "GOROUTINES": fmt.Sprint(per), "PROCS": fmt.Sprint(procs),
			"INDEX": fmt.Sprint(i), "START": fmt.Sprint(start), "SPACING": fmt.Sprint(int64(spacing))})
		if err != nil {
			t.Fatal(err)
		}
		ps = append(ps, p)
	}
	for _, p := range ps {
		if _, err := p.Expect(pgtest.WaitLimit, "ready"); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range ps {
		// 200 slots at 50/s take 4 s after the 3 s start.
		if _, err := p.Expect(pgtest.WaitLimit, "done"); err != nil {
			t.Fatal(err)
		}
	}
	rows, err := pool.Query(t.Context(), `SELECT arrived_at, judged_at, slot_at, woke_at FROM rl_line_calls ORDER BY arrived_at`)
	if err != nil {
		t.Fatal(err)
	}
	ws, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (lineWaiter, error) {
		var w lineWaiter
		return w, r.Scan(&w.arrived, &w.judged, &w.slot, &w.woke)
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(ws) != procs*per {
		t.Fatalf("%d waiters recorded, want %d", len(ws), procs*per)
	}
	return ws
}

// lineVerdict counts what TestRatelimitWaitersServedInArrivalOrder judges.
type lineVerdict struct {
	waiters, all, pairs, inverted, early, slow int
	tooClose, idle, queued                     int
}

// judgeable says whether the run had enough pairs and enough waiters in line to judge.
func (v lineVerdict) judgeable() bool { return v.pairs >= v.all/4 && v.queued >= v.waiters/4 }

// broken says whether the run broke a promise of the line, judgeable or not.
func (v lineVerdict) broken() bool { return v.early+v.inverted+v.tooClose+v.idle > 0 }

// judgeLine judges the waiters of one run, in order of arrival.
func judgeLine(ws []lineWaiter) lineVerdict {
	v := lineVerdict{waiters: len(ws), all: len(ws) * (len(ws) - 1) / 2}
	// A waiter arrives when it reads the clock; its call reaches the key's row later, after
	// its goroutine, the pool and the batcher have passed it on — on a machine short of
	// CPU, sometimes hundreds of milliseconds later, which says nothing about the line.
	// The line's promise is about calls that reached the row: one that was judged before
	// another waiter arrived must get the earlier slot. Such pairs are most of them; a
	// line that reordered its waiters (by polling, or by a batch or a cancel handing out
	// slots out of turn) inverts them.
	for i := range ws {
		if ws[i].woke.Before(ws[i].slot) {
			v.early++
		}
		if ws[i].judged.Sub(ws[i].arrived) > 100*time.Millisecond {
			v.slow++
		}
		for j := i + 1; j < len(ws); j++ {
			if !ws[i].judged.Before(ws[j].arrived) {
				continue
			}
			v.pairs++
			if !ws[i].slot.Before(ws[j].slot) {
				v.inverted++
			}
		}
	}
	// The rate is the slots' (the instants the database gave the waiters): when each woke
	// after its slot is up to the scheduler of a machine that may be short of CPU. No two
	// slots are closer than 1/50 s; a waiter judged before the slot ahead of it came (it
	// stood in line) gets the slot exactly 1/50 s after it. One judged later found the line
	// empty — waiters arrive at twice the rate, but a starved machine can hold them back —
	// and is served at once, which is no slower than the rate.
	bySlot := slices.SortedFunc(slices.Values(ws), func(a, b lineWaiter) int { return a.slot.Compare(b.slot) })
	for k := 1; k < len(bySlot); k++ {
		gap := bySlot[k].slot.Sub(bySlot[k-1].slot)
		if gap < lineInterval {
			v.tooClose++
		}
		if bySlot[k].judged.Before(bySlot[k-1].slot) {
			v.queued++
			if gap != lineInterval {
				v.idle++
			}
		}
	}
	return v
}
