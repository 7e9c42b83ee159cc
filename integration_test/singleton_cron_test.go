//go:build unix

package integration_test

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/internal/workerproc"
	"github.com/pgcoord/pgcoord/singleton"
)

// The "three weekly emails" incident of the mission, with real processes: three replicas
// of an app run the same weekly-report job with singleton.Schedule (here a "week" lasts
// cronEvery), each started at its own moment. Each run sends the report to cronUsers
// users, one email per user, recorded in email_sends(user_id, campaign_id) UNIQUE with
// INSERT ... ON CONFLICT DO NOTHING — the idempotent unit of work — where the campaign is
// the tick. One replica is killed (SIGKILL) in the middle of a tick, after half its
// emails: another replica takes the tick over once the run's lease (cronTTL) expires and
// sends the other half.

const (
	cronRole  = "cron.weekly"
	cronEvery = 2400 * time.Millisecond
	// cronTTL is the lease of a running tick: with the claim delay, the time the victim
	// takes to send half its emails and be killed, and the takeover's own work, it must
	// fit in the slot, since a tick is taken over only during its slot. It must also
	// outlast the stalls of a loaded machine (the workers run under -race beside other
	// tests, and in CI beside two CPU-bound processes): a live runner whose heartbeats are
	// late by more than 2/3 of it is taken over like a dead one. With a 1.2 s slot and a
	// 0.8 s lease the takeover had about 0.1 s to claim, and a loaded machine missed it.
	cronTTL   = 1200 * time.Millisecond
	cronUsers = 20
	// cronStep bounds every single wait: a line from a worker, an exit.
	cronStep = 20 * time.Second
	// cronMaxMissed is how many ticks of the window may run nowhere. Schedule claims each
	// tick during its slot only, so a machine loaded enough to stall every replica (and the
	// database) for a whole slot loses that tick — a failure `pgcoord jobs check` reports,
	// not one a lock can prevent. The test still fails for a tick run twice, a partial run,
	// a stalled tick not taken over, or more misses than a loaded machine explains.
	cronMaxMissed = 2
)

func init() { workerRoles[cronRole] = cronWorker }

const cronSchema = `
CREATE TABLE email_sends (
	user_id     int         NOT NULL,
	campaign_id bigint      NOT NULL, -- the tick, in Unix microseconds
	worker      text        NOT NULL,
	token       bigint      NOT NULL,
	sent_at     timestamptz NOT NULL DEFAULT clock_timestamp(),
	UNIQUE (user_id, campaign_id)
);`

// cronWorker is one replica. Parameters: JOB, NAME, START_AFTER (its start offset),
// STALL_AT (a tick, Unix microseconds: the first attempt of that tick stops after half its
// emails, says "stalled <tick> <token>" and waits to be killed). It says "started", then
// "ran <tick> <token> <attempt>" after each run, and stops on "stop".
func cronWorker(ctx context.Context, w *workerproc.Worker) error {
	startAfter, err := time.ParseDuration(w.Param("START_AFTER"))
	if err != nil {
		return err
	}
	stallAt, err := strconv.ParseInt(w.Param("STALL_AT"), 10, 64)
	if err != nil {
		return err
	}
	name := w.Param("NAME")
	time.Sleep(startAfter) // this replica's deploy happens to be a little later
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		_ = w.Await("stop") // or stdin closed: stop either way
		cancel()
	}()
	w.Say("started")
	job := singleton.Job{Name: w.Param("JOB"), Every: cronEvery, TTL: cronTTL}
	err = singleton.Schedule(sctx, w.Pool, job, func(ctx context.Context, run singleton.Run) error {
		campaign := run.ScheduledFor.UnixMicro()
		stall := campaign == stallAt && run.Attempt == 1
		n := cronUsers
		if stall {
			n = cronUsers / 2
		}
		for user := 1; user <= n; user++ {
			// The dedupe layer: whoever runs the tick, each user gets one email.
			if _, err := w.Pool.Exec(ctx, `INSERT INTO email_sends (user_id, campaign_id, worker, token)
				VALUES ($1, $2, $3, $4) ON CONFLICT (user_id, campaign_id) DO NOTHING`, user, campaign, name, run.Token); err != nil {
				return err
			}
		}
		if stall {
			w.Say("stalled %d %d", campaign, run.Token)
			<-ctx.Done() // the test kills this process first
			return ctx.Err()
		}
		w.Say("ran %d %d %d", campaign, run.Token, run.Attempt)
		return nil
	}, &singleton.ScheduleOpts{Holder: name, Logger: slog.New(slog.NewTextHandler(os.Stderr, nil))})
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

// workerLine is a line a worker said.
type workerLine struct {
	worker *workerproc.Proc
	line   string
	closed bool // the worker's output ended (it exited)
}

// mergeLines forwards the lines of every worker to one channel.
func mergeLines(workers []*workerproc.Proc) <-chan workerLine {
	out := make(chan workerLine, 64)
	for _, w := range workers {
		go func() {
			for line := range w.Lines() {
				out <- workerLine{worker: w, line: line}
			}
			out <- workerLine{worker: w, closed: true}
		}()
	}
	return out
}

// dbSlot returns the database clock and the start of its current slot of cronEvery.
func dbSlot(ctx context.Context, pool *pgxpool.Pool) (now, slot time.Time, err error) {
	err = pool.QueryRow(ctx, `SELECT now(), date_bin($1 * interval '1 microsecond', now(), 'epoch')`,
		cronEvery.Microseconds()).Scan(&now, &slot)
	return now, slot, err
}

func TestCronThreeReplicasSendEachWeeklyEmailOnce(t *testing.T) {
	t.Parallel()
	ticks := 15
	if testing.Short() {
		ticks = 8
	}
	pool, schema := workerDB(t, cronSchema)
	ctx := t.Context()
	const job = "weekly-report"
	_, slot, err := dbSlot(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	// The tick whose first runner is killed: a few ticks into the window.
	stallAt := slot.Add(6 * cronEvery)

	var workers []*workerproc.Proc
	for i, name := range []string{"pod-a", "pod-b", "pod-c"} {
		w, err := startWorker(t, name, cronRole, pgtest.URL(t), schema, map[string]string{
			"JOB": job, "NAME": name, "START_AFTER": (time.Duration(i) * 70 * time.Millisecond).String(),
			"STALL_AT": strconv.FormatInt(stallAt.UnixMicro(), 10),
		})
		if err != nil {
			t.Fatal(err)
		}
		workers = append(workers, w)
	}
	for _, w := range workers {
		if _, err := w.Expect(cronStep, "started"); err != nil {
			t.Fatal(err)
		}
	}
	// The window: from the first boundary after every replica started.
	_, slot, err = dbSlot(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	first := slot.Add(cronEvery)
	last := first.Add(time.Duration(ticks-1) * cronEvery)
	if !stallAt.After(first) {
		t.Fatalf("the replicas took too long to start: the first tick of the window %v is after the stalled tick %v", first, stallAt)
	}

	var (
		victim      *workerproc.Proc
		victimToken int64
		killedAt    time.Time // database clock
		ran         = map[int64][]string{}
		lines       = mergeLines(workers)
		deadline    = time.After(last.Sub(slot) + 2*cronStep)
	)
	// missed lists the ticks of the window no replica ran (yet).
	missed := func() []time.Time {
		var m []time.Time
		for tick := first; !tick.After(last); tick = tick.Add(cronEvery) {
			if len(ran[tick.UnixMicro()]) == 0 {
				m = append(m, tick)
			}
		}
		return m
	}
	// done: the stalled tick was taken over, and every tick ran or its slot is over.
	done := func() bool {
		if victim == nil || len(ran[stallAt.UnixMicro()]) == 0 {
			return false
		}
		if len(missed()) == 0 {
			return true
		}
		now, _, err := dbSlot(ctx, pool)
		return err == nil && !now.Before(last.Add(2*cronEvery))
	}
	for !done() {
		var l workerLine
		select {
		case l = <-lines:
		case <-time.After(cronEvery):
			continue // look at the clock again
		case <-deadline:
			t.Fatalf("the window's ticks did not all run in time; ran: %v", ran)
		}
		f := strings.Fields(l.line)
		switch {
		case l.closed && l.worker == victim:
		case l.closed:
			t.Fatalf("worker %s exited (%v); stderr: %s", l.worker.Name(), l.worker.Wait(5*time.Second), l.worker.Stderr())
		case len(f) == 4 && f[0] == "ran":
			ran[mustInt(t, f[1])] = append(ran[mustInt(t, f[1])], l.worker.Name()+"/attempt "+f[3])
		case len(f) == 3 && f[0] == "stalled":
			if victim != nil || mustInt(t, f[1]) != stallAt.UnixMicro() {
				t.Fatalf("%s said %q; want one stall, of tick %v", l.worker.Name(), l.line, stallAt)
			}
			victim, victimToken = l.worker, mustInt(t, f[2])
			// The victim is alive and heartbeating until now: no takeover can come earlier.
			if killedAt, _, err = dbSlot(ctx, pool); err != nil {
				t.Fatal(err)
			}
			if err := victim.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			var exit *exec.ExitError
			if err := victim.Wait(cronStep); !errors.As(err, &exit) || exit.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
				t.Fatalf("worker %s: exit %v, want killed by SIGKILL", victim.Name(), err)
			}
		default:
			t.Fatalf("worker %s said %q; stderr: %s", l.worker.Name(), l.line, l.worker.Stderr())
		}
	}
	for _, w := range workers {
		if w != victim {
			if err := w.Send("stop"); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, w := range workers {
		if w != victim {
			if err := w.Wait(cronStep); err != nil {
				t.Fatalf("worker %s: %v; stderr: %s", w.Name(), err, w.Stderr())
			}
		}
	}

	// Every tick of the window ran exactly once and succeeded, at its first attempt —
	// except the stalled one, taken over (attempt 2, a higher token) by another replica
	// after the kill.
	rows, err := pool.Query(ctx, `SELECT scheduled_for, state, attempt, holder, fence_token, started_at
		FROM pgcoord_job_runs WHERE job = $1 AND scheduled_for BETWEEN $2 AND $3 ORDER BY scheduled_for`, job, first, last)
	if err != nil {
		t.Fatal(err)
	}
	type runRow struct {
		tick, started time.Time
		state, holder string
		attempt       int
		token         int64
	}
	var ledger []runRow
	for rows.Next() {
		var r runRow
		if err := rows.Scan(&r.tick, &r.state, &r.attempt, &r.holder, &r.token, &r.started); err != nil {
			t.Fatal(err)
		}
		ledger = append(ledger, r)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	missing := missed()
	if len(missing) > cronMaxMissed {
		t.Fatalf("%d ticks of the window ran nowhere (%v), more than a loaded machine explains (%d)", len(missing), missing, cronMaxMissed)
	}
	if len(missing) > 0 {
		t.Logf("ticks that ran nowhere, every replica being stalled past their slot: %v", missing)
	}
	if len(ledger) != ticks-len(missing) {
		t.Fatalf("%d ticks in the ledger for the window, want %d: %+v", len(ledger), ticks-len(missing), ledger)
	}
	perWorker := map[string]int{}
	var takeover runRow
	for i, r := range ledger {
		perWorker[r.holder]++
		if r.tick.Before(first) || r.tick.After(last) || r.tick.Sub(first)%cronEvery != 0 || r.state != "succeeded" {
			t.Errorf("ledger row %d: tick %v %s; want a tick of the window, succeeded", i, r.tick, r.state)
		}
		switch {
		case r.tick.Equal(stallAt):
			takeover = r
			if r.attempt != 2 {
				t.Errorf("the stalled tick %v: attempt %d by %s, want 2 (the takeover)", r.tick, r.attempt, r.holder)
			}
		case r.attempt != 1:
			// A runner starved past its trust deadline (a loaded machine) gives its tick up
			// and another replica runs it again; the effect is still once (checked below).
			t.Logf("tick %v: attempt %d by %s (started %v after the boundary): a runner was starved",
				r.tick, r.attempt, r.holder, r.started.Sub(r.tick))
		}
		if got := ran[r.tick.UnixMicro()]; len(got) != 1 {
			t.Errorf("tick %v: completed runs %v, want exactly one", r.tick, got)
		}
	}
	if takeover.holder == victim.Name() || takeover.token <= victimToken || !takeover.started.After(killedAt) {
		t.Errorf("the stalled tick was finished by %s with token %d, started %v; want another replica, a token above the killed one's %d, after the kill (%v)",
			takeover.holder, takeover.token, takeover.started, victimToken, killedAt)
	}

	// Each user got each campaign's email exactly once (the UNIQUE constraint allows at
	// most one row; every user has one); the stalled tick's emails came half from the
	// killed replica, half from the one that took over.
	skip := make([]int64, 0, len(missing))
	for _, m := range missing {
		skip = append(skip, m.UnixMicro())
	}
	var campaigns, emails, unsent int
	err = pool.QueryRow(ctx, `SELECT count(DISTINCT campaign_id), count(*),
			(SELECT count(*) FROM generate_series($1::bigint, $2::bigint, $3::bigint) c, generate_series(1, $4) u
			  WHERE c <> ALL ($5::bigint[])
			    AND NOT EXISTS (SELECT 1 FROM email_sends e WHERE e.campaign_id = c AND e.user_id = u))
		FROM email_sends WHERE campaign_id BETWEEN $1 AND $2`,
		first.UnixMicro(), last.UnixMicro(), cronEvery.Microseconds(), cronUsers, skip).Scan(&campaigns, &emails, &unsent)
	if err != nil {
		t.Fatal(err)
	}
	if want := ticks - len(missing); campaigns != want || emails != want*cronUsers || unsent != 0 {
		t.Errorf("%d campaigns, %d emails, %d (user, campaign) pairs of a tick that ran without an email; want %d, %d, 0",
			campaigns, emails, unsent, want, want*cronUsers)
	}
	var byVictim, byTakeover int
	err = pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE worker = $2 AND token = $3), count(*) FILTER (WHERE worker = $4 AND token = $5)
		FROM email_sends WHERE campaign_id = $1`, stallAt.UnixMicro(), victim.Name(), victimToken, takeover.holder, takeover.token).
		Scan(&byVictim, &byTakeover)
	if err != nil {
		t.Fatal(err)
	}
	if byVictim != cronUsers/2 || byTakeover != cronUsers-cronUsers/2 {
		t.Errorf("stalled tick: %d emails by the killed %s, %d by %s; want %d and %d",
			byVictim, victim.Name(), byTakeover, takeover.holder, cronUsers/2, cronUsers-cronUsers/2)
	}
	t.Logf("%d ticks; runs per replica %v; %s killed at tick %v, taken over by %s after %v",
		ticks, perWorker, victim.Name(), stallAt, takeover.holder, takeover.started.Sub(killedAt))
}

func mustInt(t *testing.T, s string) int64 {
	t.Helper()
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		t.Fatalf("not a number: %q", s)
	}
	return n
}
