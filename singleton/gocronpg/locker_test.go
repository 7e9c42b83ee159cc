package gocronpg_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/go-co-op/gocron/v2"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/pgcoord"
	"github.com/pgcoord/pgcoord/singleton"
	"github.com/pgcoord/pgcoord/singleton/gocronpg"
)

var ctx = context.Background()

const executionsTable = `CREATE TABLE executions (
	id        bigserial PRIMARY KEY,
	job       text   NOT NULL,
	tick      bigint NOT NULL, -- index of the tick the run served: its ledger slot's
	replica   text   NOT NULL,
	token     bigint NOT NULL, -- the ledger run's fence token (Locker.Current)
	slot      timestamptz NOT NULL
)`

type execution struct {
	job, replica string
	tick, token  int64
	slot         time.Time
}

func executions(t *testing.T, pool *pgxpool.Pool) []execution {
	t.Helper()
	rows, err := pool.Query(ctx, `SELECT job, tick, replica, token, slot FROM executions ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []execution
	for rows.Next() {
		var e execution
		if err := rows.Scan(&e.job, &e.tick, &e.replica, &e.token, &e.slot); err != nil {
			t.Fatal(err)
		}
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// checkEachTickOnce asserts that each job ran at most once for each tick (its ledger slot),
// each time with its own ledger run, and that every tick from 0 through the job's last
// either ran or was skipped (the ledger's skipped ticks: OverlapForbid, when the previous
// run was still running — on a busy machine a run can outlast its slot). It returns the
// last tick per job that ran or was skipped.
func checkEachTickOnce(t *testing.T, execs []execution, skipped map[string]map[int64]bool, jobs ...string) map[string]int64 {
	t.Helper()
	last := map[string]int64{}
	seen := map[string]map[int64]execution{}
	type jobToken struct {
		job   string
		token int64
	}
	tokens := map[jobToken]bool{}
	for _, e := range execs {
		if seen[e.job] == nil {
			seen[e.job] = map[int64]execution{}
		}
		if prev, dup := seen[e.job][e.tick]; dup {
			t.Errorf("job %s tick %d ran twice: on %s (token %d, slot %v) and on %s (token %d, slot %v)",
				e.job, e.tick, prev.replica, prev.token, prev.slot, e.replica, e.token, e.slot)
		}
		seen[e.job][e.tick] = e
		if tokens[jobToken{e.job, e.token}] {
			t.Errorf("job %s: token %d used by two runs", e.job, e.token)
		}
		tokens[jobToken{e.job, e.token}] = true
		last[e.job] = max(last[e.job], e.tick)
	}
	for _, job := range jobs {
		for tick := range skipped[job] {
			last[job] = max(last[job], tick)
		}
		for tick := int64(0); tick <= last[job]; tick++ {
			if _, ok := seen[job][tick]; !ok && !skipped[job][tick] {
				t.Errorf("job %s tick %d never ran and was not skipped (ticks 0..%d)", job, tick, last[job])
			}
		}
	}
	return last
}

// checkLedger asserts that the ledger of job agrees with its executions: one succeeded run
// per execution, and otherwise only ticks skipped because the previous run was still
// running, which it returns (by tick index).
func checkLedger(t *testing.T, pool *pgxpool.Pool, job string, start time.Time, every time.Duration, execs []execution) map[int64]bool {
	t.Helper()
	runs, err := singleton.ListRuns(ctx, pool, job, &singleton.ListRunsOpts{Limit: singleton.MaxListLimit})
	if err != nil {
		t.Fatal(err)
	}
	skipped := map[int64]bool{}
	succeeded := 0
	for _, r := range runs {
		switch {
		case r.State == "succeeded":
			succeeded++
		case r.State == "skipped" && r.Error == "previous run still running":
			skipped[tickOf(r.ScheduledFor, start, every)] = true
		default:
			t.Errorf("job %s: ledger row %+v, want succeeded or skipped", job, r)
		}
	}
	ran := 0
	for _, e := range execs {
		if e.job == job {
			ran++
		}
	}
	if succeeded != ran {
		t.Errorf("job %s: %d succeeded runs in the ledger for %d executions", job, succeeded, ran)
	}
	return skipped
}

// Three schedulers in one process, each with its own Locker (one replica each), run two
// jobs every 400ms, started in step: each tick of each job runs exactly once in total.
func TestLockerEachTickOnceAcrossSchedulers(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	if _, err := pool.Exec(ctx, executionsTable); err != nil {
		t.Fatal(err)
	}
	const every = 400 * time.Millisecond
	const ticks = 8
	start := alignedStart(every, 300*time.Millisecond)
	jobs := []string{"job-a", "job-b"}
	var schedulers []gocron.Scheduler
	for i := range 3 {
		replica := fmt.Sprintf("replica-%d", i)
		locker, err := gocronpg.NewLocker(pool, &gocronpg.LockerConfig{
			Window: every, TTL: 2 * time.Second, Holder: replica, Logger: testLogger(t),
		})
		if err != nil {
			t.Fatal(err)
		}
		s, err := gocron.NewScheduler(gocron.WithDistributedLocker(locker))
		if err != nil {
			t.Fatal(err)
		}
		for _, job := range jobs {
			_, err := s.NewJob(gocron.DurationJob(every), gocron.NewTask(func() {
				run, ok := locker.Current(job)
				if !ok {
					t.Errorf("%s runs %s without a current run", replica, job)
				}
				if _, err := pool.Exec(ctx, `INSERT INTO executions (job, tick, replica, token, slot) VALUES ($1, $2, $3, $4, $5)`,
					job, tickOf(run.ScheduledFor, start, every), replica, run.Token, run.ScheduledFor); err != nil {
					t.Errorf("record: %v", err)
				}
			}), gocron.WithName(job), gocron.WithStartAt(gocron.WithStartDateTime(start)))
			if err != nil {
				t.Fatal(err)
			}
		}
		schedulers = append(schedulers, s)
	}
	for _, s := range schedulers {
		s.Start()
	}
	t.Cleanup(func() {
		for _, s := range schedulers {
			_ = s.Shutdown()
		}
	})
	waitFor(t, 30*time.Second, fmt.Sprintf("%d ticks of each job", ticks), func() bool {
		var n int
		if err := pool.QueryRow(ctx, `SELECT coalesce(min(c), 0) FROM (SELECT count(*) c FROM executions GROUP BY job) x`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n >= ticks
	})
	for _, s := range schedulers {
		if err := s.Shutdown(); err != nil {
			t.Fatal(err)
		}
	}
	execs := executions(t, pool)
	skipped := map[string]map[int64]bool{}
	for _, job := range jobs {
		skipped[job] = checkLedger(t, pool, job, start, every, execs)
	}
	last := checkEachTickOnce(t, execs, skipped, jobs...)
	perReplica := map[string]int{}
	for _, e := range execs {
		perReplica[e.replica]++
	}
	t.Logf("ticks per job: %v; runs per replica: %v", last, perReplica)
}

// A Lock heartbeats its run: another replica cannot claim the tick while the job runs,
// however long, nor after it finished; Unlock records the run as succeeded.
func TestLockerHeartbeatsAndRecords(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	// A day-long window: the test never crosses a slot boundary. Each heartbeat has TTL/3
	// to answer: 2 s leaves it room under -race on a starved machine.
	const ttl = 2 * time.Second
	newLocker := func(holder string) *gocronpg.Locker {
		l, err := gocronpg.NewLocker(pool, &gocronpg.LockerConfig{Window: 24 * time.Hour, TTL: ttl, Holder: holder, Logger: testLogger(t)})
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	a, b := newLocker("a"), newLocker("b")
	lock, err := a.Lock(ctx, "report")
	if err != nil {
		t.Fatal(err)
	}
	run, ok := a.Current("report")
	if !ok || run.Holder != "a" || run.Token != lock.(*gocronpg.Lock).Run().Token {
		t.Fatalf("Current = %+v, %v", run, ok)
	}
	if _, ok := b.Current("report"); ok {
		t.Fatal("another locker reports a current run")
	}
	// Outlive two TTLs: the heartbeats keep the run's lease live.
	waitFor(t, 2*ttl+pgtest.WaitLimit, "the run's lease extended by heartbeats past 2 TTLs", func() bool {
		var extended bool
		if err := pool.QueryRow(ctx, `SELECT expires_at > $1::timestamptz + $2 * interval '1 second' AND expires_at > now()
			FROM pgcoord_job_runs WHERE job = 'report'`, run.ExpiresAt, (2 * ttl).Seconds()).Scan(&extended); err != nil {
			t.Fatal(err)
		}
		return extended
	})
	if _, err := b.Lock(ctx, "report"); !errors.Is(err, singleton.ErrNoTick) {
		t.Fatalf("a second replica's Lock while the job runs = %v, want ErrNoTick", err)
	}
	if _, ok := a.Current("report"); !ok {
		t.Fatal("the run is not current after heartbeats")
	}
	if err := lock.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := lock.Unlock(ctx); err != nil {
		t.Fatalf("second Unlock: %v", err)
	}
	if _, ok := a.Current("report"); ok {
		t.Fatal("Current after Unlock")
	}
	if _, err := b.Lock(ctx, "report"); !errors.Is(err, singleton.ErrNoTick) {
		t.Fatalf("Lock of a tick that already ran = %v, want ErrNoTick", err)
	}
	runs, err := singleton.ListRuns(ctx, pool, "report", nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(runs) != 1 || runs[0].State != "succeeded" || runs[0].Holder != "a" || runs[0].Token != run.Token {
		t.Fatalf("ledger %+v, want one run succeeded by a", runs)
	}
}

// A run whose heartbeats cannot get through is lost once its lease expires: another
// replica takes the tick over (the job's writes can be fenced by the higher token), the
// stalled replica's Current turns false and its Unlock reports ErrLost.
func TestLockerLosesAStalledRun(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	// Replica a has a pool of one connection, which the test takes away: its heartbeats
	// cannot even be sent, as on a cut link.
	cfg := pool.Config().Copy()
	cfg.MaxConns = 1
	poolA, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer poolA.Close()
	newLocker := func(p *pgxpool.Pool, holder string) *gocronpg.Locker {
		l, err := gocronpg.NewLocker(p, &gocronpg.LockerConfig{Window: 24 * time.Hour, TTL: 300 * time.Millisecond, Holder: holder, Logger: testLogger(t)})
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	a, b := newLocker(poolA, "a"), newLocker(pool, "b")
	lock, err := a.Lock(ctx, "stalled")
	if err != nil {
		t.Fatal(err)
	}
	first := lock.(*gocronpg.Lock).Run()
	conn, err := poolA.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the run's lease expires", func() bool {
		var expired bool
		if err := pool.QueryRow(ctx, `SELECT expires_at <= clock_timestamp() FROM pgcoord_job_runs WHERE job = 'stalled'`).Scan(&expired); err != nil {
			t.Fatal(err)
		}
		return expired
	})
	if _, ok := a.Current("stalled"); ok {
		t.Error("the stalled replica still reports its run current after the lease expired")
	}
	lockB, err := b.Lock(ctx, "stalled")
	if err != nil {
		t.Fatalf("takeover of the expired run: %v", err)
	}
	conn.Release()
	second := lockB.(*gocronpg.Lock).Run()
	if second.Token <= first.Token || second.Attempt != 2 || !second.ScheduledFor.Equal(first.ScheduledFor) {
		t.Fatalf("takeover %+v after %+v: want attempt 2 of the same tick with a higher token", second, first)
	}
	if err := lock.Unlock(ctx); !errors.Is(err, singleton.ErrLost) {
		t.Fatalf("the stalled replica's Unlock = %v, want ErrLost", err)
	}
	if err := lockB.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestNewLockerRejectsBadConfig(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	for name, cfg := range map[string]*gocronpg.LockerConfig{
		"nil":             nil,
		"no window":       {},
		"sub-microsecond": {Window: time.Second + time.Nanosecond},
		"negative ttl":    {Window: time.Second, TTL: -time.Second},
		"bad holder":      {Window: time.Second, Holder: "a\x00b"},
	} {
		_, err := gocronpg.NewLocker(pool, cfg)
		if !errors.Is(err, pgcoord.ErrInvalidArgument) && !errors.Is(err, pgcoord.ErrInvalidName) {
			t.Errorf("%s: NewLocker = %v, want an invalid-argument error", name, err)
		}
	}
	if _, err := gocronpg.NewLocker(nil, &gocronpg.LockerConfig{Window: time.Second}); !errors.Is(err, pgcoord.ErrInvalidArgument) {
		t.Errorf("nil pool: %v", err)
	}
	l, err := gocronpg.NewLocker(pool, &gocronpg.LockerConfig{Window: time.Minute, Prefix: "app1:"})
	if err != nil {
		t.Fatal(err)
	}
	job := l.Job("send")
	if job.Name != "app1:send" || job.Every != time.Minute || job.Overlap != singleton.OverlapForbid ||
		!job.Origin.Equal(time.Unix(-30, 0)) || l.Holder() == "" {
		t.Fatalf("defaults: %+v, holder %q", job, l.Holder())
	}
}

// Concurrent Lock calls for one tick from many replicas: exactly one succeeds.
func TestLockerConcurrentLocksOneWinner(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		won  []gocron.Lock
		errs []error
	)
	gate := make(chan struct{})
	for i := range 12 {
		l, err := gocronpg.NewLocker(pool, &gocronpg.LockerConfig{Window: 24 * time.Hour, Holder: fmt.Sprint("r", i), Logger: testLogger(t)})
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			<-gate
			lock, err := l.Lock(ctx, "contended")
			mu.Lock()
			defer mu.Unlock()
			if err == nil {
				won = append(won, lock)
			} else if !errors.Is(err, singleton.ErrNoTick) {
				errs = append(errs, err)
			}
		})
	}
	close(gate)
	wg.Wait()
	if len(won) != 1 || len(errs) > 0 {
		t.Fatalf("%d winners, errors %v", len(won), errs)
	}
	if err := won[0].Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}
