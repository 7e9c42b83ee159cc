package gocronpg_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/go-co-op/gocron/v2"

	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/internal/workerproc"
	"github.com/pgcoord/pgcoord/singleton/gocronpg"
)

// processRole is the role of TestLockerAcrossProcesses's worker processes (see
// internal/workerproc; TestMain runs it): a replica with a gocron scheduler.
const processRole = "gocron-replica"

const processJob = "proc-job"

// processReplica runs a gocron scheduler with a Locker and one job every EVERY from START
// (Unix microseconds), recording each run in the executions table as replica NAME, and
// stops half an interval after the last of TICKS ticks.
func processReplica(ctx context.Context, w *workerproc.Worker) error {
	name, pool := w.Param("NAME"), w.Pool
	startMicros, err := strconv.ParseInt(w.Param("START"), 10, 64)
	if err != nil {
		return err
	}
	start := time.UnixMicro(startMicros)
	every, err := time.ParseDuration(w.Param("EVERY"))
	if err != nil {
		return err
	}
	ticks, err := strconv.Atoi(w.Param("TICKS"))
	if err != nil {
		return err
	}
	locker, err := gocronpg.NewLocker(pool, &gocronpg.LockerConfig{Window: every, TTL: 5 * time.Second, Holder: name})
	if err != nil {
		return err
	}
	s, err := gocron.NewScheduler(gocron.WithDistributedLocker(locker))
	if err != nil {
		return err
	}
	var (
		mu      sync.Mutex
		jobErrs []error
	)
	_, err = s.NewJob(gocron.DurationJob(every), gocron.NewTask(func() {
		run, ok := locker.Current(processJob)
		var err error
		if !ok {
			err = errors.New("the job runs without a current run")
		} else {
			_, err = pool.Exec(ctx, `INSERT INTO executions (job, tick, replica, token, slot) VALUES ($1, $2, $3, $4, $5)`,
				processJob, tickOf(run.ScheduledFor, start, every), name, run.Token, run.ScheduledFor)
		}
		if err != nil {
			mu.Lock()
			jobErrs = append(jobErrs, err)
			mu.Unlock()
		}
	}), gocron.WithName(processJob), gocron.WithStartAt(gocron.WithStartDateTime(start)))
	if err != nil {
		return fmt.Errorf("new job (started %v before the first tick): %w", time.Until(start), err)
	}
	s.Start()
	// Stop well after the last tick the test checks: on a loaded machine a timer fires
	// late, and a process stopped half an interval after that tick's start could stop
	// before running it. The ticks that run after it are checked like every other.
	stop := time.NewTimer(time.Until(start.Add(time.Duration(ticks+1)*every + every/2)))
	select {
	case <-stop.C:
	case <-ctx.Done():
	}
	if err := s.Shutdown(); err != nil {
		return err
	}
	mu.Lock()
	defer mu.Unlock()
	return errors.Join(jobErrs...)
}

// Three processes, each running a gocron scheduler with a Locker, one job every 500ms
// started in step: each tick runs exactly once across the processes.
func TestLockerAcrossProcesses(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	var schema string
	if err := pool.QueryRow(ctx, `SELECT current_schema()`).Scan(&schema); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, executionsTable); err != nil {
		t.Fatal(err)
	}
	const (
		every = 500 * time.Millisecond
		ticks = 8
	)
	// Room for the processes to start before the first tick: under -race beside CPU-bound
	// processes (CI's PostgreSQL 17 leg) three of them have taken more than 10 s.
	start := alignedStart(every, 2*pgtest.WaitLimit)
	var procs []*workerproc.Proc
	for i := range 3 {
		p, err := workerproc.Start(workerproc.Spec{
			Name: fmt.Sprintf("proc-%d", i), Role: processRole, URL: pgtest.URL(t), Schema: schema,
			Params: map[string]string{"NAME": fmt.Sprintf("proc-%d", i), "START": strconv.FormatInt(start.UnixMicro(), 10),
				"EVERY": every.String(), "TICKS": strconv.Itoa(ticks)},
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := p.Stop(0); err != nil {
				t.Error(err)
			}
		})
		procs = append(procs, p)
	}
	deadline := time.Now().Add(time.Until(start) + ticks*every + 30*time.Second)
	for _, p := range procs {
		if err := p.Wait(time.Until(deadline)); err != nil {
			t.Fatalf("worker %s: %v\n%s", p.Name(), err, p.Stderr())
		}
	}
	execs := executions(t, pool)
	skipped := checkLedger(t, pool, processJob, start, every, execs)
	last := checkEachTickOnce(t, execs, map[string]map[int64]bool{processJob: skipped}, processJob)
	if last[processJob] < ticks-1 {
		t.Errorf("ran or skipped ticks 0..%d, want 0..%d", last[processJob], ticks-1)
	}
	perReplica := map[string]int{}
	for _, e := range execs {
		perReplica[e.replica]++
	}
	t.Logf("%d ticks, runs per process: %v", len(execs), perReplica)
}
