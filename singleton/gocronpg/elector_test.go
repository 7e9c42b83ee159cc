package gocronpg_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/go-co-op/gocron/v2"

	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/leases"
	"github.com/pgcoord/pgcoord/pgcoord"
	"github.com/pgcoord/pgcoord/singleton/gocronpg"
)

// electedReplica is one replica of TestElectorOnlyTheLeaderRunsJobs: a leases.Elector run
// by the test, and a gocron scheduler that asks it through the adapter.
type electedReplica struct {
	name    string
	elector *leases.Elector
	adapter *gocronpg.Elector
	sched   gocron.Scheduler
	cancel  context.CancelFunc
	done    chan error
}

// stop shuts the scheduler down, then resigns (in that order: no job starts after the
// resignation).
func (r *electedReplica) stop(t *testing.T) {
	t.Helper()
	if r.cancel == nil {
		return
	}
	if err := r.sched.Shutdown(); err != nil {
		t.Errorf("%s: scheduler shutdown: %v", r.name, err)
	}
	r.cancel()
	r.cancel = nil
	select {
	case err := <-r.done:
		if err != nil {
			t.Errorf("%s: elector Run: %v", r.name, err)
		}
	case <-time.After(15 * time.Second):
		t.Errorf("%s: elector Run did not return", r.name)
	}
}

// Three schedulers with the Elector adapter run one job every 200ms: only the leader's
// scheduler runs it, with the leader's lease; when the leader shuts down, another replica
// leads and runs the job.
func TestElectorOnlyTheLeaderRunsJobs(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	if _, err := pool.Exec(ctx, `CREATE TABLE leader_runs (
		id bigserial PRIMARY KEY, replica text NOT NULL, token bigint NOT NULL, is_leader boolean NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	var replicas []*electedReplica
	for i := range 3 {
		r := &electedReplica{name: fmt.Sprintf("replica-%d", i), done: make(chan error, 1)}
		var err error
		r.elector, err = leases.NewElector(pool, &leases.ElectorConfig{
			Name: "gocron-leader", TTL: 3 * time.Second, PollInterval: 100 * time.Millisecond,
			Holder: r.name, Logger: testLogger(t), Metrics: &leases.Metrics{},
		})
		if err != nil {
			t.Fatal(err)
		}
		if r.adapter, err = gocronpg.NewElector(r.elector); err != nil {
			t.Fatal(err)
		}
		if r.sched, err = gocron.NewScheduler(gocron.WithDistributedElector(r.adapter)); err != nil {
			t.Fatal(err)
		}
		_, err = r.sched.NewJob(gocron.DurationJob(200*time.Millisecond), gocron.NewTask(func() {
			l, ok := r.adapter.Lease()
			if _, err := pool.Exec(ctx, `INSERT INTO leader_runs (replica, token, is_leader) VALUES ($1, $2, $3)`, r.name, l.Token, ok); err != nil {
				t.Errorf("record: %v", err)
			}
		}), gocron.WithName("leader-job"))
		if err != nil {
			t.Fatal(err)
		}
		runCtx, cancel := context.WithCancel(context.Background())
		r.cancel = cancel
		go func() { r.done <- r.elector.Run(runCtx) }()
		r.sched.Start()
		replicas = append(replicas, r)
		t.Cleanup(func() { r.stop(t) })
	}
	runsBy := func(replica string) (n int) {
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM leader_runs WHERE replica LIKE $1`, replica).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	waitFor(t, 20*time.Second, "5 runs", func() bool { return runsBy("%") >= 5 })
	var leader *electedReplica
	for _, r := range replicas {
		if r.elector.IsLeader() {
			leader = r
		} else if err := r.adapter.IsLeader(ctx); !errors.Is(err, gocronpg.ErrNotLeader) {
			t.Errorf("%s follows but IsLeader = %v", r.name, err)
		}
	}
	if leader == nil {
		t.Fatal("no replica leads")
	}
	if err := leader.adapter.IsLeader(ctx); err != nil {
		t.Fatalf("the leader's IsLeader = %v", err)
	}
	leader.stop(t)
	before := runsBy("%")
	waitFor(t, 20*time.Second, "5 runs by the next leader", func() bool { return runsBy("%")-before >= 5 })
	for _, r := range replicas {
		r.stop(t)
	}

	rows, err := pool.Query(ctx, `SELECT replica, token, is_leader FROM leader_runs ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	byToken := map[int64]string{}
	var lastToken int64
	perReplica := map[string]int{}
	for rows.Next() {
		var replica string
		var token int64
		var leading bool
		if err := rows.Scan(&replica, &token, &leading); err != nil {
			t.Fatal(err)
		}
		perReplica[replica]++
		if !leading {
			t.Errorf("%s ran the job while not leading", replica)
			continue
		}
		if other, ok := byToken[token]; ok && other != replica {
			t.Errorf("token %d used by %s and %s", token, other, replica)
		}
		byToken[token] = replica
		if token < lastToken {
			t.Errorf("a run with token %d after one with token %d: two leaders ran the job", token, lastToken)
		}
		lastToken = token
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if len(byToken) < 2 || perReplica[leader.name] == 0 || len(perReplica) < 2 {
		t.Errorf("runs per replica %v, tokens %v: want the first leader and then another", perReplica, byToken)
	}
	t.Logf("runs per replica: %v (first leader %s)", perReplica, leader.name)
}

func TestNewElectorRejectsNil(t *testing.T) {
	t.Parallel()
	if _, err := gocronpg.NewElector(nil); !errors.Is(err, pgcoord.ErrInvalidArgument) {
		t.Fatalf("NewElector(nil) = %v", err)
	}
}
