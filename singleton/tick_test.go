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
// time by injecting the claims' clock (ClaimOpts.Now) and never sleep.
var t0 = time.Date(2031, 3, 3, 10, 0, 0, 0, time.UTC)

// at is slot k of an hourly job plus off.
func at(k int, off time.Duration) time.Time { return t0.Add(time.Duration(k)*time.Hour + off) }

func hourly(name string) singleton.Job {
	return singleton.Job{Name: name, Every: time.Hour, TTL: 30 * time.Second}
}

func claimAt(t *testing.T, db *pgxpool.Pool, job singleton.Job, holder string, now time.Time) (singleton.Run, error) {
	t.Helper()
	return singleton.ClaimTick(t.Context(), db, job, &singleton.ClaimOpts{Holder: holder, Now: now})
}

func mustClaim(t *testing.T, db *pgxpool.Pool, job singleton.Job, holder string, now time.Time) singleton.Run {
	t.Helper()
	run, err := claimAt(t, db, job, holder, now)
	if err != nil {
		t.Fatalf("claim of %s at %v by %s: %v", job.Name, now, holder, err)
	}
	return run
}

func noTick(t *testing.T, db *pgxpool.Pool, job singleton.Job, holder string, now time.Time) {
	t.Helper()
	if run, err := claimAt(t, db, job, holder, now); !errors.Is(err, singleton.ErrNoTick) {
		t.Fatalf("claim of %s at %v by %s = %+v, %v; want ErrNoTick", job.Name, now, holder, run, err)
	}
}

func runs(t *testing.T, db *pgxpool.Pool, job string) []singleton.RunInfo {
	t.Helper()
	rs, err := singleton.ListRuns(t.Context(), db, job, &singleton.ListRunsOpts{Limit: singleton.MaxListLimit})
	if err != nil {
		t.Fatal(err)
	}
	return rs
}

func status(t *testing.T, db *pgxpool.Pool, job string, now time.Time) singleton.JobStatus {
	t.Helper()
	all, err := singleton.ListJobs(t.Context(), db, &singleton.ListJobsOpts{Now: now, Limit: singleton.MaxListLimit})
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
	pool := pgtest.Pool(t)
	job := hourly("report")
	run := mustClaim(t, pool, job, "a", at(0, time.Minute))
	want := singleton.Run{Job: "report", ScheduledFor: t0, Token: 1, Attempt: 1, Holder: "a",
		StartedAt: at(0, time.Minute), ExpiresAt: at(0, time.Minute+30*time.Second)}
	if !sameRun(run, want) {
		t.Fatalf("claim = %+v, want %+v", run, want)
	}
	noTick(t, pool, job, "b", at(0, time.Minute+20*time.Second)) // running
	if err := singleton.FinishTick(t.Context(), pool, run, nil); err != nil {
		t.Fatal(err)
	}
	noTick(t, pool, job, "b", at(0, 59*time.Minute)) // done
	var last int64 = 1
	for _, k := range []int{1, 2, 5} {
		r := mustClaim(t, pool, job, "b", at(k, time.Duration(k)*time.Second))
		if !r.ScheduledFor.Equal(at(k, 0)) || r.Token <= last || r.Attempt != 1 {
			t.Fatalf("slot %d: claimed %+v; want tick %v, a token above %d, attempt 1", k, r, at(k, 0), last)
		}
		last = r.Token
		noTick(t, pool, job, "a", at(k, time.Duration(k)*time.Second+10*time.Second)) // running
	}
	if n := len(runs(t, pool, "report")); n != 4 {
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
	pool, _ := migrated(t, replicas)
	job := hourly("contended")
	for k := range 5 {
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
				run, err := singleton.ClaimTick(t.Context(), pool, job, &singleton.ClaimOpts{
					Holder: fmt.Sprintf("replica-%d", i), Now: at(k, time.Duration(i)*time.Millisecond)})
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
		if len(won) != 1 || won[0].Token != int64(k+1) || !won[0].ScheduledFor.Equal(at(k, 0)) {
			t.Fatalf("slot %d: %d replicas got the run (%+v); want exactly one, with token %d", k, len(won), won, k+1)
		}
	}
}

// A running tick whose runner stopped heartbeating is taken over after its lease expires,
// as attempt 2 with a higher token; the old runner's heartbeat and finish are refused.
func TestClaimTickTakesOverAnExpiredRun(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	ctx := t.Context()
	job := hourly("takeover")
	first := mustClaim(t, pool, job, "a", at(0, time.Minute))
	noTick(t, pool, job, "b", at(0, time.Minute+29*time.Second)) // the lease is live
	second := mustClaim(t, pool, job, "b", at(0, time.Minute+30*time.Second))
	if !second.ScheduledFor.Equal(first.ScheduledFor) || second.Attempt != 2 || second.Token <= first.Token || second.Holder != "b" {
		t.Fatalf("takeover = %+v after %+v; want the same tick, attempt 2, a higher token, holder b", second, first)
	}
	if _, err := singleton.HeartbeatTick(ctx, pool, first, time.Minute); !errors.Is(err, singleton.ErrLost) {
		t.Fatalf("the old runner's heartbeat: %v, want ErrLost", err)
	}
	if err := singleton.FinishTick(ctx, pool, first, nil); !errors.Is(err, singleton.ErrLost) {
		t.Fatalf("the old runner's finish: %v, want ErrLost", err)
	}
	rs := runs(t, pool, "takeover")
	if len(rs) != 1 || rs[0].State != "running" || rs[0].Holder != "b" || rs[0].Token != second.Token || rs[0].Attempt != 2 {
		t.Fatalf("ledger %+v; want one running row, b's", rs)
	}
	if err := singleton.FinishTick(ctx, pool, second, nil); err != nil {
		t.Fatal(err)
	}
	if err := singleton.FinishTick(ctx, pool, second, nil); !errors.Is(err, singleton.ErrLost) {
		t.Fatalf("a second finish: %v, want ErrLost", err)
	}
	if _, err := singleton.HeartbeatTick(ctx, pool, second, time.Minute); !errors.Is(err, singleton.ErrLost) {
		t.Fatalf("a heartbeat after finish: %v, want ErrLost", err)
	}
	if rs := runs(t, pool, "takeover"); rs[0].State != "succeeded" || rs[0].FinishedAt.IsZero() {
		t.Fatalf("ledger %+v; want the tick succeeded", rs)
	}
	noTick(t, pool, job, "c", at(0, 50*time.Minute))
}

// A heartbeat extends the lease from the database clock and keeps the tick from being
// taken over.
func TestHeartbeatTickExtendsTheLease(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	ctx := t.Context()
	job := singleton.Job{Name: "beating", Every: time.Hour, TTL: time.Second}
	run, err := singleton.ClaimTick(ctx, pool, job, nil) // by the real database clock
	if err != nil {
		t.Fatal(err)
	}
	next, err := singleton.HeartbeatTick(ctx, pool, run, 10*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if next.Token != run.Token || next.ExpiresAt.Sub(run.StartedAt) < 10*time.Minute {
		t.Fatalf("heartbeat = %+v after %+v; want the same run, expiring 10m from now", next, run)
	}
	// Two seconds later by the injected clock the first lease would have expired; the
	// heartbeat's has not.
	if _, err := singleton.ClaimTick(ctx, pool, job, &singleton.ClaimOpts{Now: run.StartedAt.Add(2 * time.Second)}); !errors.Is(err, singleton.ErrNoTick) {
		t.Fatalf("claim after the heartbeat: %v, want ErrNoTick", err)
	}
}

// OverlapForbid: a tick that comes while an earlier run is running is skipped for good.
func TestOverlapForbidSkips(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	job := singleton.Job{Name: "forbid", Every: time.Hour, TTL: 2 * time.Hour} // zero Overlap: forbid
	long := mustClaim(t, pool, job, "a", at(0, time.Minute))
	noTick(t, pool, job, "b", at(1, time.Minute))
	rs := runs(t, pool, "forbid")
	if len(rs) != 2 || rs[0].State != "skipped" || !rs[0].ScheduledFor.Equal(at(1, 0)) || rs[0].Error == "" ||
		rs[1].State != "running" || rs[1].Token != long.Token {
		t.Fatalf("ledger %+v; want slot 1 skipped, slot 0 still running", rs)
	}
	if err := singleton.FinishTick(t.Context(), pool, long, nil); err != nil {
		t.Fatal(err)
	}
	noTick(t, pool, job, "b", at(1, 30*time.Minute)) // a skipped tick stays skipped
	next := mustClaim(t, pool, job, "b", at(2, time.Minute))
	if next.Token != long.Token+1 {
		t.Fatalf("the next run's token %d, want %d: a skip takes no token", next.Token, long.Token+1)
	}
	if s := status(t, pool, "forbid", at(2, 2*time.Minute)); s.Overlap != singleton.OverlapForbid || s.LastState != "running" {
		t.Fatalf("status %+v", s)
	}
}

// OverlapReplace: the new tick runs and the earlier run is marked replaced; its heartbeat
// and finish are refused.
func TestOverlapReplace(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	ctx := t.Context()
	job := singleton.Job{Name: "replace", Every: time.Hour, TTL: 2 * time.Hour, Overlap: singleton.OverlapReplace}
	old := mustClaim(t, pool, job, "a", at(0, time.Minute))
	replacement := mustClaim(t, pool, job, "b", at(1, time.Minute))
	if replacement.Token <= old.Token || !replacement.ScheduledFor.Equal(at(1, 0)) {
		t.Fatalf("replacement %+v after %+v", replacement, old)
	}
	rs := runs(t, pool, "replace")
	if len(rs) != 2 || rs[0].State != "running" || rs[1].State != "replaced" || !strings.Contains(rs[1].Error, "replaced") || rs[1].FinishedAt.IsZero() {
		t.Fatalf("ledger %+v; want slot 1 running, slot 0 replaced", rs)
	}
	if _, err := singleton.HeartbeatTick(ctx, pool, old, time.Minute); !errors.Is(err, singleton.ErrLost) {
		t.Fatalf("the replaced run's heartbeat: %v, want ErrLost", err)
	}
	if err := singleton.FinishTick(ctx, pool, old, nil); !errors.Is(err, singleton.ErrLost) {
		t.Fatalf("the replaced run's finish: %v, want ErrLost", err)
	}
	if err := singleton.FinishTick(ctx, pool, replacement, nil); err != nil {
		t.Fatal(err)
	}
}

// OverlapAllow: runs of successive ticks run side by side.
func TestOverlapAllow(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	job := singleton.Job{Name: "allow", Every: time.Hour, TTL: 2 * time.Hour, Overlap: singleton.OverlapAllow}
	a := mustClaim(t, pool, job, "a", at(0, time.Minute))
	b := mustClaim(t, pool, job, "b", at(1, time.Minute))
	if s := status(t, pool, "allow", at(1, 2*time.Minute)); s.Running != 2 || s.Overlap != singleton.OverlapAllow {
		t.Fatalf("status %+v; want 2 running", s)
	}
	for _, r := range []singleton.Run{a, b} {
		if err := singleton.FinishTick(t.Context(), pool, r, nil); err != nil {
			t.Fatal(err)
		}
	}
	if s := status(t, pool, "allow", at(1, 3*time.Minute)); s.Running != 0 || s.LastState != "succeeded" {
		t.Fatalf("status %+v; want none running", s)
	}
}

// FinishTick's outcomes feed the job's status: failures count until a success, the last
// error is kept, and Overdue follows.
func TestFinishTickUpdatesTheStatus(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	ctx := t.Context()
	job := singleton.Job{Name: "mailer", Every: time.Hour}
	first, err := singleton.ClaimTick(ctx, pool, job, nil) // the real clock: FinishTick uses it too
	if err != nil {
		t.Fatal(err)
	}
	ugly := "smtp down\x00\xff" + strings.Repeat("é", singleton.MaxErrorLen)
	if err := singleton.FinishTick(ctx, pool, first, errors.New(ugly)); err != nil {
		t.Fatal(err)
	}
	s := status(t, pool, "mailer", time.Time{})
	if s.ConsecutiveFailures != 1 || !strings.HasPrefix(s.LastError, "smtp down\uFFFDé") || len(s.LastError) > singleton.MaxErrorLen ||
		s.LastState != "failed" || s.LastFailureAt.IsZero() || !s.LastSuccessAt.IsZero() || s.Running != 0 || s.Token != first.Token {
		t.Fatalf("after a failure: %+v", s)
	}
	if !s.Overdue(24 * time.Hour) {
		t.Fatalf("a job whose last run failed is not overdue: %+v", s)
	}
	if !s.FirstTick.Equal(first.ScheduledFor) || s.MissedTicks != 0 || !s.NextTick.Equal(first.ScheduledFor.Add(time.Hour)) {
		t.Fatalf("first tick %v, missed %d, next %v; want %v, 0, an hour later", s.FirstTick, s.MissedTicks, s.NextTick, first.ScheduledFor)
	}

	// The next slot's run (claimed by an injected clock an hour on) succeeds.
	second, err := singleton.ClaimTick(ctx, pool, job, &singleton.ClaimOpts{Now: s.DBNow.Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	if err := singleton.FinishTick(ctx, pool, second, nil); err != nil {
		t.Fatal(err)
	}
	s = status(t, pool, "mailer", time.Time{})
	if s.ConsecutiveFailures != 0 || s.LastSuccessAt.IsZero() || s.LastState != "succeeded" || !strings.HasPrefix(s.LastError, "smtp down") {
		t.Fatalf("after a success: %+v", s)
	}
	if s.Overdue(0) {
		t.Fatalf("a job that just succeeded is overdue: %+v", s)
	}
	// Three hours on with no success it is overdue, and two ticks were missed (the
	// current slot, which nobody claimed yet, counts).
	later := s.DBNow.Add(3 * time.Hour)
	s = status(t, pool, "mailer", later)
	if !s.Overdue(time.Minute) || s.Overdue(3*time.Hour) {
		t.Fatalf("three hours after the last success: Overdue(1m) %v, Overdue(3h) %v; want true, false", s.Overdue(time.Minute), s.Overdue(3*time.Hour))
	}
	if s.MissedTicks != 2 {
		t.Fatalf("missed %d ticks, want 2", s.MissedTicks)
	}
}

// MissedTicks counts the slots from the first tick through the current one with no row;
// NextTick is the next boundary.
func TestJobStatusMissedTicks(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	job := hourly("gappy")
	for _, k := range []int{0, 1, 3} {
		mustClaim(t, pool, job, "a", at(k, time.Minute))
	}
	s := status(t, pool, "gappy", at(4, 10*time.Minute))
	if s.MissedTicks != 2 || !s.FirstTick.Equal(t0) || !s.NextTick.Equal(at(5, 0)) || !s.DBNow.Equal(at(4, 10*time.Minute)) {
		t.Fatalf("status %+v; want 2 missed (slots 2 and the unclaimed current 4), first %v, next %v", s, t0, at(5, 0))
	}
	mustClaim(t, pool, job, "a", at(4, 11*time.Minute))
	s = status(t, pool, "gappy", at(4, 11*time.Minute+10*time.Second))
	if s.MissedTicks != 1 || s.LastState != "running" || s.Running != 1 {
		t.Fatalf("status %+v; want 1 missed (slot 2), slot 4 running", s)
	}
	if s = status(t, pool, "gappy", at(4, 12*time.Minute)); s.Every != time.Hour || !s.Origin.Equal(time.Unix(0, 0)) || s.Token != 4 {
		t.Fatalf("schedule %v %v token %d", s.Every, s.Origin, s.Token)
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
	pool := pgtest.Pool(t)
	ctx := t.Context()
	jobs, err := singleton.ListJobs(ctx, pool, nil)
	if err != nil || jobs == nil || len(jobs) != 0 {
		t.Fatalf("ListJobs on an empty ledger = %v, %v; want an empty, non-nil slice", jobs, err)
	}
	if rs, err := singleton.ListRuns(ctx, pool, "nothing", nil); err != nil || rs == nil || len(rs) != 0 {
		t.Fatalf("ListRuns of an unknown job = %v, %v; want an empty, non-nil slice", rs, err)
	}
	for _, name := range []string{"c", "a", "b"} {
		for k := range 5 {
			mustClaim(t, pool, hourly(name), "x", at(k, time.Minute))
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
	run := singleton.Run{Job: "ok", Token: 1}
	if _, err := singleton.HeartbeatTick(ctx, nil, run, 0); !errors.Is(err, pgcoord.ErrInvalidArgument) {
		t.Errorf("HeartbeatTick with a zero TTL: %v", err)
	}
	if _, err := singleton.HeartbeatTick(ctx, nil, singleton.Run{}, time.Second); !errors.Is(err, pgcoord.ErrInvalidName) {
		t.Errorf("HeartbeatTick of a zero Run: %v", err)
	}
	if err := singleton.FinishTick(ctx, nil, singleton.Run{}, nil); !errors.Is(err, pgcoord.ErrInvalidName) {
		t.Errorf("FinishTick of a zero Run: %v", err)
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
	pool := pgtest.Pool(t)
	job := hourly("abandoned")
	dead := mustClaim(t, pool, job, "dies-late", at(0, 59*time.Minute+50*time.Second))
	next := mustClaim(t, pool, job, "next", at(1, time.Minute))
	if next.Token <= dead.Token {
		t.Fatalf("next run's token %d <= %d", next.Token, dead.Token)
	}
	rs := runs(t, pool, "abandoned")
	if len(rs) != 2 || rs[1].State != "failed" || !strings.Contains(rs[1].Error, "abandoned") {
		t.Fatalf("ledger after the next claim: %+v; want the dead run failed as abandoned", rs)
	}
	if st := status(t, pool, "abandoned", at(1, 2*time.Minute)); st.ConsecutiveFailures != 1 || st.LastFailureAt.IsZero() {
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
	pool := pgtest.Pool(t)
	job := hourly("quiet-losers")
	mustClaim(t, pool, job, "winner", at(0, time.Second))
	tx, err := pool.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(t.Context())
	_, err = singleton.ClaimTick(t.Context(), tx, job, &singleton.ClaimOpts{Holder: "loser", Now: at(0, 2*time.Second)})
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
