//go:build unix

package integration_test

import (
	"context"
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"net/url"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/internal/workerproc"
	"github.com/pgcoord/pgcoord/pgcoord"
)

// The fault-injection suite. Worker processes (faultworker_test.go) run fenced registers
// under leases, a semaphore, a cron job, idempotent charges and an outbox with relays and an
// inbox against a PostgreSQL server of the test's own, through a proxy, while the test
// injects faults at random: it pauses workers past their leases (SIGSTOP, SIGCONT), kills
// them (SIGKILL) and starts replacements, terminates their backends, delays, throttles or
// cuts the network, and restarts the server with a fast or an immediate shutdown. Then it checks the whole history against the invariants of every primitive:
//
//   - the fenced registers' history is linearizable (porcupine), with a write accepted iff
//     its token is not lower than the register's: no stale-token write was ever accepted;
//   - the tokens of each register's committed writes never decrease;
//   - no lease token was granted twice, and no two grants of a register were trusted at
//     the same instant (each from its reply to its trust deadline);
//   - never more than the limit of semaphore permits live at once, by the database clock;
//   - each cron tick's effect recorded at most once, and once for every tick that succeeded;
//   - each idempotency key's side effect (a charge) made at most once, and once for every
//     key whose response was stored;
//   - each committed outbox message applied exactly once through the inbox, in its key's
//     order, and no rolled-back message applied.
//
// The run is seeded: a failure prints the seed, and PGCOORD_FAULT_SEED=<seed> replays the
// same choices of faults (timing still varies). PGCOORD_FAULT_DURATION sets how long faults
// are injected (default 20s; `make soak` runs it for longer).

const (
	envFaultSeed     = "PGCOORD_FAULT_SEED"
	envFaultDuration = "PGCOORD_FAULT_DURATION"
	faultWorkers     = 5
	faultSchema      = "faults"
)

const faultTables = `
CREATE TABLE fault_register (name text PRIMARY KEY, token bigint NOT NULL, value bigint NOT NULL);
INSERT INTO fault_register SELECT 'reg-' || i, 0, 0 FROM generate_series(0, %d - 1) AS i;
-- Every committed write of a register, in commit order (the row lock orders them).
CREATE TABLE fault_register_log (id bigserial PRIMARY KEY, name text NOT NULL, token bigint NOT NULL);
CREATE FUNCTION fault_register_logged() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	INSERT INTO fault_register_log (name, token) VALUES (NEW.name, NEW.token);
	RETURN NEW;
END $$;
CREATE TRIGGER fault_register_logged AFTER UPDATE ON fault_register FOR EACH ROW EXECUTE FUNCTION fault_register_logged();
-- Every committed grant of a register's lease: the fence refuses lower tokens from then on,
-- so the checker must know the grants whose replies were lost.
CREATE TABLE fault_grant_log (id bigserial PRIMARY KEY, name text NOT NULL, holder text NOT NULL, token bigint NOT NULL);
CREATE FUNCTION fault_grant_logged() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	IF NEW.name LIKE 'reg-%%' AND (TG_OP = 'INSERT' OR OLD.fence_token IS DISTINCT FROM NEW.fence_token) THEN
		INSERT INTO fault_grant_log (name, holder, token) VALUES (NEW.name, NEW.holder, NEW.fence_token);
	END IF;
	RETURN NULL;
END $$;
CREATE TRIGGER fault_grant_logged AFTER INSERT OR UPDATE ON pgcoord_leases FOR EACH ROW EXECUTE FUNCTION fault_grant_logged();
CREATE TABLE fault_effects (tick bigint NOT NULL, worker text NOT NULL, token bigint NOT NULL);
CREATE TABLE fault_charges (key text NOT NULL, worker text NOT NULL); -- no UNIQUE: duplicates must show
CREATE TABLE fault_applied (seq bigserial PRIMARY KEY, message_id bigint NOT NULL, key text NOT NULL, worker text NOT NULL);`

func TestFaults(t *testing.T) {
	t.Parallel()
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv(envFaultSeed); s != "" {
		var err error
		if seed, err = strconv.ParseUint(s, 10, 64); err != nil {
			t.Fatalf("%s=%q: %v", envFaultSeed, s, err)
		}
	}
	duration := 20 * time.Second
	if d := os.Getenv(envFaultDuration); d != "" {
		var err error
		if duration, err = time.ParseDuration(d); err != nil {
			t.Fatalf("%s=%q: %v", envFaultDuration, d, err)
		}
	}
	t.Logf("seed %d, faults for %v (replay with %s=%d)", seed, duration, envFaultSeed, seed)
	defer func() {
		if t.Failed() {
			t.Logf("FAILED with seed %d: replay with %s=%d", seed, envFaultSeed, seed)
		}
	}()

	h := newFaultHarness(t, seed)
	h.startWorkers()
	h.injectFaults(duration)
	h.stopWorkers()
	h.check()
}

// faultHarness is one run of the suite: the server, the proxies, the workers and what
// they said.
type faultHarness struct {
	t           *testing.T
	ctx         context.Context
	rng         *rand.Rand
	seed        uint64
	container   string // the server's container
	workerProxy *netProxy
	adminProxy  *netProxy // never faulted: the test's own view of the server
	workerURL   string
	admin       *pgxpool.Pool

	mu      sync.Mutex
	started int                         // workers started so far
	workers map[string]*workerproc.Proc // live workers by name
	lines   []workerLine
	faults  []string
	wg      sync.WaitGroup
}

func newFaultHarness(t *testing.T, seed uint64) *faultHarness {
	srv := pgtest.NewServer(t)
	u, err := url.Parse(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	h := &faultHarness{t: t, ctx: t.Context(), rng: rand.New(rand.NewPCG(seed, 0)), seed: seed,
		container: srv.Container.GetContainerID(), workers: map[string]*workerproc.Proc{}}
	h.workerProxy = newNetProxy(t, u.Host)
	h.adminProxy = newNetProxy(t, u.Host)
	via := func(p *netProxy) string {
		v := *u
		v.Host = p.Addr()
		return v.String()
	}
	h.workerURL = via(h.workerProxy)
	root := pgtest.NewPool(t, via(h.adminProxy), "")
	if _, err := root.Exec(h.ctx, "CREATE SCHEMA "+faultSchema); err != nil {
		t.Fatal(err)
	}
	h.admin = pgtest.NewPool(t, via(h.adminProxy), faultSchema)
	if _, err := pgcoord.Migrate(h.ctx, h.admin, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := h.admin.Exec(h.ctx, fmt.Sprintf(faultTables, faultRegisters)); err != nil {
		t.Fatal(err)
	}
	return h
}

// startWorker starts a worker named name and collects its lines.
func (h *faultHarness) startWorker(name string) {
	h.started++
	w, err := startWorker(h.t, name, faultRole, h.workerURL, faultSchema, map[string]string{
		"NAME": name, "SEED": strconv.FormatUint(h.seed+uint64(h.started), 10),
	})
	if err != nil {
		h.t.Fatal(err)
	}
	h.mu.Lock()
	h.workers[name] = w
	h.mu.Unlock()
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		for line := range w.Lines() {
			h.mu.Lock()
			h.lines = append(h.lines, workerLine{worker: w, line: line})
			h.mu.Unlock()
		}
	}()
}

func (h *faultHarness) startWorkers() {
	for i := range faultWorkers {
		h.startWorker(fmt.Sprintf("w%d", i+1))
	}
}

// pick returns a random live worker.
func (h *faultHarness) pick() (string, *workerproc.Proc) {
	h.mu.Lock()
	defer h.mu.Unlock()
	names := slices.Sorted(maps.Keys(h.workers))
	n := names[h.rng.IntN(len(names))]
	return n, h.workers[n]
}

func (h *faultHarness) between(lo, hi time.Duration) time.Duration {
	return lo + time.Duration(h.rng.Int64N(int64(hi-lo)))
}

// injectFaults injects a random fault every few hundred milliseconds for d.
func (h *faultHarness) injectFaults(d time.Duration) {
	deadline := time.Now().Add(d)
	lastRestart := time.Now()
	generation := map[string]int{}
	for time.Now().Before(deadline) {
		time.Sleep(h.between(300*time.Millisecond, 900*time.Millisecond))
		var fault string
		switch r := h.rng.IntN(100); {
		case r < 35: // a GC pause, past the lease
			name, w := h.pick()
			pause := h.between(200*time.Millisecond, 1200*time.Millisecond)
			fault = fmt.Sprintf("SIGSTOP %s for %v", name, pause)
			if w.Signal(syscall.SIGSTOP) == nil {
				time.AfterFunc(pause, func() { _ = w.Signal(syscall.SIGCONT) })
			}
		case r < 50: // a crash
			name, w := h.pick()
			fault = "SIGKILL " + name
			_ = w.Signal(syscall.SIGKILL)
			h.mu.Lock()
			delete(h.workers, name)
			h.mu.Unlock()
			base, _, _ := strings.Cut(name, ".") // its replacement: w3 -> w3.1 -> w3.2 ...
			generation[base]++
			h.startWorker(fmt.Sprintf("%s.%d", base, generation[base]))
		case r < 62:
			fault = "pg_terminate_backend of a worker's connection"
			_, _ = h.admin.Exec(h.ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
				WHERE application_name = 'pgcoord-test-worker' ORDER BY random() LIMIT 1`)
		case r < 77:
			lat := h.between(20*time.Millisecond, 150*time.Millisecond)
			fault = fmt.Sprintf("network latency %v per chunk", lat)
			h.workerProxy.SetLatency(lat)
			time.AfterFunc(h.between(500*time.Millisecond, 2*time.Second), func() { h.workerProxy.SetLatency(0) })
		case r < 83:
			rate := 2000 + h.rng.Int64N(20000) // bytes/s: a congested link
			fault = fmt.Sprintf("network throttled to %d bytes/s", rate)
			h.workerProxy.SetRate(rate)
			time.AfterFunc(h.between(500*time.Millisecond, 2*time.Second), func() { h.workerProxy.SetRate(0) })
		case r < 92:
			cut := h.between(200*time.Millisecond, 800*time.Millisecond)
			fault = fmt.Sprintf("network cut for %v", cut)
			h.workerProxy.Cut(cut)
		case time.Since(lastRestart) > 6*time.Second:
			mode := []string{"fast", "immediate"}[h.rng.IntN(2)]
			fault = "server restart, " + mode + " shutdown"
			h.restartServer(mode)
			lastRestart = time.Now()
		default:
			continue
		}
		h.faults = append(h.faults, fault)
	}
	h.t.Logf("%d faults: %s", len(h.faults), strings.Join(h.faults, "; "))
}

// restartServer stops PostgreSQL in its container (the container stops with it) and starts
// the container again; the server comes back from crash recovery after an immediate
// shutdown, and on another host port, which the proxies follow.
func (h *faultHarness) restartServer(mode string) {
	h.t.Helper()
	docker := func(args ...string) string {
		out, err := exec.CommandContext(h.ctx, "docker", args...).CombinedOutput()
		if err != nil {
			h.t.Fatalf("docker %s: %v: %s", strings.Join(args, " "), err, out)
		}
		return strings.TrimSpace(string(out))
	}
	_, _ = exec.CommandContext(h.ctx, "docker", "exec", "-u", "postgres", h.container, "sh", "-c",
		`"$(ls -d /usr/lib/postgresql/*/bin | tail -n 1)/pg_ctl" -D "${PGDATA:-/var/lib/postgresql/data}" stop -m `+mode).CombinedOutput()
	docker("wait", h.container)
	docker("start", h.container)
	first := strings.SplitN(docker("port", h.container, "5432/tcp"), "\n", 2)[0] // 0.0.0.0:32768
	target := "127.0.0.1:" + first[strings.LastIndex(first, ":")+1:]
	h.workerProxy.SetTarget(target)
	h.adminProxy.SetTarget(target)
	deadline := time.Now().Add(60 * time.Second)
	for {
		if _, err := h.admin.Exec(h.ctx, "SELECT 1"); err == nil {
			return
		} else if time.Now().After(deadline) {
			h.t.Fatalf("server not back 60s after a restart: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// stopWorkers lets every worker finish and waits for them, bounded.
func (h *faultHarness) stopWorkers() {
	h.workerProxy.SetLatency(0)
	h.workerProxy.SetRate(0)
	h.mu.Lock()
	live := slices.Collect(maps.Values(h.workers))
	h.mu.Unlock()
	time.Sleep(1500 * time.Millisecond) // every SIGSTOP's SIGCONT has fired
	for _, w := range live {
		_ = w.Signal(syscall.SIGCONT)
		_ = w.Send("stop")
	}
	for _, w := range live {
		if err := w.Wait(30 * time.Second); err != nil {
			h.t.Errorf("worker %s: %v; stderr: %s", w.Name(), err, w.Stderr())
		}
	}
	h.wg.Wait()
}

// check checks the history and the database against every invariant.
func (h *faultHarness) check() {
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
	if hist.count("ok") == 0 || len(hist.permits) == 0 || hist.ticks == 0 {
		h.t.Fatal("a workload did nothing: the run proves nothing")
	}
	h.checkRegisters(hist)
	h.checkGrants(hist)
	h.checkPermits(hist)
	h.checkTicks()
	h.checkCharges()
	h.checkOutbox()
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
		h.t.Errorf("%d committed outbox messages not applied exactly once", notOnce)
	}
	if phantom > 0 {
		h.t.Errorf("%d applied messages were never committed (rolled back)", phantom)
	}
	if outOfOrder > 0 {
		h.t.Errorf("%d messages first applied before an earlier message of their key", outOfOrder)
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
		h.t.Errorf("%d idempotency keys charged more than once", doubled)
	}
	if missing > 0 {
		h.t.Errorf("%d idempotency keys completed without their charge", missing)
	}
}

// checkRegisters checks the registers' history for linearizability, with the test's own
// final read of each register, and their committed tokens for monotonicity.
func (h *faultHarness) checkRegisters(hist *faultHistory) {
	h.resolveGrants(hist)
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
	res, _ := porcupine.CheckOperationsVerbose(registerModel, ops, time.Minute)
	switch res {
	case porcupine.Ok:
	case porcupine.Illegal:
		h.t.Error("the fenced registers' history is not linearizable: a stale write was accepted or a read saw a lost write")
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
			h.t.Errorf("%s: a write with token %d committed after one with token %d", name, token, last[name])
		}
		last[name] = token
	}
	if err := rows.Err(); err != nil {
		h.t.Fatal(err)
	}
}

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
			h.t.Errorf("%s: token %d granted to %s and to %s", g.reg, g.token, w, g.worker)
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
					h.t.Errorf("%s: grant %d (%s) trusted until %v, grant %d (%s) from %v: two holders trusted at once",
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
		h.t.Errorf("%d permits of %s live at one instant, limit %d", most, faultSemKey, faultSemLimit)
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
		h.t.Errorf("%d cron ticks recorded their effect more than once", doubled)
	}
	if missing > 0 {
		h.t.Errorf("%d cron ticks succeeded in the ledger without their effect", missing)
	}
}

// faultHistory is what the workers said.
type faultHistory struct {
	ops     map[string]*faultOp
	order   []string // op ids in the order of their calls
	clients map[string]int
	grants  []faultGrant
	permits map[string]*faultPermit // by worker/token
	ticks   int
	end     int64 // after the last event
}

type faultOp struct {
	worker     string
	call, ret  int64 // ret 0: no reply (unknown outcome)
	write      bool
	grant      bool // an attempt to take the register's lease
	reg        string
	token, val int64  // written, read, or granted
	outcome    string // "ok", "stale", "read", "granted", "held", "lost", or "" (unknown)
}

type faultGrant struct {
	worker      string
	reg         string
	token       int64
	from, until int64
}

type faultPermit struct{ start, end int64 }

func (hi *faultHistory) count(outcome string) int {
	n := 0
	for _, op := range hi.ops {
		if op.write && op.outcome == outcome {
			n++
		}
	}
	return n
}

func parseFaultHistory(t *testing.T, lines []workerLine) *faultHistory {
	hi := &faultHistory{ops: map[string]*faultOp{}, clients: map[string]int{}, permits: map[string]*faultPermit{}}
	num := func(s string) int64 {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			t.Fatalf("bad number %q in a worker's line", s)
		}
		return n
	}
	for _, l := range lines {
		f := strings.Fields(l.line)
		if len(f) == 0 {
			continue
		}
		name := l.worker.Name()
		switch {
		case f[0] == "op" && len(f) >= 5 && f[2] == "call":
			op := &faultOp{worker: name, call: num(f[3]), write: f[4] == "write", reg: f[5]}
			if op.write {
				op.token, op.val = num(f[6]), num(f[7])
			}
			hi.ops[f[1]] = op
			hi.order = append(hi.order, f[1])
			hi.end = max(hi.end, op.call)
			if _, ok := hi.clients[name]; !ok {
				hi.clients[name] = len(hi.clients)
			}
		case f[0] == "op" && f[2] == "ret":
			op := hi.ops[f[1]]
			if op == nil {
				t.Fatalf("a reply without a call: %q", l.line)
			}
			op.ret = num(f[3])
			hi.end = max(hi.end, op.ret)
			if op.write {
				op.outcome = f[4]
			} else {
				op.outcome, op.token, op.val = "read", num(f[4]), num(f[5])
			}
		case f[0] == "acq" && len(f) == 5 && f[2] == "call":
			hi.ops[f[1]] = &faultOp{worker: name, call: num(f[3]), grant: true, reg: f[4]}
			hi.order = append(hi.order, f[1])
			hi.end = max(hi.end, num(f[3]))
			if _, ok := hi.clients[name]; !ok {
				hi.clients[name] = len(hi.clients)
			}
		case f[0] == "acq" && len(f) == 5 && f[2] == "ret":
			op := hi.ops[f[1]]
			if op == nil {
				t.Fatalf("a reply without a call: %q", l.line)
			}
			op.ret = num(f[3])
			hi.end = max(hi.end, op.ret)
			if f[4] == "held" {
				op.outcome = "held"
			} else {
				op.outcome, op.token = "granted", num(f[4])
			}
		case f[0] == "trust":
			hi.grants = append(hi.grants, faultGrant{worker: name, reg: f[1], token: num(f[2]), from: num(f[3]), until: num(f[4])})
		case f[0] == "untrust":
			for i := range slices.Backward(hi.grants) {
				if g := &hi.grants[i]; g.worker == name && g.reg == f[1] && g.token == num(f[2]) {
					g.until = min(g.until, num(f[3]))
					break
				}
			}
		case f[0] == "permit" && f[2] == "start":
			hi.permits[name+"/"+f[1]] = &faultPermit{start: num(f[3]), end: num(f[4])} // until its expiry
		case f[0] == "permit" && f[2] == "end":
			if p := hi.permits[name+"/"+f[1]]; p != nil {
				p.end = min(p.end, num(f[3]))
			}
		case f[0] == "tick":
			hi.ticks++
		}
	}
	return hi
}

// porcupineOps returns the register writes and reads for porcupine. A write without a
// reply may or may not have happened: it stays open until the end of the history. A read
// without a reply tells nothing and is left out.
//
// The grants of the registers' leases matter too: the fence refuses a token lower than the
// newest grant even before that grant's holder writes. Each write carries what the grants
// say about it, in real time: it may be refused if a higher grant was called before the write
// returned (it may have committed before the write's check), and it must be refused if a
// higher grant returned before the write was called. Grants whose reply was lost count
// with the token they committed (resolveGrants) and no return: they make a refusal
// possible, never necessary.
func (hi *faultHistory) porcupineOps() []porcupine.Operation {
	grants := map[string][]*faultOp{}
	for _, id := range hi.order {
		if op := hi.ops[id]; op.grant && op.outcome == "granted" {
			grants[op.reg] = append(grants[op.reg], op)
		}
	}
	var ops []porcupine.Operation
	for _, id := range hi.order {
		op := hi.ops[id]
		if op.grant || (op.ret == 0 && !op.write) {
			continue
		}
		in := regInput{write: op.write, reg: op.reg, token: op.token, value: op.val}
		ret := op.ret
		if ret == 0 {
			ret = math.MaxInt64
		}
		if op.write {
			for _, g := range grants[op.reg] {
				if g.token > op.token && g.call < ret {
					in.refusable = true
				}
				if g.token > op.token && g.ret != 0 && g.ret < op.call {
					in.mustRefuse = true
				}
			}
		}
		o := porcupine.Operation{ClientId: hi.clients[op.worker], Call: op.call, Return: ret, Input: in}
		switch op.outcome {
		case "":
			o.Output = regOutput{}
		case "read":
			o.Output = regOutput{known: true, token: op.token, value: op.val}
		default:
			o.Output = regOutput{known: true, accepted: op.outcome == "ok"}
		}
		ops = append(ops, o)
	}
	return ops
}

// The fenced register's sequential specification: a write is accepted if and only if its
// token is not lower than the register's and no higher grant of the register's lease came
// before it (see porcupineOps), and then sets both; a read returns both.
type (
	regState struct{ token, value int64 }
	regInput struct {
		write        bool
		reg          string
		token, value int64
		// What the lease's grants say: a higher grant may have come before the write's
		// check (it may be refused), or surely did (it must be).
		refusable, mustRefuse bool
	}
	regOutput struct {
		known        bool // false: the write's outcome is unknown (no reply)
		accepted     bool // a write's outcome
		token, value int64
	}
)

var registerModel = (&porcupine.NondeterministicModel{
	Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
		byReg := map[string][]porcupine.Operation{}
		var regs []string
		for _, op := range history {
			r := op.Input.(regInput).reg
			if _, ok := byReg[r]; !ok {
				regs = append(regs, r)
			}
			byReg[r] = append(byReg[r], op)
		}
		var out [][]porcupine.Operation
		for _, r := range regs {
			out = append(out, byReg[r])
		}
		return out
	},
	Init: func() []any { return []any{regState{}} },
	Step: func(state, input, output any) []any {
		s, in, out := state.(regState), input.(regInput), output.(regOutput)
		if !in.write {
			if out.token == s.token && out.value == s.value {
				return []any{s}
			}
			return nil
		}
		current := in.token >= s.token
		next := regState{in.token, in.value}
		switch {
		case !out.known && current && !in.mustRefuse:
			return []any{s, next} // it may or may not have committed
		case !out.known:
			return []any{s}
		case out.accepted && current && !in.mustRefuse:
			return []any{next}
		case out.accepted:
			return nil // a stale write was accepted
		case !current || in.refusable:
			return []any{s}
		default:
			return nil // a current write was refused
		}
	},
}).ToModel()
