//go:build unix

package integration_test

import (
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/internal/workerproc"
)

// TestPartitionChaos: five member processes (partition_worker_test.go) share a group of 64
// partitions, weights 1 and 2, TTL 2 s. Each writes a ledger row for each partition it owns
// every 100 ms or so, in a transaction guarded by the grant (Member.Check or fenced.Check,
// at random), and once more after the partition's context ended. Meanwhile a seeded random
// schedule pauses members past their TTL (SIGSTOP, then SIGCONT 2.5 to 4 s later), kills
// them (SIGKILL; a new process joins in their place later), has them leave (Member.Leave)
// and joins new ones; usually one event at a time, after the group settled, and one time
// in four at once (a storm). Every grant is logged (a trigger on pgcoord_partitions), from
// the sequence that numbers the ledger's rows, so ids order grants and writes: a write's
// id is taken after its guard's check, which holds the partition's row (Member.Check) or
// register (fenced.Check) until the writer commits, and a grant waits for both.
//
// Afterwards the whole history must show:
//
//   - per partition, grant tokens strictly increase, and every accepted write carries the
//     token of the newest grant before it, by the member it was granted to: the accepted
//     tokens never decrease, and no write with an older token was accepted after a newer
//     grant was made — nor, so, after its first write. Never two writers.
//   - every partition a member held when it died (killed, paused at rest, or left) was
//     written under a newer grant within 2·TTL of the death (partChaosBound), by the
//     database clock: its grants expire at most TTL after the death (its last heartbeat
//     came before it; a leave releases them at once); the new owner's next heartbeat
//     grants them and starts the writer, which writes at once — each member heartbeats
//     every TTL/3 (behind a pooler, without notifications, that period is the only way it
//     learns), and at once when a lease it waits for expires; 2·TTL/3 more is left for
//     that heartbeat, queued behind the group's others on the group's row, and the first
//     write to run on a loaded machine. Takeovers that overlap another event (of another
//     member, before the takeover, or a member stopped at the death) and pauses that
//     caught the member inside a write transaction are measured but not asserted: such a
//     transaction keeps its guard's lock (the partition's row, or its fence register)
//     until SIGCONT, and the re-plan or the grant that waits for it holds the group's row
//     meanwhile, so every heartbeat of the group waits too. Nor are the takeovers of a
//     paused member's partitions that came after the member was let go on (SIGCONT): it
//     was no longer dead, and its return re-planned the group (CI once took 4.8-5.0 s for
//     three partitions of a pause of 2.6 s, 2.2 s after the member's return).
//   - once quiet at the end (every slot filled, every partition held by its planned
//     member and written), each member holds within one of its weighted share 64·w/W, and
//     each process's Member.Owned agrees with the database: no partition owned twice.
//
// The schedule is logged; PGCOORD_FAULT_SEED=<seed> replays it (the timing still varies),
// PGCOORD_FAULT_DURATION sets how long events are injected (default 60 s; `make soak`
// runs it for SOAK, with TestFaults).
func TestPartitionChaos(t *testing.T) {
	t.Parallel()
	takeChaosTurn(t)
	seed := faultSeed(t)
	duration := faultDuration(t, 60*time.Second)
	pool, schema := workerDB(t, partChaosSchema)
	h := &partChaos{t: t, pool: pool, url: pgtest.URL(t), schema: schema, seed: seed,
		rng: rand.New(rand.NewPCG(seed, 1)), jitter: rand.New(rand.NewPCG(seed, 2)),
		lifetime: duration + 3*time.Minute, start: time.Now(), kinds: map[string]int{}, refused: map[string]int{}}
	for slot := range partChaosSlots {
		h.join(slot)
	}
	h.logf("joined")
	h.settle()
	h.logf("settled")
	end := time.Now().Add(duration)
	for n := 1; time.Now().Before(end); n++ {
		storm := h.rng.IntN(4) == 0
		if !storm {
			h.settle()
		}
		time.Sleep(time.Duration(h.rng.Int64N(int64(partChaosTTL / 2)))) // the schedule's spacing, not a wait for a condition
		h.event(n, storm)
	}
	h.finish()
	h.check()
}

const (
	partChaosGroup      = "chaos"
	partChaosPartitions = 64
	partChaosSlots      = 5
	partChaosTTL        = 2 * time.Second
	partChaosEvery      = 100 * time.Millisecond
	// partChaosBound bounds a takeover after a death (see TestPartitionChaos): the grants
	// expire (TTL), the new owner's next heartbeat grants them (TTL/3), and 2·TTL/3 more
	// for that heartbeat and the first write to run.
	partChaosBound = 2 * partChaosTTL
)

// partChaosWeights are the members' weights, by slot.
var partChaosWeights = [partChaosSlots]int{1, 2, 1, 2, 1}

// partChaosSchema: the ledger of accepted writes and the log of grants, numbered from one
// sequence.
const partChaosSchema = `
CREATE SEQUENCE part_order;
CREATE TABLE part_ledger (
	id     bigint      PRIMARY KEY DEFAULT nextval('part_order'),
	part   int         NOT NULL,
	token  bigint      NOT NULL,
	member text        NOT NULL,
	guard  text        NOT NULL,
	late   boolean     NOT NULL, -- written after the partition's context ended
	at     timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX ON part_ledger (part, token);
CREATE TABLE part_grants (
	id          bigint      PRIMARY KEY DEFAULT nextval('part_order'),
	part        int         NOT NULL,
	token       bigint      NOT NULL,
	holder      text        NOT NULL,
	acquired_at timestamptz NOT NULL
);
-- A grant's row trigger fires at the end of the granting statement, after it recorded the
-- token in the partition's fence register (and so after the writers it waited for).
CREATE FUNCTION part_grant_logged() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	IF NEW.fence_token IS DISTINCT FROM OLD.fence_token THEN
		INSERT INTO part_grants (part, token, holder, acquired_at) VALUES (NEW.partition, NEW.fence_token, NEW.holder, NEW.acquired_at);
	END IF;
	RETURN NULL;
END $$;
CREATE TRIGGER part_grant_logged AFTER UPDATE ON pgcoord_partitions FOR EACH ROW EXECUTE FUNCTION part_grant_logged();`

// partChaos is one run: the slots' member processes, the schedule, and what happened.
type partChaos struct {
	t           *testing.T
	pool        *pgxpool.Pool
	url, schema string
	seed        uint64
	rng         *rand.Rand // the schedule
	jitter      *rand.Rand // retries of a pause that caught a writer: timing, not the schedule
	lifetime    time.Duration
	start       time.Time

	slots        [partChaosSlots]*partProc // nil: empty
	incarnations [partChaosSlots]int
	deaths       []*partDeath
	kinds        map[string]int // events by kind

	mu           sync.Mutex
	marks        []partMark // the events, for overlaps
	refused      map[string]int
	failed       []string
	refusedLate  int
	workerErrors []string
}

// partProc is a member process in its slot.
type partProc struct {
	slot, weight int
	name         string
	proc         *workerproc.Proc
	replies      chan string   // joined, owned, left
	cont         chan struct{} // closed once a pause is over; nil if never paused
	paused       bool          // paused, and the schedule has not waited for its end yet
}

// stopped reports whether m is stopped now.
func (m *partProc) stopped() bool {
	if m.cont == nil {
		return false
	}
	select {
	case <-m.cont:
		return false
	default:
		return true
	}
}

// partDeath is a member's death: what it held just before, by the database clock.
type partDeath struct {
	kind       string // kill, pause, leave
	member     string
	at         time.Time // database clock, just before the signal or the instruction
	hostAt     time.Time
	held       map[int]int64     // partition → token
	expires    map[int]time.Time // partition → when its grant expires, if still held once it stopped
	inTx       bool              // a pause that caught it inside a write transaction
	overlapped bool              // another member was stopped at the time
	returned   time.Time         // a pause's end (host clock, under partChaos.mu)
}

func (h *partChaos) logf(format string, args ...any) {
	h.t.Helper()
	h.t.Logf("+%6.2fs "+format, append([]any{time.Since(h.start).Seconds()}, args...)...)
}

// partMark is an event: when it happened (host clock), and to which member.
type partMark struct {
	at     time.Time
	member string
}

// mark records an event of member at now: the deaths of other members it overlaps are not
// asserted.
func (h *partChaos) mark(member string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.marks = append(h.marks, partMark{time.Now(), member})
}

// join starts a new member process in slot and waits until it joined.
func (h *partChaos) join(slot int) *partProc {
	t := h.t
	h.incarnations[slot]++
	m := &partProc{slot: slot, weight: partChaosWeights[slot], name: fmt.Sprintf("m%d.%d", slot, h.incarnations[slot]),
		replies: make(chan string, 4)}
	p, err := startWorkerSpec(t, workerproc.Spec{Name: m.name, Role: partMemberRole, URL: h.url, Schema: h.schema,
		Lifetime: h.lifetime, Params: map[string]string{
			"MEMBER": m.name, "WEIGHT": strconv.Itoa(m.weight), "TTL": partChaosTTL.String(), "EVERY": partChaosEvery.String(),
			"SEED": strconv.FormatUint(h.seed+uint64(1000*slot+h.incarnations[slot]), 10),
		}})
	if err != nil {
		t.Fatal(err)
	}
	m.proc = p
	go func() {
		for line := range p.Lines() {
			f := strings.Fields(line)
			h.mu.Lock()
			switch {
			case len(f) == 5 && f[0] == "refused":
				h.refused[f[3]]++
				if f[4] == "true" {
					h.refusedLate++
				}
			case len(f) > 0 && f[0] == "failed":
				h.failed = append(h.failed, m.name+": "+line)
			case len(f) > 0 && f[0] == "error":
				h.workerErrors = append(h.workerErrors, m.name+": "+line)
			default:
				select {
				case m.replies <- line:
				default:
					h.workerErrors = append(h.workerErrors, m.name+": unexpected "+line)
				}
			}
			h.mu.Unlock()
		}
	}()
	h.await(m, "joined")
	h.slots[slot] = m
	return m
}

// await waits for m's next reply, which must start with prefix.
func (h *partChaos) await(m *partProc, prefix string) string {
	h.t.Helper()
	select {
	case line := <-m.replies:
		if !strings.HasPrefix(line, prefix) {
			h.t.Fatalf("member %s said %q, want %q", m.name, line, prefix)
		}
		return line
	case <-time.After(pgtest.WaitLimit):
		h.t.Fatalf("member %s did not say %q within %v%s", m.name, prefix, pgtest.WaitLimit, h.stderr(m))
		return ""
	}
}

func (h *partChaos) stderr(m *partProc) string {
	if s := strings.TrimSpace(m.proc.Stderr()); s != "" {
		return "; its stderr: " + s
	}
	return ""
}

// holdings returns the database clock and the partitions name holds now, with their tokens.
func (h *partChaos) holdings(name string) (time.Time, map[int]int64) {
	var at time.Time
	var parts []int32
	var tokens []int64
	if err := h.pool.QueryRow(h.t.Context(), `
		SELECT clock_timestamp(), coalesce(array_agg(partition ORDER BY partition), '{}'), coalesce(array_agg(fence_token ORDER BY partition), '{}')
		  FROM pgcoord_partitions WHERE group_name = $1 AND holder = $2 AND expires_at > clock_timestamp()`,
		partChaosGroup, name).Scan(&at, &parts, &tokens); err != nil {
		h.t.Fatal(err)
	}
	held := make(map[int]int64, len(parts))
	for i, p := range parts {
		held[int(p)] = tokens[i]
	}
	return at, held
}

// expiries returns when the grants of the stopped or killed member name expire, by
// partition.
func (h *partChaos) expiries(name string) map[int]time.Time {
	rows, err := h.pool.Query(h.t.Context(), `SELECT partition, expires_at FROM pgcoord_partitions
		WHERE group_name = $1 AND holder = $2`, partChaosGroup, name)
	if err != nil {
		h.t.Fatal(err)
	}
	defer rows.Close()
	out := map[int]time.Time{}
	for rows.Next() {
		var p int
		var at time.Time
		if err := rows.Scan(&p, &at); err != nil {
			h.t.Fatal(err)
		}
		out[p] = at
	}
	if err := rows.Err(); err != nil {
		h.t.Fatal(err)
	}
	return out
}

// died records a death; a death while a member is stopped overlaps a pause.
func (h *partChaos) died(kind string, m *partProc, at time.Time, held map[int]int64, hostAt time.Time) *partDeath {
	d := &partDeath{kind: kind, member: m.name, at: at, hostAt: hostAt, held: held}
	for _, o := range h.slots {
		if o != nil && o != m && o.stopped() {
			d.overlapped = true
		}
	}
	h.deaths = append(h.deaths, d)
	return d
}

// event applies the n-th event of the schedule.
func (h *partChaos) event(n int, storm bool) {
	t := h.t
	var running, empty []int
	for slot, m := range h.slots {
		switch {
		case m == nil:
			empty = append(empty, slot)
		case !m.paused:
			running = append(running, slot)
		}
	}
	type choice struct {
		kind   string
		weight int
	}
	var choices []choice
	if len(empty) > 0 {
		choices = append(choices, choice{"join", 3})
	}
	if len(running) >= 3 && partChaosSlots-len(empty) >= 4 { // two members run on, at least
		choices = append(choices, choice{"pause", 3}, choice{"kill", 2}, choice{"leave", 2})
	}
	total := 0
	for _, c := range choices {
		total += c.weight
	}
	if total == 0 { // every slot filled and a storm paused all but two: the next settle waits for them
		h.logf("event %d: none: every slot is filled and only %d members run", n, len(running))
		return
	}
	pick := h.rng.IntN(total)
	kind := choices[0].kind
	for _, c := range choices {
		if pick < c.weight {
			kind = c.kind
			break
		}
		pick -= c.weight
	}
	h.kinds[kind]++
	how := ""
	if storm {
		how = " (storm: the group was not waited for)"
	}
	if kind == "join" {
		slot := empty[h.rng.IntN(len(empty))]
		h.mark(fmt.Sprintf("m%d.%d", slot, h.incarnations[slot]+1))
		m := h.join(slot)
		h.logf("event %d: join %s (weight %d)%s", n, m.name, m.weight, how)
		return
	}
	m := h.slots[running[h.rng.IntN(len(running))]]
	switch kind {
	case "pause":
		pause := 5*partChaosTTL/4 + time.Duration(h.rng.Int64N(int64(3*partChaosTTL/4)))
		anywhere := h.rng.IntN(3) == 0 // else retry until it stops outside a write transaction
		var d *partDeath
		for attempt := 1; ; attempt++ {
			at, held := h.holdings(m.name)
			h.mark(m.name)
			hostAt := time.Now()
			if err := m.proc.Signal(syscall.SIGSTOP); err != nil {
				t.Fatal(err)
			}
			inTx := h.stoppedInTx(m)
			if !inTx || anywhere || attempt == 20 {
				d = h.died("pause", m, at, held, hostAt)
				d.inTx = inTx
				d.expires = h.expiries(m.name)
				where := "at rest"
				if inTx {
					where = "inside a write transaction"
				}
				h.logf("event %d: pause %s for %v, holding %d partitions; stopped %s (attempt %d)%s",
					n, m.name, pause.Round(time.Millisecond), len(held), where, attempt, how)
				break
			}
			if err := m.proc.Signal(syscall.SIGCONT); err != nil {
				t.Fatal(err)
			}
			time.Sleep(time.Duration(h.jitter.Int64N(int64(50 * time.Millisecond))))
		}
		m.paused = true
		cont := make(chan struct{})
		m.cont = cont
		time.AfterFunc(pause, func() {
			_ = m.proc.Signal(syscall.SIGCONT)
			h.mark(m.name)
			h.mu.Lock()
			d.returned = time.Now()
			h.mu.Unlock()
			close(cont)
		})
	case "kill":
		at, held := h.holdings(m.name)
		h.mark(m.name)
		hostAt := time.Now()
		if err := m.proc.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		if err := m.proc.Wait(pgtest.WaitLimit); err == nil {
			t.Fatalf("member %s exited cleanly after SIGKILL", m.name)
		}
		h.stoppedInTx(m) // wait for its statements under way to end
		h.died("kill", m, at, held, hostAt).expires = h.expiries(m.name)
		h.slots[m.slot] = nil
		h.logf("event %d: kill %s, holding %d partitions%s", n, m.name, len(held), how)
	case "leave":
		at, held := h.holdings(m.name)
		h.mark(m.name)
		hostAt := time.Now()
		if err := m.proc.Send("leave"); err != nil {
			t.Fatal(err)
		}
		h.died("leave", m, at, held, hostAt)
		h.await(m, "left")
		if err := m.proc.Wait(pgtest.WaitLimit); err != nil {
			t.Fatalf("member %s after leaving: %v", m.name, err)
		}
		h.slots[m.slot] = nil
		h.logf("event %d: %s leaves, holding %d partitions%s", n, m.name, len(held), how)
	}
}

// stoppedInTx reports whether the stopped member m was caught inside a transaction (one
// of its connections is idle in one). It first waits for its statements under way to
// finish, and looks several times: a statement sent just before the stop may still sit
// unread in the server's socket. A statement that runs on for WaitLimit (blocked behind
// another stopped member) counts as inside a transaction.
func (h *partChaos) stoppedInTx(m *partProc) bool {
	deadline := time.Now().Add(pgtest.WaitLimit)
	for quiet := 0; quiet < 5; {
		if time.Now().After(deadline) {
			return true
		}
		var active, inTx int
		if err := h.pool.QueryRow(h.t.Context(), `SELECT count(*) FILTER (WHERE state = 'active'),
		       count(*) FILTER (WHERE state LIKE 'idle in transaction%')
		  FROM pg_stat_activity WHERE application_name = $1`, workerproc.AppName(m.name)).Scan(&active, &inTx); err != nil {
			h.t.Fatal(err)
		}
		switch {
		case inTx > 0:
			return true
		case active > 0:
			quiet = 0
		default:
			quiet++
		}
		time.Sleep(10 * time.Millisecond)
	}
	return false
}

// settle waits for the pauses under way to end, then until the group settled: the live
// members are the running processes, and every partition is held by its planned member
// and was written under its grant.
func (h *partChaos) settle() {
	t := h.t
	t.Helper()
	var running []string
	for _, m := range h.slots {
		if m == nil {
			continue
		}
		if m.paused {
			select {
			case <-m.cont:
			case <-time.After(2*partChaosTTL + pgtest.WaitLimit):
				t.Fatalf("the pause of %s did not end", m.name)
			}
			m.paused = false
		}
		running = append(running, m.name)
	}
	slices.Sort(running)
	defer h.explainFailure()
	// A busy machine (CPU hogs, -race) slows the grants down, which is no failure: it
	// fails when neither a grant was made nor more partitions settled for WaitLimit, as
	// a stall would, and at most settleLimit after it began (partitions that keep moving
	// without settling).
	what := fmt.Sprintf("the group settles on %v: each partition held by its planned member and written under its grant", running)
	began := time.Now()
	best := -1
	pgtest.UntilProgress(t, what, func() (bool, int64) {
		var live []string
		var settled int
		var grants int64
		if err := h.pool.QueryRow(t.Context(), `
			SELECT (SELECT coalesce(array_agg(member ORDER BY member), '{}') FROM pgcoord_partition_members
			         WHERE group_name = $1 AND expires_at > clock_timestamp()),
			       (SELECT count(*) FROM pgcoord_partitions p
			         WHERE p.group_name = $1 AND p.holder = p.target AND p.expires_at > clock_timestamp() AND p.holder = ANY ($2)
			           AND EXISTS (SELECT FROM part_ledger l WHERE l.part = p.partition AND l.token = p.fence_token)),
			       (SELECT coalesce(sum(grants), 0) FROM pgcoord_partitions WHERE group_name = $1)`,
			partChaosGroup, running).Scan(&live, &settled, &grants); err != nil {
			t.Fatal(err)
		}
		if time.Since(began) > settleLimit {
			t.Fatalf("not within %v, though grants were still made: %s", settleLimit, what)
		}
		best = max(best, settled)
		return slices.Equal(live, running) && settled == partChaosPartitions, grants*(partChaosPartitions+1) + int64(best)
	})
}

// settleLimit bounds a settle that keeps making progress.
const settleLimit = 8 * pgtest.WaitLimit

// explainFailure, deferred by a wait that may fail, logs what the group looks like when t
// failed: what each member process last wrote to stderr, the partitions not settled, the
// members, and the database's sessions with what blocks them.
func (h *partChaos) explainFailure() {
	t := h.t
	if !t.Failed() {
		return
	}
	for _, m := range h.slots {
		if m != nil {
			logStderrTail(t, m.proc)
		}
	}
	logRows(t, h.pool, "partitions not settled (partition, target, holder, token, expires in, last write's token, its age)", `
		SELECT p.partition, p.target, p.holder, p.fence_token, (p.expires_at - clock_timestamp())::text,
		       l.token, (clock_timestamp() - l.at)::text
		  FROM pgcoord_partitions p
		  LEFT JOIN LATERAL (SELECT token, at FROM part_ledger x WHERE x.part = p.partition ORDER BY id DESC LIMIT 1) l ON true
		 WHERE p.group_name = $1 AND NOT (p.holder IS NOT DISTINCT FROM p.target AND p.expires_at > clock_timestamp()
		                                  AND l.token IS NOT DISTINCT FROM p.fence_token)
		 ORDER BY p.partition`, partChaosGroup)
	logMembers(t, h.pool, partChaosGroup)
	logSessions(t, h.pool)
}

// finish ends the schedule: every slot filled and the group settled, it checks the
// balance and that each process's view agrees with the database, then kills every
// process so that the ledger is final.
func (h *partChaos) finish() {
	t := h.t
	for slot, m := range h.slots {
		if m == nil {
			h.join(slot)
		}
	}
	h.settle()
	h.logf("quiet: every slot filled and the group settled")

	type hold struct {
		holder string
		token  int64
	}
	holds := func() map[int]hold {
		rows, err := h.pool.Query(t.Context(), `SELECT partition, holder, fence_token FROM pgcoord_partitions
			WHERE group_name = $1 AND expires_at > clock_timestamp()`, partChaosGroup)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		out := map[int]hold{}
		for rows.Next() {
			var p int
			var x hold
			if err := rows.Scan(&p, &x.holder, &x.token); err != nil {
				t.Fatal(err)
			}
			out[p] = x
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		return out
	}
	before := holds()
	views := map[int][]hold{} // partition → the processes that say they own it
	for _, m := range h.slots {
		if err := m.proc.Send("owned"); err != nil {
			t.Fatal(err)
		}
		for _, f := range strings.Fields(h.await(m, "owned"))[1:] {
			id, tok, _ := strings.Cut(f, ":")
			p, err1 := strconv.Atoi(id)
			token, err2 := strconv.ParseInt(tok, 10, 64)
			if err1 != nil || err2 != nil {
				t.Fatalf("member %s: malformed owned partition %q", m.name, f)
			}
			views[p] = append(views[p], hold{m.name, token})
		}
	}
	if after := holds(); !maps.Equal(before, after) {
		t.Errorf("the grants changed while the group was quiet: %v, then %v", before, after)
	}
	count, weights := map[string]int{}, 0
	for _, m := range h.slots {
		weights += m.weight
	}
	for p := range partChaosPartitions {
		x, ok := before[p]
		if !ok {
			t.Errorf("partition %d has no live grant once quiet", p)
			continue
		}
		count[x.holder]++
		if v := views[p]; len(v) != 1 || v[0] != x {
			t.Errorf("partition %d is held by %s with token %d in the database, and owned by %v by the processes' account", p, x.holder, x.token, v)
		}
	}
	var shares []string
	for _, m := range h.slots {
		share := float64(partChaosPartitions*m.weight) / float64(weights)
		shares = append(shares, fmt.Sprintf("%s (weight %d): %d of %.2f", m.name, m.weight, count[m.name], share))
		if math.Abs(float64(count[m.name])-share) >= 1 {
			t.Errorf("%s (weight %d of %d) holds %d partitions once quiet, not within one of its share %.2f", m.name, m.weight, weights, count[m.name], share)
		}
	}
	h.logf("balance once quiet: %s", strings.Join(shares, ", "))

	for _, m := range h.slots {
		_ = m.proc.Signal(syscall.SIGKILL)
		_ = m.proc.Wait(pgtest.WaitLimit)
	}
}

// partRow is a ledger write (grant false) or a grant, in id order.
type partRow struct {
	id     int64
	grant  bool
	part   int
	token  int64
	member string
	late   bool
	guard  string
	at     time.Time
}

// partSpread describes durations.
func partSpread(ds []time.Duration) string {
	slices.Sort(ds)
	r := func(d time.Duration) time.Duration { return d.Round(time.Millisecond) }
	return fmt.Sprintf("min %v, p50 %v, p99 %v, max %v", r(ds[0]), r(percentile(ds, 0.5)), r(percentile(ds, 0.99)), r(ds[len(ds)-1]))
}

// check checks the whole history (see TestPartitionChaos) and reports the takeovers.
func (h *partChaos) check() {
	t := h.t
	rows, err := h.pool.Query(t.Context(), `
		SELECT id, false, part, token, member, late, guard, at FROM part_ledger
		UNION ALL
		SELECT id, true, part, token, holder, false, '', acquired_at FROM part_grants
		ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	var history []partRow
	for rows.Next() {
		var r partRow
		if err := rows.Scan(&r.id, &r.grant, &r.part, &r.token, &r.member, &r.late, &r.guard, &r.at); err != nil {
			t.Fatal(err)
		}
		history = append(history, r)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}

	var violations []string
	violate := func(format string, args ...any) { violations = append(violations, fmt.Sprintf(format, args...)) }
	lastGrant := map[int]partRow{}
	lastWrite := map[int]partRow{}
	writes := map[int][]partRow{} // by partition, in id order
	grants := map[int][]partRow{} // by partition, in id order
	var nWrites, nGrants, late int
	guards := map[string]int{}
	for _, r := range history {
		if r.grant {
			nGrants++
			if g, ok := lastGrant[r.part]; ok && r.token <= g.token {
				violate("partition %d: grant %d (token %d to %s) after grant %d with token %d: tokens must increase", r.part, r.id, r.token, r.member, g.id, g.token)
			}
			lastGrant[r.part] = r
			grants[r.part] = append(grants[r.part], r)
			continue
		}
		nWrites++
		guards[r.guard]++
		if r.late {
			late++
		}
		writes[r.part] = append(writes[r.part], r)
		if w, ok := lastWrite[r.part]; ok && r.token < w.token {
			violate("partition %d: write %d by %s with token %d accepted after write %d by %s with token %d: tokens decreased",
				r.part, r.id, r.member, r.token, w.id, w.member, w.token)
		}
		lastWrite[r.part] = r
		g, ok := lastGrant[r.part]
		switch {
		case !ok:
			violate("partition %d: write %d by %s with token %d accepted before any grant", r.part, r.id, r.member, r.token)
		case r.token < g.token:
			violate("partition %d: write %d by %s with token %d (%s, late %t) accepted after grant %d of token %d to %s: an older token after a newer grant",
				r.part, r.id, r.member, r.token, r.guard, r.late, g.id, g.token, g.member)
		case r.token != g.token || r.member != g.member:
			violate("partition %d: write %d by %s with token %d accepted, but the newest grant before it is %d of token %d to %s",
				r.part, r.id, r.member, r.token, g.id, g.token, g.member)
		}
	}
	for i, v := range violations {
		if i == 20 {
			t.Errorf("... and %d more violations", len(violations)-i)
			break
		}
		t.Error(v)
	}

	// Takeovers: from a death to the first write of each of its partitions under a newer grant.
	h.mu.Lock()
	marks := slices.Clone(h.marks)
	returned := map[*partDeath]time.Time{}
	for _, d := range h.deaths {
		returned[d] = d.returned
	}
	h.mu.Unlock()
	// overlaps says whether an event of another member happened between d and a takeover
	// took after it (host clock: d.hostAt is d.at, near enough).
	overlaps := func(d *partDeath, took time.Duration) bool {
		for _, e := range marks {
			if e.member != d.member && e.at.After(d.hostAt) && e.at.Sub(d.hostAt) <= took {
				return true
			}
		}
		return false
	}
	takeovers := map[string][]time.Duration{}
	afterExpiry := map[string][]time.Duration{} // from the dead grant's expiry to the next owner's first write
	var asserted int
	var worst time.Duration
	for _, d := range h.deaths {
		for p, tok := range d.held {
			i := slices.IndexFunc(writes[p], func(w partRow) bool { return w.token > tok })
			if i < 0 {
				t.Errorf("partition %d, held by %s with token %d at its %s, was never written under a newer grant", p, d.member, tok, d.kind)
				continue
			}
			w := writes[p][i]
			took := w.at.Sub(d.at)
			kind := d.kind
			switch {
			case d.inTx:
				kind += " (inside a transaction)"
			case d.overlapped || overlaps(d, took):
				kind += " (overlapped)"
			case !returned[d].IsZero() && returned[d].Sub(d.hostAt) < took:
				kind += " (after its return)"
			}
			takeovers[kind] = append(takeovers[kind], took)
			if exp, ok := d.expires[p]; ok {
				afterExpiry[kind] = append(afterExpiry[kind], w.at.Sub(exp))
			}
			// The partition's grants from the death to the takeover, to explain a slow one.
			var meanwhile []string
			for _, g := range grants[p] {
				if g.token > tok && !g.at.After(w.at) {
					meanwhile = append(meanwhile, fmt.Sprintf("token %d to %s at +%v", g.token, g.member, g.at.Sub(d.at).Round(time.Millisecond)))
				}
			}
			if kind != d.kind {
				if took > partChaosBound {
					t.Logf("partition %d, held by %s at its %s, taken over %v later (not asserted: %s); grants meanwhile: %v",
						p, d.member, kind, took, strings.TrimPrefix(kind, d.kind+" "), meanwhile)
				}
				continue
			}
			asserted++
			worst = max(worst, took)
			if took > partChaosBound {
				t.Errorf("partition %d, held by %s with token %d at its %s (%s, database clock), was written under a newer grant (token %d, by %s) %v later: more than 2 TTL (TTL %v); grants meanwhile: %v",
					p, d.member, tok, d.kind, d.at.Format(time.StampMicro), w.token, w.member, took, partChaosTTL, meanwhile)
			}
		}
	}
	for _, kind := range slices.Sorted(maps.Keys(takeovers)) {
		ds := takeovers[kind]
		slices.Sort(ds)
		t.Logf("takeover after %s: %d partitions, %s", kind, len(ds), partSpread(ds))
		if ds := afterExpiry[kind]; len(ds) > 0 {
			t.Logf("    of which from the dead grant's expiry: %s", partSpread(ds))
		}
	}
	t.Logf("takeover bound 2 TTL = %v, asserted for %d partitions of deaths alone at rest: worst %v", partChaosBound, asserted, worst.Round(time.Millisecond))

	h.mu.Lock()
	defer h.mu.Unlock()
	t.Logf("events %v; %d grants; %d writes accepted (by guard %v; %d of them late), refused %v (%d of them late); %d failed otherwise",
		h.kinds, nGrants, nWrites, guards, late, h.refused, h.refusedLate, len(h.failed))
	for i, f := range h.failed {
		if i == 5 {
			break
		}
		t.Logf("failed write: %s", f)
	}
	for _, e := range h.workerErrors {
		t.Errorf("member %s", e)
	}
}
