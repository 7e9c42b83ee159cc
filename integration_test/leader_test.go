//go:build unix

package integration_test

import (
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pgcoord/pgcoord/internal/pgtest"
)

// Leader election with real processes. Three worker processes campaign for one lease with
// leases.Elector (TTL 3s); the leader writes to leader_writes every 20ms, fenced by its
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
	// leaderTTL leaves a grant room for a slow round trip: with 1s, a loaded machine (-race
	// beside CPU hogs) has seen a first leader lose its trust deadline before its first write.
	leaderTTL   = 3 * time.Second
	leaderPoll  = 200 * time.Millisecond
	leaderEvery = 20 * time.Millisecond
	// leaderStep bounds every single wait of the scenario.
	leaderStep = 2 * pgtest.WaitLimit
)

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
