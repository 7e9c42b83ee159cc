package singleton_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/pgcoord/pgcoord/pgcoord"
	"github.com/pgcoord/pgcoord/singleton"
)

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
