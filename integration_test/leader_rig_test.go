//go:build unix

package integration_test

import (
	"context"
	"errors"
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

// The rig of TestLeaderElectionWithRealProcesses (leader_test.go): the test's view of the
// leader workers' lines, the committed writes, pausing a leader outside a write, and the
// lease as the database showed it.

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
	pool, schema := workerDB(t, leaderSchema)
	r := &leaderRig{
		t: t, pool: pool, url: pgtest.URL(t), schema: schema, workers: map[string]*workerproc.Proc{},
		events: make(chan leaderEvent, 4096), grants: map[int64]leaderGrant{}, said: map[string][]string{},
	}
	return r
}

// leaderProc is the process name of the leader worker called name: unique among the
// package's workers, so its connections can be told apart in pg_stat_activity.
func leaderProc(name string) string { return "leader " + name }

// start starts a leader worker and forwards its lines to r.events.
func (r *leaderRig) start(name string) {
	r.t.Helper()
	p, err := startWorker(r.t, leaderProc(name), leaderRole, r.url, r.schema, map[string]string{
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
			r.t.Fatalf("fewer than %d writes with token %d within %v; the workers' connections: %s; said so far: %v",
				n, token, leaderStep, r.sessions(), r.said)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// sessions describes the workers' connections, for a failure's message.
func (r *leaderRig) sessions() string {
	r.t.Helper()
	var s string
	if err := r.pool.QueryRow(r.t.Context(), `SELECT coalesce(string_agg(format('%s: %s (%s)', application_name, state, left(query, 60)), '; '), 'none')
		  FROM pg_stat_activity WHERE application_name LIKE $1`, workerproc.AppName(leaderProc("%"))).Scan(&s); err != nil {
		return err.Error()
	}
	return s
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
		if r.atRest(g.worker) {
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

// atRest reports whether the stopped worker's connections hold nothing another writer
// needs: none has a transaction open and the fence register's row is free. It first waits
// for the worker's statements under way to finish, and looks several times: a statement
// the worker sent just before it stopped may still sit unread in the server's socket.
func (r *leaderRig) atRest(worker string) bool {
	r.t.Helper()
	deadline := time.Now().Add(leaderStep)
	for quiet := 0; quiet < 5; {
		if time.Now().After(deadline) {
			r.t.Fatalf("the stopped worker %s still runs a statement after %v", worker, leaderStep)
		}
		var active, inTx int
		if err := r.pool.QueryRow(r.t.Context(), `SELECT count(*) FILTER (WHERE state = 'active'),
		       count(*) FILTER (WHERE state LIKE 'idle in transaction%')
		  FROM pg_stat_activity WHERE application_name = $1`, workerproc.AppName(leaderProc(worker))).Scan(&active, &inTx); err != nil {
			r.t.Fatal(err)
		}
		switch {
		case inTx > 0:
			return false
		case active > 0:
			quiet = 0
		default:
			quiet++
		}
		time.Sleep(10 * time.Millisecond)
	}
	return !r.fenceLocked()
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
