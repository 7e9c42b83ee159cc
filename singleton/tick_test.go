package singleton_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/pgcoord"
	"github.com/pgcoord/pgcoord/singleton"
)

// t0 is a slot boundary of an hourly job, far from the real clock: the tests walk through
// time by moving the schema's clock (pgtest.Clock) and never sleep.
var t0 = time.Date(2031, 3, 3, 10, 0, 0, 0, time.UTC)

// at is slot k of an hourly job plus off.
func at(k int, off time.Duration) time.Time { return t0.Add(time.Duration(k)*time.Hour + off) }

func hourly(name string) singleton.Job {
	return singleton.Job{Name: name, Every: time.Hour, TTL: 30 * time.Second}
}

// ledger is a fresh schema with pgcoord migrated, and its clock.
type ledger struct {
	t     *testing.T
	pool  *pgxpool.Pool
	clock *pgtest.Clock
}

// newLedger returns a fresh ledger whose clock stands still at t0.
func newLedger(t *testing.T, maxConns int32) *ledger {
	t.Helper()
	pool, _ := migrated(t, maxConns)
	l := &ledger{t: t, pool: pool, clock: pgtest.NewClock(t, pool)}
	l.clock.Freeze(t0)
	return l
}

// claimAt claims job's tick for holder with the database clock stopped at now.
func (l *ledger) claimAt(job singleton.Job, holder string, now time.Time) (singleton.Run, error) {
	l.t.Helper()
	l.clock.Freeze(now)
	return singleton.ClaimTick(l.t.Context(), l.pool, job, &singleton.ClaimOpts{Holder: holder})
}

func (l *ledger) mustClaim(job singleton.Job, holder string, now time.Time) singleton.Run {
	l.t.Helper()
	run, err := l.claimAt(job, holder, now)
	if err != nil {
		l.t.Fatalf("claim of %s at %v by %s: %v", job.Name, now, holder, err)
	}
	return run
}

func (l *ledger) noTick(job singleton.Job, holder string, now time.Time) {
	l.t.Helper()
	if run, err := l.claimAt(job, holder, now); !errors.Is(err, singleton.ErrNoTick) {
		l.t.Fatalf("claim of %s at %v by %s = %+v, %v; want ErrNoTick", job.Name, now, holder, run, err)
	}
}

// statusAt is job's status with the database clock stopped at now.
func (l *ledger) statusAt(job string, now time.Time) singleton.JobStatus {
	l.t.Helper()
	l.clock.Freeze(now)
	return status(l.t, l.pool, job)
}

// tokensDrawn is the schema's token counter: how many fence tokens were issued.
func (l *ledger) tokensDrawn() int64 {
	l.t.Helper()
	var n int64
	if err := l.pool.QueryRow(l.t.Context(), `SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM pgcoord_token_seq`).Scan(&n); err != nil {
		l.t.Fatal(err)
	}
	return n
}

func runs(t *testing.T, db *pgxpool.Pool, job string) []singleton.RunInfo {
	t.Helper()
	rs, err := singleton.ListRuns(t.Context(), db, job, &singleton.ListRunsOpts{Limit: singleton.MaxListLimit})
	if err != nil {
		t.Fatal(err)
	}
	return rs
}

func status(t *testing.T, db *pgxpool.Pool, job string) singleton.JobStatus {
	t.Helper()
	all, err := singleton.ListJobs(t.Context(), db, &singleton.ListJobsOpts{Limit: singleton.MaxListLimit})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range all {
		if s.Name == job {
			return s
		}
	}
	t.Fatalf("job %s not listed", job)
	panic("unreachable")
}

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

// FinishTick's outcomes feed the job's status: failures count until a success, the last
// error is kept, and Overdue follows.
func TestFinishTickUpdatesTheStatus(t *testing.T) {
	t.Parallel()
	l := newLedger(t, 0)
	ctx := t.Context()
	job := singleton.Job{Name: "mailer", Every: time.Hour}
	first := l.mustClaim(job, "a", at(0, time.Minute))
	ugly := "smtp down\x00\xff" + strings.Repeat("é", singleton.MaxErrorLen)
	if err := singleton.FinishTick(ctx, l.pool, first, errors.New(ugly)); err != nil {
		t.Fatal(err)
	}
	s := status(t, l.pool, "mailer")
	if s.ConsecutiveFailures != 1 || !strings.HasPrefix(s.LastError, "smtp down\uFFFDé") || len(s.LastError) > singleton.MaxErrorLen ||
		s.LastState != "failed" || !s.LastFailureAt.Equal(at(0, time.Minute)) || !s.LastSuccessAt.IsZero() || s.Running != 0 || s.Token != first.Token {
		t.Fatalf("after a failure: %+v", s)
	}
	if !s.Overdue(24 * time.Hour) {
		t.Fatalf("a job whose last run failed is not overdue: %+v", s)
	}
	if !s.FirstTick.Equal(first.ScheduledFor) || s.MissedTicks != 0 || !s.NextTick.Equal(first.ScheduledFor.Add(time.Hour)) {
		t.Fatalf("first tick %v, missed %d, next %v; want %v, 0, an hour later", s.FirstTick, s.MissedTicks, s.NextTick, first.ScheduledFor)
	}

	// The next slot's run, an hour on, succeeds.
	l.clock.Advance(time.Hour)
	second, err := singleton.ClaimTick(ctx, l.pool, job, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := singleton.FinishTick(ctx, l.pool, second, nil); err != nil {
		t.Fatal(err)
	}
	s = status(t, l.pool, "mailer")
	if s.ConsecutiveFailures != 0 || !s.LastSuccessAt.Equal(at(1, time.Minute)) || s.LastState != "succeeded" || !strings.HasPrefix(s.LastError, "smtp down") {
		t.Fatalf("after a success: %+v", s)
	}
	if s.Overdue(0) {
		t.Fatalf("a job that just succeeded is overdue: %+v", s)
	}
	// Three hours on with no success it is overdue, and three ticks were missed (slots 2
	// and 3, and the current slot 4, which nobody claimed yet).
	l.clock.Advance(3 * time.Hour)
	s = status(t, l.pool, "mailer")
	if !s.Overdue(time.Minute) || s.Overdue(3*time.Hour) {
		t.Fatalf("three hours after the last success: Overdue(1m) %v, Overdue(3h) %v; want true, false", s.Overdue(time.Minute), s.Overdue(3*time.Hour))
	}
	if s.MissedTicks != 3 || !s.DBNow.Equal(at(4, time.Minute)) {
		t.Fatalf("missed %d ticks at %v, want 3 at %v", s.MissedTicks, s.DBNow, at(4, time.Minute))
	}
}

// MissedTicks counts the slots from the first tick through the current one with no row;
// NextTick is the next boundary.
func TestJobStatusMissedTicks(t *testing.T) {
	t.Parallel()
	l := newLedger(t, 0)
	job := hourly("gappy")
	for _, k := range []int{0, 1, 3} {
		l.mustClaim(job, "a", at(k, time.Minute))
	}
	s := l.statusAt("gappy", at(4, 10*time.Minute))
	if s.MissedTicks != 2 || !s.FirstTick.Equal(t0) || !s.NextTick.Equal(at(5, 0)) || !s.DBNow.Equal(at(4, 10*time.Minute)) {
		t.Fatalf("status %+v; want 2 missed (slots 2 and the unclaimed current 4), first %v, next %v", s, t0, at(5, 0))
	}
	last := l.mustClaim(job, "a", at(4, 11*time.Minute))
	s = l.statusAt("gappy", at(4, 11*time.Minute+10*time.Second))
	if s.MissedTicks != 1 || s.LastState != "running" || s.Running != 1 {
		t.Fatalf("status %+v; want 1 missed (slot 2), slot 4 running", s)
	}
	if s = l.statusAt("gappy", at(4, 12*time.Minute)); s.Every != time.Hour || !s.Origin.Equal(time.Unix(0, 0)) || s.Token != last.Token {
		t.Fatalf("schedule %v %v token %d; want 1h, the epoch, token %d", s.Every, s.Origin, s.Token, last.Token)
	}
}

func TestJobStatusOverdue(t *testing.T) {
	t.Parallel()
	now := t0
	cases := []struct {
		name  string
		s     singleton.JobStatus
		stale time.Duration
		want  bool
	}{
		{"fresh success", singleton.JobStatus{Every: time.Hour, LastSuccessAt: now.Add(-30 * time.Minute), DBNow: now}, 0, false},
		{"late success", singleton.JobStatus{Every: time.Hour, LastSuccessAt: now.Add(-61 * time.Minute), DBNow: now}, 0, true},
		{"late within staleness", singleton.JobStatus{Every: time.Hour, LastSuccessAt: now.Add(-61 * time.Minute), DBNow: now}, 5 * time.Minute, false},
		{"last run failed", singleton.JobStatus{Every: time.Hour, LastSuccessAt: now.Add(-time.Minute), ConsecutiveFailures: 1, DBNow: now}, time.Hour, true},
		{"never succeeded, young", singleton.JobStatus{Every: time.Hour, FirstTick: now.Add(-10 * time.Minute), DBNow: now}, 0, false},
		{"never succeeded, old", singleton.JobStatus{Every: time.Hour, FirstTick: now.Add(-2 * time.Hour), DBNow: now}, 30 * time.Minute, true},
		{"no tick at all", singleton.JobStatus{Every: time.Hour, DBNow: now}, time.Hour, true},
	}
	for _, c := range cases {
		if got := c.s.Overdue(c.stale); got != c.want {
			t.Errorf("%s: Overdue(%v) = %v, want %v", c.name, c.stale, got, c.want)
		}
	}
}

func TestListJobsAndRunsPage(t *testing.T) {
	t.Parallel()
	l := newLedger(t, 0)
	pool, ctx := l.pool, t.Context()
	jobs, err := singleton.ListJobs(ctx, pool, nil)
	if err != nil || jobs == nil || len(jobs) != 0 {
		t.Fatalf("ListJobs on an empty ledger = %v, %v; want an empty, non-nil slice", jobs, err)
	}
	if rs, err := singleton.ListRuns(ctx, pool, "nothing", nil); err != nil || rs == nil || len(rs) != 0 {
		t.Fatalf("ListRuns of an unknown job = %v, %v; want an empty, non-nil slice", rs, err)
	}
	for _, name := range []string{"c", "a", "b"} {
		for k := range 5 {
			l.mustClaim(hourly(name), "x", at(k, time.Minute))
		}
	}
	page, err := singleton.ListJobs(ctx, pool, &singleton.ListJobsOpts{Limit: 2})
	if err != nil || len(page) != 2 || page[0].Name != "a" || page[1].Name != "b" {
		t.Fatalf("first page %+v, %v", page, err)
	}
	page, err = singleton.ListJobs(ctx, pool, &singleton.ListJobsOpts{After: "b", Limit: 2})
	if err != nil || len(page) != 1 || page[0].Name != "c" {
		t.Fatalf("second page %+v, %v", page, err)
	}
	rs, err := singleton.ListRuns(ctx, pool, "b", &singleton.ListRunsOpts{Limit: 2})
	if err != nil || len(rs) != 2 || !rs[0].ScheduledFor.Equal(at(4, 0)) || !rs[1].ScheduledFor.Equal(at(3, 0)) {
		t.Fatalf("newest runs %+v, %v", rs, err)
	}
	rs, err = singleton.ListRuns(ctx, pool, "b", &singleton.ListRunsOpts{Before: rs[1].ScheduledFor})
	if err != nil || len(rs) != 3 || !rs[0].ScheduledFor.Equal(at(2, 0)) || !rs[2].ScheduledFor.Equal(at(0, 0)) {
		t.Fatalf("older runs %+v, %v", rs, err)
	}
	for _, limit := range []int{-1, singleton.MaxListLimit + 1} {
		if _, err := singleton.ListJobs(ctx, pool, &singleton.ListJobsOpts{Limit: limit}); !errors.Is(err, pgcoord.ErrInvalidArgument) {
			t.Errorf("ListJobs limit %d: %v", limit, err)
		}
		if _, err := singleton.ListRuns(ctx, pool, "b", &singleton.ListRunsOpts{Limit: limit}); !errors.Is(err, pgcoord.ErrInvalidArgument) {
			t.Errorf("ListRuns limit %d: %v", limit, err)
		}
	}
}

// Bad jobs and arguments are refused before any SQL runs: a nil handle proves it.
func TestTickValidation(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	good := singleton.Job{Name: "ok", Every: time.Minute}
	cases := []struct {
		job  singleton.Job
		opts *singleton.ClaimOpts
		want error
	}{
		{singleton.Job{Every: time.Minute}, nil, pgcoord.ErrInvalidName},
		{singleton.Job{Name: strings.Repeat("j", pgcoord.MaxNameLen+1), Every: time.Minute}, nil, pgcoord.ErrInvalidName},
		{singleton.Job{Name: "j"}, nil, pgcoord.ErrInvalidArgument},
		{singleton.Job{Name: "j", Every: -time.Second}, nil, pgcoord.ErrInvalidArgument},
		{singleton.Job{Name: "j", Every: singleton.MaxEvery + time.Hour}, nil, pgcoord.ErrInvalidArgument},
		{singleton.Job{Name: "j", Every: 1500 * time.Nanosecond}, nil, pgcoord.ErrInvalidArgument},
		{singleton.Job{Name: "j", Every: time.Minute, TTL: -time.Second}, nil, pgcoord.ErrInvalidArgument},
		{singleton.Job{Name: "j", Every: time.Minute, TTL: 25 * time.Hour}, nil, pgcoord.ErrInvalidArgument},
		{singleton.Job{Name: "j", Every: time.Minute, Overlap: "sometimes"}, nil, pgcoord.ErrInvalidArgument},
		{good, &singleton.ClaimOpts{Holder: "nul\x00"}, pgcoord.ErrInvalidName},
		{good, nil, pgcoord.ErrInvalidArgument}, // valid: the nil handle is refused
	}
	for _, c := range cases {
		if _, err := singleton.ClaimTick(ctx, nil, c.job, c.opts); !errors.Is(err, c.want) {
			t.Errorf("ClaimTick(%+v, %+v) = %v, want %v", c.job, c.opts, err, c.want)
		}
	}
	// A grant must be durable: lower synchronous_commit levels are refused, before the
	// handle is looked at.
	bad := singleton.Job{Name: "j", Every: time.Minute, SyncCommit: "off"}
	if _, err := singleton.ClaimTick(ctx, nil, bad, nil); !errors.Is(err, pgcoord.ErrInvalidArgument) || !strings.Contains(err.Error(), "synchronous_commit") {
		t.Errorf("ClaimTick with SyncCommit off: %v, want an invalid-argument error naming synchronous_commit", err)
	}
	run := singleton.Run{Job: "ok", ScheduledFor: t0, Token: 1}
	for _, ttl := range []time.Duration{0, -time.Second, singleton.MaxTTL + time.Second} {
		if _, err := singleton.HeartbeatTick(ctx, nil, run, ttl); !errors.Is(err, pgcoord.ErrInvalidArgument) {
			t.Errorf("HeartbeatTick with TTL %v: %v", ttl, err)
		}
	}
	if _, err := singleton.HeartbeatTick(ctx, nil, run, time.Second); !errors.Is(err, pgcoord.ErrInvalidArgument) || !strings.Contains(err.Error(), "nil") {
		t.Errorf("HeartbeatTick(nil db) of a good run: %v", err)
	}
	// Runs no claim returned: the SQL functions would refuse them (22004, 22023); the Go
	// API says what is wrong before sending anything.
	badRuns := []struct {
		run  singleton.Run
		want error
	}{
		{singleton.Run{}, pgcoord.ErrInvalidName},
		{singleton.Run{Job: strings.Repeat("j", pgcoord.MaxNameLen+1), ScheduledFor: t0, Token: 1}, pgcoord.ErrInvalidName},
		{singleton.Run{Job: "ok", Token: 1}, pgcoord.ErrInvalidArgument},                    // no tick
		{singleton.Run{Job: "ok", ScheduledFor: t0}, pgcoord.ErrInvalidArgument},            // no token
		{singleton.Run{Job: "ok", ScheduledFor: t0, Token: -5}, pgcoord.ErrInvalidArgument}, // negative token
	}
	for _, c := range badRuns {
		if _, err := singleton.HeartbeatTick(ctx, nil, c.run, time.Second); !errors.Is(err, c.want) || strings.Contains(err.Error(), "nil") {
			t.Errorf("HeartbeatTick(%+v) = %v, want %v about the run", c.run, err, c.want)
		}
		if err := singleton.FinishTick(ctx, nil, c.run, nil); !errors.Is(err, c.want) || strings.Contains(err.Error(), "nil") {
			t.Errorf("FinishTick(%+v) = %v, want %v about the run", c.run, err, c.want)
		}
	}
	if _, err := singleton.ListJobs(ctx, nil, nil); !errors.Is(err, pgcoord.ErrInvalidArgument) {
		t.Errorf("ListJobs(nil): %v", err)
	}
	if _, err := singleton.ListRuns(ctx, nil, "", nil); !errors.Is(err, pgcoord.ErrInvalidName) {
		t.Errorf("ListRuns(\"\"): %v", err)
	}
	fn := func(context.Context, singleton.Run) error { return nil }
	if _, err := singleton.RunTick(ctx, nil, good, fn, nil); !errors.Is(err, pgcoord.ErrInvalidArgument) {
		t.Errorf("RunTick(nil pool): %v", err)
	}
	if _, err := singleton.RunTick(ctx, nil, singleton.Job{Name: "j"}, fn, nil); !errors.Is(err, pgcoord.ErrInvalidArgument) {
		t.Errorf("RunTick(no Every): %v", err)
	}
	if err := singleton.Schedule(ctx, nil, good, fn, nil); !errors.Is(err, pgcoord.ErrInvalidArgument) {
		t.Errorf("Schedule(nil pool): %v", err)
	}
	pool := pgtest.Pool(t)
	if _, err := singleton.RunTick(ctx, pool, good, nil, nil); !errors.Is(err, pgcoord.ErrInvalidArgument) {
		t.Errorf("RunTick(nil fn): %v", err)
	}
	if err := singleton.Schedule(ctx, pool, good, fn, &singleton.ScheduleOpts{Delay: time.Minute}); !errors.Is(err, pgcoord.ErrInvalidArgument) {
		t.Errorf("Schedule with Delay = Every: %v", err)
	}
	if err := singleton.Schedule(ctx, pool, good, fn, &singleton.ScheduleOpts{Holder: "\xff"}); !errors.Is(err, pgcoord.ErrInvalidName) {
		t.Errorf("Schedule with a bad holder: %v", err)
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
