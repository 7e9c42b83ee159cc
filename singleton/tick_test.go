package singleton_test

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pgcoord/pgcoord/singleton"
)

// Each slot is claimed once: a second claim in the same slot gets ErrNoTick, whether the
// run is still running or done; every new slot's run gets a higher token.
func TestClaimTickOncePerSlot(t *testing.T) {
	t.Parallel()
	l := newLedger(t, 0)
	job := hourly("report")
	run := l.mustClaim(job, "a", at(0, time.Minute))
	want := singleton.Run{Job: "report", ScheduledFor: t0, Token: run.Token, Attempt: 1, Holder: "a",
		StartedAt: at(0, time.Minute), ExpiresAt: at(0, time.Minute+30*time.Second)}
	if !sameRun(run, want) || run.Token < 1 {
		t.Fatalf("claim = %+v, want %+v with a positive token", run, want)
	}
	l.noTick(job, "b", at(0, time.Minute+20*time.Second)) // running
	if err := singleton.FinishTick(t.Context(), l.pool, run, nil); err != nil {
		t.Fatal(err)
	}
	l.noTick(job, "b", at(0, 59*time.Minute)) // done
	last := run.Token
	for _, k := range []int{1, 2, 5} {
		r := l.mustClaim(job, "b", at(k, time.Duration(k)*time.Second))
		if !r.ScheduledFor.Equal(at(k, 0)) || r.Token <= last || r.Attempt != 1 {
			t.Fatalf("slot %d: claimed %+v; want tick %v, a token above %d, attempt 1", k, r, at(k, 0), last)
		}
		last = r.Token
		l.noTick(job, "a", at(k, time.Duration(k)*time.Second+10*time.Second)) // running
	}
	if n := len(runs(t, l.pool, "report")); n != 4 {
		t.Fatalf("%d ledger rows, want 4 (slots 0, 1, 2, 5)", n)
	}
}

func sameRun(a, b singleton.Run) bool {
	return a.Job == b.Job && a.ScheduledFor.Equal(b.ScheduledFor) && a.Token == b.Token && a.Attempt == b.Attempt &&
		a.Holder == b.Holder && a.StartedAt.Equal(b.StartedAt) && a.ExpiresAt.Equal(b.ExpiresAt)
}

// Many replicas claiming the same tick at once: exactly one gets the run.
func TestClaimTickConcurrentClaimersGetOneRun(t *testing.T) {
	t.Parallel()
	const replicas = 16
	l := newLedger(t, replicas)
	job := hourly("contended")
	var last int64
	for k := range 5 {
		l.clock.Freeze(at(k, time.Millisecond))
		var (
			mu  sync.Mutex
			won []singleton.Run
			wg  sync.WaitGroup
		)
		start := make(chan struct{})
		errs := make(chan error, replicas)
		for i := range replicas {
			wg.Go(func() {
				<-start
				run, err := singleton.ClaimTick(t.Context(), l.pool, job, &singleton.ClaimOpts{Holder: fmt.Sprintf("replica-%d", i)})
				switch {
				case err == nil:
					mu.Lock()
					won = append(won, run)
					mu.Unlock()
				case !errors.Is(err, singleton.ErrNoTick):
					errs <- err
				}
			})
		}
		close(start)
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		if len(won) != 1 || won[0].Token <= last || !won[0].ScheduledFor.Equal(at(k, 0)) {
			t.Fatalf("slot %d: %d replicas got the run (%+v); want exactly one, with a token above %d", k, len(won), won, last)
		}
		last = won[0].Token
	}
}

// A running tick whose runner stopped heartbeating is taken over after its lease expires,
// as attempt 2 with a higher token; the old runner's heartbeat and finish are refused.
func TestClaimTickTakesOverAnExpiredRun(t *testing.T) {
	t.Parallel()
	l := newLedger(t, 0)
	ctx := t.Context()
	job := hourly("takeover")
	first := l.mustClaim(job, "a", at(0, time.Minute))
	l.noTick(job, "b", at(0, time.Minute+29*time.Second)) // the lease is live
	second := l.mustClaim(job, "b", at(0, time.Minute+30*time.Second))
	if !second.ScheduledFor.Equal(first.ScheduledFor) || second.Attempt != 2 || second.Token <= first.Token || second.Holder != "b" {
		t.Fatalf("takeover = %+v after %+v; want the same tick, attempt 2, a higher token, holder b", second, first)
	}
	if _, err := singleton.HeartbeatTick(ctx, l.pool, first, time.Minute); !errors.Is(err, singleton.ErrLost) {
		t.Fatalf("the old runner's heartbeat: %v, want ErrLost", err)
	}
	if err := singleton.FinishTick(ctx, l.pool, first, nil); !errors.Is(err, singleton.ErrLost) {
		t.Fatalf("the old runner's finish: %v, want ErrLost", err)
	}
	rs := runs(t, l.pool, "takeover")
	if len(rs) != 1 || rs[0].State != "running" || rs[0].Holder != "b" || rs[0].Token != second.Token || rs[0].Attempt != 2 {
		t.Fatalf("ledger %+v; want one running row, b's", rs)
	}
	if err := singleton.FinishTick(ctx, l.pool, second, nil); err != nil {
		t.Fatal(err)
	}
	if err := singleton.FinishTick(ctx, l.pool, second, nil); !errors.Is(err, singleton.ErrLost) {
		t.Fatalf("a second finish: %v, want ErrLost", err)
	}
	if _, err := singleton.HeartbeatTick(ctx, l.pool, second, time.Minute); !errors.Is(err, singleton.ErrLost) {
		t.Fatalf("a heartbeat after finish: %v, want ErrLost", err)
	}
	if rs := runs(t, l.pool, "takeover"); rs[0].State != "succeeded" || rs[0].FinishedAt.IsZero() {
		t.Fatalf("ledger %+v; want the tick succeeded", rs)
	}
	l.noTick(job, "c", at(0, 50*time.Minute))
}

// A heartbeat extends the lease from the database clock and keeps the tick from being
// taken over; a heartbeat after the lease expired is refused.
func TestHeartbeatTickExtendsTheLease(t *testing.T) {
	t.Parallel()
	l := newLedger(t, 0)
	ctx := t.Context()
	job := singleton.Job{Name: "beating", Every: time.Hour, TTL: time.Second}
	run := l.mustClaim(job, "a", at(0, time.Minute))
	l.clock.Advance(500 * time.Millisecond)
	next, err := singleton.HeartbeatTick(ctx, l.pool, run, 10*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if next.Token != run.Token || !next.ExpiresAt.Equal(at(0, time.Minute+500*time.Millisecond+10*time.Minute)) {
		t.Fatalf("heartbeat = %+v after %+v; want the same run, expiring 10m from the heartbeat", next, run)
	}
	// Two seconds on, the first lease would have expired; the heartbeat's has not.
	l.noTick(job, "b", at(0, time.Minute+2*time.Second))
	// Past the heartbeat's lease, the run is lost even before anybody takes it over.
	l.clock.Freeze(next.ExpiresAt)
	if _, err := singleton.HeartbeatTick(ctx, l.pool, next, 10*time.Minute); !errors.Is(err, singleton.ErrLost) {
		t.Fatalf("a heartbeat at the lease's expiry: %v, want ErrLost", err)
	}
}

// OverlapForbid: a tick that comes while an earlier run is running is skipped for good.
func TestOverlapForbidSkips(t *testing.T) {
	t.Parallel()
	l := newLedger(t, 0)
	job := singleton.Job{Name: "forbid", Every: time.Hour, TTL: 2 * time.Hour} // zero Overlap: forbid
	long := l.mustClaim(job, "a", at(0, time.Minute))
	drawn := l.tokensDrawn()
	l.noTick(job, "b", at(1, time.Minute))
	if n := l.tokensDrawn(); n != drawn {
		t.Fatalf("the skip drew %d fence tokens; a skip takes none", n-drawn)
	}
	rs := runs(t, l.pool, "forbid")
	if len(rs) != 2 || rs[0].State != "skipped" || !rs[0].ScheduledFor.Equal(at(1, 0)) || rs[0].Error == "" ||
		rs[1].State != "running" || rs[1].Token != long.Token {
		t.Fatalf("ledger %+v; want slot 1 skipped, slot 0 still running", rs)
	}
	if err := singleton.FinishTick(t.Context(), l.pool, long, nil); err != nil {
		t.Fatal(err)
	}
	l.noTick(job, "b", at(1, 30*time.Minute)) // a skipped tick stays skipped
	next := l.mustClaim(job, "b", at(2, time.Minute))
	if next.Token <= long.Token {
		t.Fatalf("the next run's token %d, want one above %d", next.Token, long.Token)
	}
	if s := l.statusAt("forbid", at(2, 2*time.Minute)); s.Overlap != singleton.OverlapForbid || s.LastState != "running" {
		t.Fatalf("status %+v", s)
	}
}

// OverlapReplace: the new tick runs and the earlier run is marked replaced; its heartbeat
// and finish are refused.
func TestOverlapReplace(t *testing.T) {
	t.Parallel()
	l := newLedger(t, 0)
	ctx := t.Context()
	job := singleton.Job{Name: "replace", Every: time.Hour, TTL: 2 * time.Hour, Overlap: singleton.OverlapReplace}
	old := l.mustClaim(job, "a", at(0, time.Minute))
	replacement := l.mustClaim(job, "b", at(1, time.Minute))
	if replacement.Token <= old.Token || !replacement.ScheduledFor.Equal(at(1, 0)) {
		t.Fatalf("replacement %+v after %+v", replacement, old)
	}
	rs := runs(t, l.pool, "replace")
	if len(rs) != 2 || rs[0].State != "running" || rs[1].State != "replaced" || !strings.Contains(rs[1].Error, "replaced") || rs[1].FinishedAt.IsZero() {
		t.Fatalf("ledger %+v; want slot 1 running, slot 0 replaced", rs)
	}
	if _, err := singleton.HeartbeatTick(ctx, l.pool, old, time.Minute); !errors.Is(err, singleton.ErrLost) {
		t.Fatalf("the replaced run's heartbeat: %v, want ErrLost", err)
	}
	if err := singleton.FinishTick(ctx, l.pool, old, nil); !errors.Is(err, singleton.ErrLost) {
		t.Fatalf("the replaced run's finish: %v, want ErrLost", err)
	}
	if err := singleton.FinishTick(ctx, l.pool, replacement, nil); err != nil {
		t.Fatal(err)
	}
}

// OverlapAllow: runs of successive ticks run side by side.
func TestOverlapAllow(t *testing.T) {
	t.Parallel()
	l := newLedger(t, 0)
	job := singleton.Job{Name: "allow", Every: time.Hour, TTL: 2 * time.Hour, Overlap: singleton.OverlapAllow}
	a := l.mustClaim(job, "a", at(0, time.Minute))
	b := l.mustClaim(job, "b", at(1, time.Minute))
	if s := l.statusAt("allow", at(1, 2*time.Minute)); s.Running != 2 || s.Overlap != singleton.OverlapAllow {
		t.Fatalf("status %+v; want 2 running", s)
	}
	for _, r := range []singleton.Run{a, b} {
		if err := singleton.FinishTick(t.Context(), l.pool, r, nil); err != nil {
			t.Fatal(err)
		}
	}
	if s := l.statusAt("allow", at(1, 3*time.Minute)); s.Running != 0 || s.LastState != "succeeded" {
		t.Fatalf("status %+v; want none running", s)
	}
}

// A run whose runner died late in its slot can no longer be taken over (claims only cover
// the current slot): the next claim records it as failed, so the job's status alerts.
func TestClaimRecordsAnAbandonedEarlierRunAsFailed(t *testing.T) {
	t.Parallel()
	l := newLedger(t, 0)
	pool := l.pool
	job := hourly("abandoned")
	dead := l.mustClaim(job, "dies-late", at(0, 59*time.Minute+50*time.Second))
	next := l.mustClaim(job, "next", at(1, time.Minute))
	if next.Token <= dead.Token {
		t.Fatalf("next run's token %d <= %d", next.Token, dead.Token)
	}
	rs := runs(t, pool, "abandoned")
	if len(rs) != 2 || rs[1].State != "failed" || !strings.Contains(rs[1].Error, "abandoned") {
		t.Fatalf("ledger after the next claim: %+v; want the dead run failed as abandoned", rs)
	}
	if st := l.statusAt("abandoned", at(1, 2*time.Minute)); st.ConsecutiveFailures != 1 || !st.LastFailureAt.Equal(at(1, time.Minute)) {
		t.Fatalf("status after an abandoned run: %+v", st)
	}
	if err := singleton.FinishTick(t.Context(), pool, dead, nil); !errors.Is(err, singleton.ErrLost) {
		t.Fatalf("the dead runner's late finish: %v, want ErrLost", err)
	}
}

// Every replica claims at every tick and all but one lose: a losing claim decides from
// reads, so it assigns no transaction id (no WAL, no commit to wait for).
func TestLosingClaimWritesNothing(t *testing.T) {
	t.Parallel()
	l := newLedger(t, 0)
	job := hourly("quiet-losers")
	l.mustClaim(job, "winner", at(0, time.Second))
	l.clock.Freeze(at(0, 2*time.Second))
	tx, err := l.pool.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(t.Context())
	_, err = singleton.ClaimTick(t.Context(), tx, job, &singleton.ClaimOpts{Holder: "loser"})
	if !errors.Is(err, singleton.ErrNoTick) {
		t.Fatalf("losing claim: %v", err)
	}
	var xid *int64
	if err := tx.QueryRow(t.Context(), `SELECT txid_current_if_assigned()`).Scan(&xid); err != nil {
		t.Fatal(err)
	}
	if xid != nil {
		t.Fatalf("a losing claim assigned transaction id %d: it wrote", *xid)
	}
}

// pgcoord_job_finish keeps a plain SQL caller's error text to its first 8192 bytes, cut at
// a character boundary (FinishTick cuts it in Go first): a multibyte text of 8192
// characters is not kept whole.
func TestJobFinishSQLKeepsTheErrorTo8192Bytes(t *testing.T) {
	t.Parallel()
	l := newLedger(t, 0)
	for _, c := range []struct {
		name, text string
		want       int // bytes kept
	}{
		{"ascii", strings.Repeat("a", 10000), 8192},
		{"two-byte", strings.Repeat("é", 6000), 8192},
		{"four-byte", "ab" + strings.Repeat("😀", 5000), 8190}, // 2 + 2047*4: a cut never splits a character
		{"short", "disk full", 9},
	} {
		job := hourly("sql-finish-" + c.name)
		run := l.mustClaim(job, "a", at(0, time.Minute))
		var kept string
		err := l.pool.QueryRow(t.Context(), `SELECT error FROM pgcoord_job_finish($1, $2, $3, $4)`,
			run.Job, run.ScheduledFor, run.Token, c.text).Scan(&kept)
		if err != nil {
			t.Fatal(err)
		}
		if len(kept) != c.want || !strings.HasPrefix(c.text, kept) {
			t.Errorf("%s: kept %d bytes (a prefix: %v), want the first %d", c.name, len(kept), strings.HasPrefix(c.text, kept), c.want)
		}
		if s := status(t, l.pool, job.Name); s.LastError != kept {
			t.Errorf("%s: the job's last error is %d bytes, the run's %d", c.name, len(s.LastError), len(kept))
		}
	}
}
