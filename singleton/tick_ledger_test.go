package singleton_test

import (
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/internal/pgtest"
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
