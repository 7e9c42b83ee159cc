//go:build unix

package integration_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/internal/workerproc"
	"github.com/pgcoord/pgcoord/leases"
)

// Leader election with real processes. Three worker processes campaign for one lease with
// leases.Elector (TTL 1s); the leader writes to leader_writes every 20ms, fenced by its
// lease's token. The test then:
//
//  1. pauses the leader (SIGSTOP) past its TTL: another process takes over; the paused one
//     is continued (SIGCONT) and its writes — the one its loop makes on waking, and one it
//     is told to make with its old token — are refused by the fence (fenced.ErrStale);
//  2. kills the leader (SIGKILL): another process takes over within TTL + one poll
//     interval of the kill, by the database clock, and not before the dead leader's
//     grant expired;
//  3. shuts the leader down ("quit"): it resigns, and the last process takes over at once,
//     woken by the release's notification rather than by the TTL.
//
// Throughout, the committed history must show one leader at a time: tokens never decrease
// in commit order, each token's writes come from the one process that was elected with it.

const (
	leaderTTL   = time.Second
	leaderPoll  = 200 * time.Millisecond
	leaderEvery = 20 * time.Millisecond
	// leaderStep bounds every single wait of the scenario.
	leaderStep = 20 * time.Second
)

// leaderEvent is a line a leader worker said.
type leaderEvent struct {
	worker string
	line   string
	at     time.Time // when the test received it
}

// leaderGrant is a "leading" line: a process elected with a token.
type leaderGrant struct {
	worker                string
	token                 int64
	acquiredAt, expiresAt time.Time // database clock
	seen                  time.Time // local clock, when the test received the line
}

func parseLeading(ev leaderEvent) (leaderGrant, bool) {
	f := strings.Fields(ev.line)
	if len(f) != 4 || f[0] != "leading" {
		return leaderGrant{}, false
	}
	var n [3]int64
	for i := range n {
		v, err := strconv.ParseInt(f[i+1], 10, 64)
		if err != nil {
			return leaderGrant{}, false
		}
		n[i] = v
	}
	return leaderGrant{worker: ev.worker, token: n[0], acquiredAt: time.UnixMicro(n[1]), expiresAt: time.UnixMicro(n[2]), seen: ev.at}, true
}

// leaderRig is the test's view of the workers: their lines, merged in arrival order.
type leaderRig struct {
	t           *testing.T
	pool        *pgxpool.Pool
	url, schema string
	workers     map[string]*workerproc.Proc
	events      chan leaderEvent
	grants      map[int64]leaderGrant // from the "leading" lines
	said        map[string][]string   // every line, per worker
	backlog     []leaderEvent         // lines no await has returned yet
}

func newLeaderRig(t *testing.T) *leaderRig {
	t.Helper()
	pool := pgtest.Pool(t)
	r := &leaderRig{
		t: t, pool: pool, url: pgtest.URL(t), workers: map[string]*workerproc.Proc{},
		events: make(chan leaderEvent, 4096), grants: map[int64]leaderGrant{}, said: map[string][]string{},
	}
	if err := pool.QueryRow(t.Context(), "SELECT current_schema()").Scan(&r.schema); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(t.Context(), leaderSchema); err != nil {
		t.Fatal(err)
	}
	return r
}

// start starts a leader worker and forwards its lines to r.events.
func (r *leaderRig) start(name string) {
	r.t.Helper()
	p, err := startWorker(r.t, name, leaderRole, r.url, r.schema, map[string]string{
		"NAME": name, "TTL": leaderTTL.String(), "POLL": leaderPoll.String(), "EVERY": leaderEvery.String(),
	})
	if err != nil {
		r.t.Fatal(err)
	}
	r.workers[name] = p
	go func() {
		for line := range p.Lines() {
			r.events <- leaderEvent{worker: name, line: line, at: time.Now()}
		}
	}()
}

// await returns the first line, said since the last await that returned it, for which
// match is true: lines that match nothing stay in a backlog for later awaits. It fails the
// test after d, or if a worker reports an error.
func (r *leaderRig) await(d time.Duration, what string, match func(leaderEvent) bool) leaderEvent {
	r.t.Helper()
	for i, ev := range r.backlog {
		if match(ev) {
			r.backlog = append(r.backlog[:i:i], r.backlog[i+1:]...)
			return ev
		}
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	for {
		select {
		case ev := <-r.events:
			r.said[ev.worker] = append(r.said[ev.worker], ev.line)
			if strings.HasPrefix(ev.line, "error ") {
				r.t.Fatalf("worker %s: %s; stderr: %s", ev.worker, ev.line, r.workers[ev.worker].Stderr())
			}
			if g, ok := parseLeading(ev); ok {
				if prev, dup := r.grants[g.token]; dup {
					r.t.Fatalf("token %d elected twice: %s and %s", g.token, prev.worker, g.worker)
				}
				r.grants[g.token] = g
			}
			if match(ev) {
				return ev
			}
			r.backlog = append(r.backlog, ev)
		case <-timer.C:
			r.t.Fatalf("%s: nothing within %v; said so far: %v", what, d, r.said)
		}
	}
}

// awaitLeader waits for a process other than not (if set) to be elected with a token above
// after, and returns its grant.
func (r *leaderRig) awaitLeader(d time.Duration, what string, after int64, not string) leaderGrant {
	r.t.Helper()
	ev := r.await(d, what, func(ev leaderEvent) bool {
		g, ok := parseLeading(ev)
		return ok && g.token > after && g.worker != not
	})
	g, _ := parseLeading(ev)
	return g
}

// writes returns how many writes with token committed.
func (r *leaderRig) writes(token int64) int {
	r.t.Helper()
	var n int
	if err := r.pool.QueryRow(r.t.Context(), `SELECT count(*) FROM leader_writes WHERE token = $1`, token).Scan(&n); err != nil {
		r.t.Fatal(err)
	}
	return n
}

// awaitWrites waits until at least n writes with token have committed.
func (r *leaderRig) awaitWrites(token int64, n int) {
	r.t.Helper()
	deadline := time.Now().Add(leaderStep)
	for r.writes(token) < n {
		if time.Now().After(deadline) {
			r.t.Fatalf("fewer than %d writes with token %d within %v", n, token, leaderStep)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// fenceLocked reports whether a transaction holds the fence register's row: a write
// between its fence check and its commit.
func (r *leaderRig) fenceLocked() bool {
	r.t.Helper()
	ctx := r.t.Context()
	tx, err := r.pool.Begin(ctx)
	if err != nil {
		r.t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // read-only
	_, err = tx.Exec(ctx, `SELECT 1 FROM pgcoord_fences WHERE resource = $1 FOR UPDATE NOWAIT`, leaderResource)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "55P03" {
		return true
	}
	if err != nil {
		r.t.Fatal(err)
	}
	return false
}

// pause stops the worker with SIGSTOP at a moment when it holds no open write
// transaction (which would hold the fence register's row, and so every other writer, for
// as long as it is stopped): if it does, it is continued and stopped again after its next
// write. It returns when the final SIGSTOP was sent and how many it took.
func (r *leaderRig) pause(g leaderGrant) (time.Time, int) {
	r.t.Helper()
	p := r.workers[g.worker]
	for attempt := 1; ; attempt++ {
		if err := p.Signal(syscall.SIGSTOP); err != nil {
			r.t.Fatal(err)
		}
		at := time.Now()
		if !r.fenceLocked() {
			return at, attempt
		}
		if attempt == 20 {
			r.t.Fatal("the leader was stopped inside a write 20 times in a row")
		}
		n := r.writes(g.token)
		if err := p.Signal(syscall.SIGCONT); err != nil {
			r.t.Fatal(err)
		}
		r.awaitWrites(g.token, n+1)
	}
}

// leaseWatch polls the lease every few milliseconds in the background and records, per
// token, the latest expiry the database showed for that grant.
type leaseWatch struct {
	mu      sync.Mutex
	expires map[int64]time.Time
	stop    context.CancelFunc
	done    chan struct{}
}

func watchLease(ctx context.Context, pool *pgxpool.Pool) *leaseWatch {
	ctx, cancel := context.WithCancel(ctx)
	w := &leaseWatch{expires: map[int64]time.Time{}, stop: cancel, done: make(chan struct{})}
	go func() {
		defer close(w.done)
		tick := time.NewTicker(3 * time.Millisecond)
		defer tick.Stop()
		for {
			info, err := leases.Get(ctx, pool, leaderLease)
			if err == nil && info.Holder != "" {
				w.mu.Lock()
				if info.ExpiresAt.After(w.expires[info.Token]) {
					w.expires[info.Token] = info.ExpiresAt
				}
				w.mu.Unlock()
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	return w
}

// expiry is the latest expiry seen for token's grant.
func (w *leaseWatch) expiry(token int64) time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.expires[token]
}

func (w *leaseWatch) close() {
	w.stop()
	<-w.done
}

func TestLeaderElectionWithRealProcesses(t *testing.T) {
	t.Parallel()
	r := newLeaderRig(t)
	ctx := t.Context()
	watch := watchLease(ctx, r.pool)
	defer watch.close()
	for _, name := range []string{"A", "B", "C"} {
		r.start(name)
	}
	for range 3 {
		r.await(leaderStep, "workers ready", func(ev leaderEvent) bool { return ev.line == "ready" })
	}
	first := r.awaitLeader(leaderStep, "a first leader", 0, "")
	r.awaitWrites(first.token, 5)
	t.Logf("first leader %s with token %d", first.worker, first.token)

	// 1. The pause. The leader is stopped past its TTL; another process takes over.
	stopped, attempts := r.pause(first)
	var stoppedDB time.Time
	if err := r.pool.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&stoppedDB); err != nil {
		t.Fatal(err)
	}
	second := r.awaitLeader(leaderStep, "a leader after SIGSTOP", first.token, first.worker)
	takeover := second.seen.Sub(stopped)
	pausedExpiry := watch.expiry(first.token)
	if second.acquiredAt.Before(pausedExpiry) {
		t.Errorf("%s was elected at %v, before the paused leader's grant expired at %v (database clock)", second.worker, second.acquiredAt, pausedExpiry)
	}
	if d := second.acquiredAt.Sub(stoppedDB); d > leaderTTL+leaderPoll {
		t.Errorf("takeover after SIGSTOP took %v by the database clock, more than TTL + poll interval", d)
	}
	r.awaitWrites(second.token, 5) // the new leader writes, so the fence register holds its token
	if err := r.workers[first.worker].Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	woke := r.await(leaderStep, "the paused leader notices", func(ev leaderEvent) bool {
		return ev.worker == first.worker && (strings.HasPrefix(ev.line, "stale ") || strings.HasPrefix(ev.line, "stopped "))
	})
	t.Logf("SIGSTOP of %s (%d attempt(s) to stop it outside a write): its grant had %v left; %s elected %v after its expiry, %v after the stop (database clock; its line arrived %v after the stop); on waking %s said %q",
		first.worker, attempts, pausedExpiry.Sub(stoppedDB), second.worker, second.acquiredAt.Sub(pausedExpiry),
		second.acquiredAt.Sub(stoppedDB), takeover, first.worker, woke.line)
	if err := r.workers[first.worker].Send("zombie"); err != nil {
		t.Fatal(err)
	}
	zombie := r.await(leaderStep, "the woken leader's write with its old token", func(ev leaderEvent) bool {
		return ev.worker == first.worker && strings.HasPrefix(ev.line, "zombie ")
	})
	if want := fmt.Sprintf("zombie stale %d", first.token); zombie.line != want {
		t.Errorf("the woken leader's write with token %d: %q, want %q (fenced.ErrStale)", first.token, zombie.line, want)
	}

	// 2. The crash. The current leader is killed; another takes over when its grant
	// expires, within TTL + one poll interval of the kill.
	r.awaitWrites(second.token, 10)
	if err := r.workers[second.worker].Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	var killedDB time.Time
	if err := r.pool.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&killedDB); err != nil {
		t.Fatal(err)
	}
	if err := r.workers[second.worker].Wait(leaderStep); err == nil {
		t.Fatalf("worker %s exited cleanly after SIGKILL", second.worker)
	}
	third := r.awaitLeader(leaderStep, "a leader after SIGKILL", second.token, second.worker)
	failoverDB := third.acquiredAt.Sub(killedDB)
	if exp := watch.expiry(second.token); third.acquiredAt.Before(exp) {
		t.Errorf("%s was elected at %v, before the killed leader's grant expired at %v (database clock)", third.worker, third.acquiredAt, exp)
	} else {
		t.Logf("SIGKILL of %s: %s elected %v after the dead grant expired (database clock)", second.worker, third.worker, third.acquiredAt.Sub(exp))
	}
	if failoverDB > leaderTTL+leaderPoll {
		t.Errorf("failover after SIGKILL took %v by the database clock, more than TTL + poll interval (%v)", failoverDB, leaderTTL+leaderPoll)
	}
	t.Logf("SIGKILL of %s: %s elected %v after the kill (database clock), its line arrived %v after the kill",
		second.worker, third.worker, failoverDB, third.seen.Sub(killed))
	r.awaitWrites(third.token, 5)

	// 3. The shutdown. The leader resigns; the last process takes over at once.
	if err := r.workers[third.worker].Send("quit"); err != nil {
		t.Fatal(err)
	}
	quit := time.Now()
	fourth := r.awaitLeader(leaderStep, "a leader after the resignation", third.token, third.worker)
	handoff := fourth.seen.Sub(quit)
	if handoff >= leaderTTL {
		t.Errorf("handoff after resignation took %v, not less than the TTL %v: the release did not wake the candidate", handoff, leaderTTL)
	}
	if exp := watch.expiry(third.token); !fourth.acquiredAt.Before(exp) {
		t.Logf("note: the resigned grant would have expired at %v, the new one was granted at %v", exp, fourth.acquiredAt)
	}
	t.Logf("resignation of %s: %s elected %v after \"quit\" was sent", third.worker, fourth.worker, handoff)
	r.await(leaderStep, "the resigned leader says bye", func(ev leaderEvent) bool { return ev.worker == third.worker && ev.line == "bye" })
	if err := r.workers[third.worker].Wait(leaderStep); err != nil {
		t.Fatalf("worker %s: %v", third.worker, err)
	}
	r.awaitWrites(fourth.token, 5)
	if err := r.workers[fourth.worker].Send("quit"); err != nil {
		t.Fatal(err)
	}
	r.await(leaderStep, "the last leader says bye", func(ev leaderEvent) bool { return ev.worker == fourth.worker && ev.line == "bye" })
	if err := r.workers[fourth.worker].Wait(leaderStep); err != nil {
		t.Fatalf("worker %s: %v", fourth.worker, err)
	}
	watch.close()

	checkLeaderHistory(t, r)
}

// checkLeaderHistory asserts, over every committed write in commit order, that there was
// one leader at a time: tokens never decrease, and each token's writes come from the one
// process elected with it.
func checkLeaderHistory(t *testing.T, r *leaderRig) {
	t.Helper()
	rows, err := r.pool.Query(t.Context(), `SELECT id, worker, token FROM leader_writes ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var (
		last    int64
		total   int
		byToken = map[int64]int{}
	)
	for rows.Next() {
		var (
			id     int64
			worker string
			token  int64
		)
		if err := rows.Scan(&id, &worker, &token); err != nil {
			t.Fatal(err)
		}
		total++
		byToken[token]++
		if token < last {
			t.Errorf("write %d by %s with token %d committed after a write with token %d", id, worker, token, last)
		}
		last = max(last, token)
		g, ok := r.grants[token]
		switch {
		case !ok:
			t.Errorf("write %d by %s with token %d, which no process said it was elected with", id, worker, token)
		case g.worker != worker:
			t.Errorf("write %d with token %d by %s, but %s was elected with it", id, token, worker, g.worker)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d fenced writes committed; per token: %v", total, byToken)
}
