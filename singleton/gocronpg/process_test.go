package gocronpg_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/go-co-op/gocron/v2"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/internal/pgconfig"
	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/singleton"
	"github.com/pgcoord/pgcoord/singleton/gocronpg"
)

// Worker processes of TestLockerAcrossProcesses: the test binary re-run with envWorker=1,
// caught by TestMain before the testing package starts.
const (
	envWorker = "GOCRONPG_TEST_WORKER" // "1" in a worker process
	envURL    = "GOCRONPG_TEST_URL"
	envSchema = "GOCRONPG_TEST_SCHEMA"
	envName   = "GOCRONPG_TEST_NAME"  // the replica's name (Locker holder)
	envStart  = "GOCRONPG_TEST_START" // the job's first tick, Unix microseconds
	envEvery  = "GOCRONPG_TEST_EVERY"
	envTicks  = "GOCRONPG_TEST_TICKS" // the worker stops after this many ticks
)

const processJob = "proc-job"

func workerMain() int {
	if err := runWorker(); err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		return 1
	}
	return 0
}

// runWorker runs a gocron scheduler with a Locker and one job every envEvery from
// envStart, recording each run in the executions table, and stops half an interval after
// the last of envTicks ticks.
func runWorker() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute) // an orphan cannot linger
	defer cancel()
	name := os.Getenv(envName)
	startMicros, err := strconv.ParseInt(os.Getenv(envStart), 10, 64)
	if err != nil {
		return err
	}
	start := time.UnixMicro(startMicros)
	every, err := time.ParseDuration(os.Getenv(envEvery))
	if err != nil {
		return err
	}
	ticks, err := strconv.Atoi(os.Getenv(envTicks))
	if err != nil {
		return err
	}
	cfg, err := pgconfig.Pool(os.Getenv(envURL), pgconfig.Options{AppName: "gocronpg-test-worker", Schema: os.Getenv(envSchema), MaxConns: 4})
	if err != nil {
		return err
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
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
		now := time.Now()
		run, ok := locker.Current(processJob)
		var err error
		if !ok {
			err = errors.New("the job runs without a current run")
		} else {
			_, err = pool.Exec(ctx, `INSERT INTO executions (job, tick, replica, token, slot) VALUES ($1, $2, $3, $4, $5)`,
				processJob, tickOf(now, start, every), name, run.Token, run.ScheduledFor)
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
	stop := time.NewTimer(time.Until(start.Add(time.Duration(ticks)*every - every/2)))
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

// syncBuffer is a bytes.Buffer safe to read while a process writes to it.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
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
	// Room for the processes to start (under -race) before the first tick.
	start := alignedStart(every, 3*time.Second)
	type proc struct {
		cmd     *exec.Cmd
		stderr  syncBuffer
		done    chan struct{} // closed when the process has exited
		waitErr error
	}
	var procs []*proc
	for i := range 3 {
		p := &proc{cmd: exec.Command(os.Args[0]), done: make(chan struct{})}
		p.cmd.Env = append(os.Environ(), envWorker+"=1", envURL+"="+pgtest.URL(t), envSchema+"="+schema,
			envName+"="+fmt.Sprintf("proc-%d", i), envStart+"="+strconv.FormatInt(start.UnixMicro(), 10),
			envEvery+"="+every.String(), envTicks+"="+strconv.Itoa(ticks), "GORACE=atexit_sleep_ms=0")
		p.cmd.Stdout, p.cmd.Stderr = &p.stderr, &p.stderr
		p.cmd.WaitDelay = 5 * time.Second
		if err := p.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		go func() {
			p.waitErr = p.cmd.Wait()
			close(p.done)
		}()
		t.Cleanup(func() {
			select {
			case <-p.done:
			default:
				_ = p.cmd.Process.Kill()
				select {
				case <-p.done:
				case <-time.After(15 * time.Second):
					t.Errorf("worker %d still there 15s after SIGKILL", i)
				}
			}
		})
		procs = append(procs, p)
	}
	deadline := time.After(time.Until(start) + ticks*every + 30*time.Second)
	for i, p := range procs {
		select {
		case <-p.done:
			if p.waitErr != nil {
				t.Fatalf("worker %d: %v\n%s", i, p.waitErr, p.stderr.String())
			}
		case <-deadline:
			t.Fatalf("worker %d did not finish in time\n%s", i, p.stderr.String())
		}
	}
	execs := executions(t, pool)
	last := checkEachTickOnce(t, execs, processJob)
	if last[processJob] != ticks-1 {
		t.Errorf("ran ticks 0..%d, want 0..%d", last[processJob], ticks-1)
	}
	perReplica := map[string]int{}
	for _, e := range execs {
		perReplica[e.replica]++
	}
	runs, err := singleton.ListRuns(ctx, pool, processJob, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range runs {
		if r.State != "succeeded" {
			t.Errorf("ledger row %+v, want succeeded", r)
		}
	}
	if len(runs) != len(execs) {
		t.Errorf("%d ledger runs for %d executions", len(runs), len(execs))
	}
	t.Logf("%d ticks, runs per process: %v", len(execs), perReplica)
}
