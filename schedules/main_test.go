package schedules_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/internal/workerproc"
	"github.com/pgcoord/pgcoord/schedules"
)

func TestMain(m *testing.M) {
	// A worker process of the tests in process_test.go runs its scheduler and exits here.
	workerproc.Main(map[string]workerproc.Role{replicaRole: replica})
	pgtest.Main(m)
}

// calls records the runs handlers received, by schedule and tick.
type calls struct {
	mu   sync.Mutex
	runs map[string]map[time.Time]int
	all  []schedules.Run
}

func newCalls() *calls { return &calls{runs: map[string]map[time.Time]int{}} }

func (c *calls) record(run schedules.Run) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.runs[run.Schedule] == nil {
		c.runs[run.Schedule] = map[time.Time]int{}
	}
	c.runs[run.Schedule][run.Tick.UTC()]++
	c.all = append(c.all, run)
}

// handler records each run and returns nil.
func (c *calls) handler() schedules.Handler {
	return func(_ context.Context, run schedules.Run) error {
		c.record(run)
		return nil
	}
}

// count returns how many distinct ticks of schedule ran.
func (c *calls) count(schedule string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.runs[schedule])
}

// start runs a Scheduler with cfg on pool until the test ends (or stop is called).
func start(t *testing.T, pool *pgxpool.Pool, handlers map[string]schedules.Handler) (stop func()) {
	t.Helper()
	s, err := schedules.New(schedules.Config{Pool: pool, Handlers: handlers, RunTTL: 3 * time.Second, PollInterval: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != context.Canceled {
				t.Errorf("Run returned %v, want context.Canceled", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// runStates returns the ledger's rows of a schedule: tick → state, and the ticks each
// missed or skipped row stands for.
func runStates(t *testing.T, pool *pgxpool.Pool, name string) (map[time.Time]string, map[string]int64) {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT scheduled_for, state, ticks FROM pgcoord_job_runs WHERE job = $1`, name)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	states, ticks := map[time.Time]string{}, map[string]int64{}
	for rows.Next() {
		var at time.Time
		var state string
		var n int64
		if err := rows.Scan(&at, &state, &n); err != nil {
			t.Fatal(err)
		}
		states[at.UTC()] = state
		ticks[state] += n
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return states, ticks
}
