//go:build unix

package integration_test

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/internal/workerproc"
)

// The high-availability suite (docs/ha.md): the fault suite's workers (faultworker_test.go)
// run every workload against a three-node Patroni cluster (scripts/ha-cluster.sh), half of
// them through the multi-host URL with target_session_attrs=read-write and half through
// HAProxy, while the test fails the cluster over by the means an operator meets: the
// leader's node killed, frozen past Patroni's TTL (docker pause: a whole database node's
// GC pause), cut off from its peers while clients still reach it, a replica lost, the
// leader node's etcd member killed, etcd's quorum lost, and a rolling restart of every node. Then it checks the
// whole history with the fault suite's checks — among them that no partition of the
// workers' partition group had two owners across the failovers (faults_partitions_test.go)
// — and what synchronous replication adds: no grant that a worker was told it holds is
// missing from the new primary, and the cluster did move to new timelines.
//
// `make ha-test` starts the cluster and runs it; the test is skipped without the cluster.
// Each kind of fault runs once per round, in an order drawn from the seed
// (PGCOORD_FAULT_SEED replays it); PGCOORD_HA_ROUNDS sets the rounds (default 1, `make
// ha-soak` runs more).

const (
	envHAURL      = "PGCOORD_HA_URL"
	envHAProxyURL = "PGCOORD_HA_PROXY_URL"
	envHAMode     = "PGCOORD_HA_MODE"
	envHARounds   = "PGCOORD_HA_ROUNDS"
)

func TestHAFailovers(t *testing.T) {
	direct, proxied := os.Getenv(envHAURL), os.Getenv(envHAProxyURL)
	if direct == "" || proxied == "" {
		t.Skipf("needs the Patroni cluster: `make ha-test` starts it and sets %s and %s", envHAURL, envHAProxyURL)
	}
	mode := cmp.Or(os.Getenv(envHAMode), "sync")
	rounds := 1
	if s := os.Getenv(envHARounds); s != "" {
		var err error
		if rounds, err = strconv.Atoi(s); err != nil || rounds < 1 {
			t.Fatalf("%s=%q: want a positive number", envHARounds, s)
		}
	}
	seed := faultSeed(t)
	c := &haCluster{t: t, ctx: t.Context(), mode: mode}
	c.waitHealthy()
	startTL := c.timeline()

	h := &faultHarness{t: t, ctx: t.Context(), rng: rand.New(rand.NewPCG(seed, 0)), seed: seed, workers: map[string]*workerproc.Proc{},
		unfenced: faultFencingOff(t), workerLifetime: haTestLimit(rounds)}
	if mode == "async" {
		// An asynchronous failover may lose the last acknowledged commits, and with them what
		// the invariants below rest on: those are counted, not failed. Fence tokens must still
		// never be reused nor go backwards (the timeline floor), a register's nor a partition's.
		h.tolerated = map[string]bool{}
		for _, kind := range faultViolationKinds {
			h.tolerated[kind] = kind != "token-reused" && kind != "token-order" && kind != "partition-token-order"
		}
	}
	h.prepare(direct, []string{direct, proxied})
	checkHACLI(t, mode, direct, proxied)
	probe := startHAProbe(t, h, direct)
	h.startWorkers()
	h.settle(2 * time.Minute) // every workload is running before the first fault
	var runs []haFaultRun
	for range rounds {
		kinds := slices.Clone(haFaults)
		h.rng.Shuffle(len(kinds), func(i, j int) { kinds[i], kinds[j] = kinds[j], kinds[i] })
		for _, f := range kinds {
			run := haFaultRun{kind: f.name, tl: c.timeline()}
			t.Logf("%s fault: %s", time.Now().UTC().Format("15:04:05.000"), f.name)
			detail := f.inject(c, h)
			run.began, run.ended = c.faultAt, time.Now()
			runs = append(runs, run)
			h.faults = append(h.faults, f.name)
			t.Logf("%s %s: %s; healthy again after %v", run.ended.UTC().Format("15:04:05.000"), f.name, detail,
				run.ended.Sub(run.began).Round(100*time.Millisecond))
		}
	}
	h.settle(2 * time.Minute)
	h.stopWorkers()
	// A pool opened now connects to the primary of the end; the harness's may hold
	// connections it opened before the last failover.
	h.admin = pgtest.NewPool(t, direct, faultSchema)
	hist := h.check()
	h.checkAcknowledgedGrantsKept(hist)
	reportHATimings(t, runs, probe.stop(), hist)
	if mode == "async" {
		t.Logf("asynchronous mode, invariants weakened by lost commits (count by kind): %v", h.weakened)
	}
	checkHACLI(t, mode, direct, proxied)
	if len(c.remedies) > 0 {
		t.Logf("where Patroni did not recover by itself (see docs/ha.md): %s", strings.Join(c.remedies, "; "))
	}
	if endTL := c.timeline(); endTL <= startTL {
		t.Errorf("the cluster stayed on timeline %d: no failover happened", startTL)
	} else {
		t.Logf("timelines %d to %d", startTL, endTL)
	}
}

// haTestLimit bounds the whole test (make ha-test's go test -timeout) and so its workers'
// lifetime: a round of faults takes 4 to 7 minutes here.
func haTestLimit(rounds int) time.Duration {
	return time.Duration(rounds)*20*time.Minute + 10*time.Minute
}

// haDoctorSummary is how pgcoord doctor's replication finding begins on the cluster.
var haDoctorSummary = regexp.MustCompile(`^primary with 2 (asynchronous )?standby\(s\)`)

// checkHACLI checks that the CLI works through both ways of finding the primary and that
// `pgcoord doctor` says what a failover of this cluster keeps.
func checkHACLI(t *testing.T, mode string, urls ...string) {
	t.Helper()
	want := map[string]string{"sync": "ok", "strict": "ok", "async": "info"}[mode]
	for _, url := range urls {
		if code, _, stderr := runCLI(t, url, "leases", "list", "--schema", faultSchema); code != 0 {
			t.Errorf("pgcoord leases list through %s: exit %d: %s", url, code, stderr)
		}
		_, stdout, stderr := runCLI(t, url, "doctor", "--json", "--schema", faultSchema)
		var findings []struct{ Check, Status, Summary string }
		if err := json.Unmarshal([]byte(stdout), &findings); err != nil {
			t.Fatalf("pgcoord doctor --json through %s: %v: %s %s", url, err, stdout, stderr)
		}
		i := slices.IndexFunc(findings, func(f struct{ Check, Status, Summary string }) bool { return f.Check == "replication" })
		if i < 0 || findings[i].Status != want || !haDoctorSummary.MatchString(findings[i].Summary) {
			t.Errorf("pgcoord doctor through %s in %s mode: %+v, want a primary with 2 standbys, status %s", url, mode, findings, want)
		}
	}
}

// checkAcknowledgedGrantsKept checks that every grant a worker was told it holds was
// committed on the cluster that survived: with a synchronous standby, a failover loses no
// acknowledged commit.
func (h *faultHarness) checkAcknowledgedGrantsKept(hist *faultHistory) {
	type grant struct {
		reg   string
		token int64
	}
	kept := map[grant]bool{}
	rows, err := h.admin.Query(h.ctx, `SELECT name, token FROM fault_grant_log`)
	if err != nil {
		h.t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var g grant
		if err := rows.Scan(&g.reg, &g.token); err != nil {
			h.t.Fatal(err)
		}
		kept[g] = true
	}
	if err := rows.Err(); err != nil {
		h.t.Fatal(err)
	}
	lost := 0
	for _, g := range hist.grants {
		if !kept[grant{g.reg, g.token}] {
			lost++
			h.violated("grant-lost", "%s: grant %d acknowledged to %s at %s is not on the surviving primary",
				g.reg, g.token, g.worker, time.Unix(0, g.from).UTC().Format("15:04:05.000"))
		}
	}
	h.t.Logf("%d acknowledged grants, %d lost", len(hist.grants), lost)
}

// haFault is one kind of fault: inject does it, waits until the cluster is whole again,
// and says what happened.
type haFault struct {
	name   string
	inject func(c *haCluster, h *faultHarness) string
}

var haFaults = []haFault{
	{"leader killed", func(c *haCluster, _ *faultHarness) string {
		old := c.leader()
		c.markFault()
		c.docker("kill", old)
		next, took := c.waitNewLeader(old)
		c.docker("start", old)
		c.waitNodeUp(old)
		c.waitHealthy()
		return fmt.Sprintf("%s killed, %s leads after %v", old, next, took)
	}},
	{"leader paused past the TTL", func(c *haCluster, _ *faultHarness) string {
		old := c.leader()
		c.markFault()
		c.pause(old)
		next, took := c.waitNewLeader(old)
		c.docker("unpause", old)
		c.waitHealthy()
		return fmt.Sprintf("%s frozen, %s leads after %v", old, next, took)
	}},
	{"leader cut off from its peers", func(c *haCluster, _ *faultHarness) string {
		old := c.leader()
		began := c.markFault()
		c.docker("network", "disconnect", haNetwork, old)
		demoted := c.waitReadOnly(old)
		next, took := c.waitNewLeader(old)
		c.docker("network", "connect", "--alias", haNodeName(old), haNetwork, old)
		c.waitHealthy()
		return fmt.Sprintf("%s partitioned (clients still reach it) stopped taking writes after %v, %s leads after %v",
			old, demoted.Sub(began).Round(100*time.Millisecond), next, took)
	}},
	{"replica lost", func(c *haCluster, h *faultHarness) string {
		replica := c.replica(h)
		c.markFault()
		c.docker("kill", replica)
		c.waitMembersRunning(2)
		c.docker("start", replica)
		c.waitNodeUp(replica)
		c.waitHealthy()
		return replica + " killed and started again"
	}},
	{"leader's etcd member lost", func(c *haCluster, _ *faultHarness) string {
		node := c.leader()
		c.markFault()
		c.docker("exec", node, "sh", "-c", "kill $(cat /var/run/etcd.pid)")
		time.Sleep(5 * time.Second) // a few of Patroni's loops without its local etcd
		c.docker("exec", "-d", node, "/ha/etcd.sh")
		c.waitHealthy()
		return fmt.Sprintf("etcd on %s killed and started again; %s leads", node, c.leader())
	}},
	{"etcd quorum lost", func(c *haCluster, h *faultHarness) string {
		// Two of the three etcd members: no quorum, so no node can hold the leader key. The
		// leader must stop taking writes (Patroni demotes it after retry_timeout) and no
		// other node may promote, until the members are back.
		leader, other := c.leader(), c.replica(h)
		began := c.markFault()
		for _, n := range []string{leader, other} {
			c.docker("exec", n, "sh", "-c", "kill $(cat /var/run/etcd.pid)")
		}
		demoted := c.waitReadOnly(leader)
		for _, n := range []string{leader, other} {
			c.docker("exec", "-d", n, "/ha/etcd.sh")
		}
		c.waitHealthy()
		return fmt.Sprintf("etcd on %s and %s killed: %s stopped taking writes after %v; quorum back, %s leads",
			leader, other, leader, demoted.Sub(began).Round(100*time.Millisecond), c.leader())
	}},
	{"rolling restart", func(c *haCluster, _ *faultHarness) string {
		leader := c.leader()
		var order []string
		for i := 1; i <= 3; i++ {
			if n := haContainer(i); n != leader {
				order = append(order, n)
			}
		}
		order = append(order, leader) // replicas first, as an operator does
		c.markFault()
		for _, n := range order {
			c.docker("restart", "-t", "30", n)
			c.waitNodeUp(n)
			c.waitHealthy()
		}
		return fmt.Sprintf("%s restarted in turn; %s leads", strings.Join(order, ", "), c.leader())
	}},
}

const haNetwork = "pgcoord-ha" // the nodes' own network (scripts/ha-cluster.sh)

func haContainer(i int) string { return fmt.Sprintf("pgcoord-ha-%d", i) }

// haNodeName is a container's node name: its alias on haNetwork and Patroni's member name.
func haNodeName(container string) string {
	return "node" + strings.TrimPrefix(container, "pgcoord-ha-")
}

// haCluster drives scripts/ha-cluster.sh's cluster through the Docker CLI.
type haCluster struct {
	t        *testing.T
	ctx      context.Context
	mode     string
	remedies []string  // what the test did where Patroni did not recover by itself
	faultAt  time.Time // when the last fault was injected (markFault)
}

// markFault notes that the fault is being injected now, and returns the time.
func (c *haCluster) markFault() time.Time {
	c.faultAt = time.Now()
	return c.faultAt
}

// haWaitLimit bounds a wait for the cluster: a failover takes Patroni's TTL (20 s) and a
// promotion; a rejoin, a pg_rewind and catching up.
const haWaitLimit = 3 * time.Minute

func (c *haCluster) docker(args ...string) string {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(c.ctx, haWaitLimit)
	defer cancel()
	out, err := exec.CommandContext(ctx, "docker", args...).CombinedOutput()
	if err != nil {
		c.t.Fatalf("docker %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out))
}

// pause freezes the container's processes. The cgroup freezer gives up when a process does
// not freeze in time (runc: "unable to freeze", seen while a node was busy rejoining), and
// thaws what it froze: try again, as a hypervisor's pause does not fail.
func (c *haCluster) pause(container string) {
	c.t.Helper()
	var out []byte
	var err error
	for range 10 {
		if out, err = exec.CommandContext(c.ctx, "docker", "pause", container).CombinedOutput(); err == nil {
			return
		}
		time.Sleep(300 * time.Millisecond)
	}
	c.t.Fatalf("docker pause %s: %v: %s", container, err, out)
}

type haMember struct {
	Member string `json:"Member"`
	Role   string `json:"Role"`
	State  string `json:"State"`
	TL     int    `json:"TL"`
	Lag    any    `json:"Lag in MB"`
}

// members returns Patroni's view of the cluster, asked of the first node that answers (a
// frozen node cannot be asked, a cut-off one cannot read etcd).
func (c *haCluster) members() ([]haMember, error) {
	var errs []error
	for i := 1; i <= 3; i++ {
		ctx, cancel := context.WithTimeout(c.ctx, 10*time.Second)
		out, err := exec.CommandContext(ctx, "docker", "exec", haContainer(i),
			"patronictl", "-c", "/etc/patroni.yml", "list", "-f", "json").Output()
		cancel()
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", haContainer(i), err))
			continue
		}
		var ms []haMember
		if err := json.Unmarshal(out, &ms); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w: %s", haContainer(i), err, out))
			continue
		}
		return ms, nil
	}
	return nil, errors.Join(errs...)
}

// await polls members until cond accepts them, for at most haWaitLimit.
func (c *haCluster) await(what string, cond func([]haMember) bool) {
	c.t.Helper()
	if last, err := c.poll(haWaitLimit, cond); last != nil || err != nil {
		c.logNodes()
		c.t.Fatalf("the cluster did not reach %q within %v: members %+v (%v)", what, haWaitLimit, last, err)
	}
}

// poll polls members until cond accepts them, for at most limit; on a timeout it returns
// the last members it saw, or the last error.
func (c *haCluster) poll(limit time.Duration, cond func([]haMember) bool) ([]haMember, error) {
	deadline := time.Now().Add(limit)
	var last []haMember
	var lastErr error
	for {
		ms, err := c.members()
		if err == nil && cond(ms) {
			return nil, nil
		}
		if err == nil {
			last = ms
		}
		lastErr = err
		if time.Now().After(deadline) {
			if last == nil && lastErr == nil {
				lastErr = errors.New("no answer")
			}
			return last, lastErr
		}
		time.Sleep(500 * time.Millisecond)
	}
}

func haLeaderOf(ms []haMember) string {
	for _, m := range ms {
		if m.Role == "Leader" && m.State == "running" {
			return "pgcoord-ha-" + strings.TrimPrefix(m.Member, "node")
		}
	}
	return ""
}

// waitHealthy waits for a running leader and two replicas streaming from it with no lag, one
// of them synchronous unless the cluster is asynchronous. A cluster that Patroni has not
// made whole within haRecoverLimit gets what an operator would do (logged, and reported at
// the end of the test).
func (c *haCluster) waitHealthy() {
	c.t.Helper()
	healthy := func(ms []haMember) bool {
		tl := 0
		for _, m := range ms {
			if m.Role == "Leader" && m.State == "running" {
				tl = m.TL
			}
		}
		replicas, sync := 0, 0
		for _, m := range ms {
			// "streaming", not just "running": a replica that runs but has not connected to
			// the new leader yet still shows the lag it had, and may be on the old timeline.
			if m.Role != "Leader" && m.State == "streaming" && m.TL == tl && m.Lag == float64(0) {
				replicas++
			}
			if m.Role == "Sync Standby" {
				sync++
			}
		}
		return haLeaderOf(ms) != "" && replicas == 2 && (c.mode == "async" || sync == 1)
	}
	last, err := c.poll(haRecoverLimit, healthy)
	if last == nil && err == nil {
		return
	}
	c.logNodes()
	// An operator rebuilds a member that cannot rejoin (patronictl reinit), and restarts the
	// leader's node when every member runs but the cluster is still not whole.
	leader := haLeaderOf(last)
	var did []string
	for _, m := range last {
		if leader != "" && m.Role != "Leader" && m.State != "streaming" && m.State != "running" {
			c.docker("exec", leader, "patronictl", "-c", "/etc/patroni.yml", "reinit", "pgcoord-ha", m.Member, "--force")
			did = append(did, "reinit of "+m.Member)
		}
	}
	if len(did) == 0 {
		if leader == "" {
			leader = haContainer(1)
		}
		c.docker("restart", "-t", "30", leader)
		did = append(did, "restart of "+leader)
	}
	remedy := fmt.Sprintf("Patroni did not make the cluster whole within %v (members %+v, %v): %s",
		haRecoverLimit, last, err, strings.Join(did, ", "))
	c.t.Log(remedy)
	c.remedies = append(c.remedies, remedy)
	c.await("a leader and two replicas in step", healthy)
}

// haRecoverLimit is how long the test waits for Patroni to make the cluster whole again
// before it steps in. Here a fault is mended in 10-50 s; on a machine a few times slower
// (seen in CI) in 1.5-3 minutes, and stepping in sooner only adds a failover.
const haRecoverLimit = 3 * time.Minute

// logNodes logs the end of each node's log (Patroni's and PostgreSQL's), so that a run
// that failed in CI says what the cluster did, and what a node's log cannot say: the
// machine's load, each node's connections, and whether each node's PostgreSQL answers the
// others within 3 s (a rejoining node whose rewind check cannot reach the leader's waits).
func (c *haCluster) logNodes() {
	run := func(name string, args ...string) string {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
		if err != nil {
			return fmt.Sprintf("%s (%v)", strings.TrimSpace(string(out)), err)
		}
		return strings.TrimSpace(string(out))
	}
	load, _ := os.ReadFile("/proc/loadavg")
	c.t.Logf("load average: %s", strings.TrimSpace(string(load)))
	for i := 1; i <= 3; i++ {
		from := haContainer(i)
		conns := run("docker", "exec", "-e", "PGPASSWORD=postgres", from, "psql", "-U", "postgres", "-h", "localhost", "-XAtc",
			"SELECT count(*) || ' connections, ' || count(*) FILTER (WHERE state = 'active') || ' active' FROM pg_stat_activity")
		var reach []string
		for j := 1; j <= 3; j++ {
			if j != i {
				to := haNodeName(haContainer(j))
				reach = append(reach, to+": "+run("docker", "exec", from, "pg_isready", "-h", to, "-t", "3"))
			}
		}
		c.t.Logf("%s: %s; reaches %s", from, conns, strings.Join(reach, "; "))
	}
	for i := 1; i <= 3; i++ {
		c.t.Logf("the last lines of %s's log:\n%s", haContainer(i), run("docker", "logs", "--tail", "60", haContainer(i)))
	}
}

// waitNodeUp waits until the node's Patroni, just started, says its PostgreSQL runs (the
// members' list may still show the state from before the restart).
func (c *haCluster) waitNodeUp(container string) {
	c.t.Helper()
	deadline := time.Now().Add(haWaitLimit)
	for {
		ctx, cancel := context.WithTimeout(c.ctx, 10*time.Second)
		err := exec.CommandContext(ctx, "docker", "exec", container, "curl", "-sf", "-o", "/dev/null", "http://localhost:8008/health").Run()
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			c.logNodes() // the nodes' logs say why
			c.t.Fatalf("%s: PostgreSQL not running %v after the node started: %v", container, haWaitLimit, err)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// waitMembersRunning waits until Patroni lists n members running or streaming.
func (c *haCluster) waitMembersRunning(n int) {
	c.t.Helper()
	c.await(fmt.Sprintf("%d members running", n), func(ms []haMember) bool {
		running := 0
		for _, m := range ms {
			if m.State == "streaming" || m.State == "running" {
				running++
			}
		}
		return running == n && haLeaderOf(ms) != ""
	})
}

func (c *haCluster) leader() string {
	c.t.Helper()
	var leader string
	c.await("a leader", func(ms []haMember) bool {
		leader = haLeaderOf(ms)
		return leader != ""
	})
	return leader
}

// replica returns one of the two replicas, chosen by the run's seed.
func (c *haCluster) replica(h *faultHarness) string {
	leader := c.leader()
	var replicas []string
	for i := 1; i <= 3; i++ {
		if n := haContainer(i); n != leader {
			replicas = append(replicas, n)
		}
	}
	return replicas[h.rng.IntN(len(replicas))]
}

// waitNewLeader waits until a node other than old leads, and says how long it took. If
// none does within haRecoverLimit, it says so (a remedy: the caller then ends the fault, as
// an operator would) and returns "none": Patroni in synchronous mode promotes only a replica it
// knows to be in sync, and waits rather than promote another — its rule, not pgcoord's.
func (c *haCluster) waitNewLeader(old string) (string, time.Duration) {
	c.t.Helper()
	began := time.Now()
	var next string
	last, err := c.poll(haRecoverLimit, func(ms []haMember) bool {
		next = haLeaderOf(ms)
		return next != "" && next != old
	})
	if last != nil || err != nil {
		c.logNodes()
		remedy := fmt.Sprintf("no node took over from %s within %v (members %+v, %v): the fault was ended", old, haRecoverLimit, last, err)
		c.t.Log(remedy)
		c.remedies = append(c.remedies, remedy)
		return "none", time.Since(began).Round(100 * time.Millisecond)
	}
	return next, time.Since(began).Round(100 * time.Millisecond)
}

// waitReadOnly waits until the node's server, asked directly as a client would, no longer
// takes writes (it refuses connections, or answers as a standby), and returns when.
func (c *haCluster) waitReadOnly(container string) time.Time {
	c.t.Helper()
	addr := strings.SplitN(c.docker("port", container, "5432/tcp"), "\n", 2)[0]
	url := "postgres://postgres:postgres@" + addr + "/postgres?connect_timeout=2&sslmode=disable"
	deadline := time.Now().Add(haWaitLimit)
	for {
		ctx, cancel := context.WithTimeout(c.ctx, 3*time.Second)
		var standby bool
		conn, err := pgx.Connect(ctx, url)
		if err == nil {
			err = conn.QueryRow(ctx, "SELECT pg_is_in_recovery()").Scan(&standby)
			_ = conn.Close(ctx)
		}
		cancel()
		if err != nil || standby {
			return time.Now()
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("%s still takes writes %v after it was cut off from its peers", container, haWaitLimit)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// timeline returns the leader's timeline.
func (c *haCluster) timeline() int {
	c.t.Helper()
	var tl int
	c.await("a leader", func(ms []haMember) bool {
		for _, m := range ms {
			if m.Role == "Leader" && m.State == "running" {
				tl = m.TL
				return true
			}
		}
		return false
	})
	return tl
}
