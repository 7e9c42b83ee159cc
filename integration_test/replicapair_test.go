package integration_test

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/internal/pgconfig"
	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/pgcoord"
)

// A replica pair: a primary and a streaming standby built from it with pg_basebackup, both
// real PostgreSQL servers on loopback that the test owns, so it can stop one immediately
// (a crash), promote the other and look at what survived. They run from this machine's
// PostgreSQL binaries (PGCOORD_TEST_PG_BINDIR, else `pg_config --bindir`), as the postgres
// user when the test runs as root (PostgreSQL refuses to run as root), in a temporary
// directory removed afterwards; nothing is registered system-wide. pgcoord is installed by
// a role that is not a superuser (app, owner of the database coord), and the tests grant as
// that role.

// replicaServer is one PostgreSQL server of a replica pair.
type replicaServer struct {
	t    *testing.T
	name string // "primary" or "standby"
	bin  string
	dir  string // data directory
	port int
}

// replicaPair is a primary and its standby, streaming.
type replicaPair struct {
	primary, standby *replicaServer
}

// replicaPairOpts configure startReplicaPair.
type replicaPairOpts struct {
	// sync makes the standby synchronous (synchronous_standby_names = '*').
	sync bool
	// syncCommit is the primary's server-wide synchronous_commit; default on.
	syncCommit string
}

// startReplicaPair starts a primary, installs pgcoord on it, builds a standby from it and
// waits until the standby streams (as a synchronous standby, with o.sync). Both servers are
// stopped and their files removed when t ends.
func startReplicaPair(t *testing.T, o replicaPairOpts) replicaPair {
	t.Helper()
	bin := pgBinDir(t)
	root, err := os.MkdirTemp("", "pgcoord-failover-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(root) })
	if os.Geteuid() == 0 {
		chownPostgres(t, root)
	}
	ports := freeLoopbackPorts(t, 2)
	p := &replicaServer{t: t, name: "primary", bin: bin, dir: filepath.Join(root, "primary"), port: ports[0]}
	s := &replicaServer{t: t, name: "standby", bin: bin, dir: filepath.Join(root, "standby"), port: ports[1]}
	pair := replicaPair{primary: p, standby: s}
	t.Cleanup(func() {
		for _, srv := range []*replicaServer{p, s} {
			if t.Failed() {
				srv.dumpLog()
			}
			srv.stopQuietly()
		}
	})

	p.run("initdb", "-D", p.dir, "-U", "postgres", "-A", "trust", "-N")
	conf := []string{
		"listen_addresses = '127.0.0.1'",
		"unix_socket_directories = '" + root + "'",
		"port = " + strconv.Itoa(p.port),
		"max_connections = 30",
		"shared_buffers = '16MB'",
	}
	if o.sync {
		conf = append(conf, "synchronous_standby_names = '*'")
	}
	if o.syncCommit != "" {
		conf = append(conf, "synchronous_commit = "+o.syncCommit)
	}
	p.appendConf(conf...)
	p.start()
	p.psql("postgres", "CREATE ROLE app LOGIN", "CREATE DATABASE coord OWNER app")
	pool := p.pool("pgcoord-failover-migrate")
	if _, err := pgcoord.Migrate(context.Background(), pool, nil); err != nil {
		t.Fatalf("migrate the primary: %v", err)
	}
	pool.Close()

	p.run("pg_basebackup", "-h", "127.0.0.1", "-p", strconv.Itoa(p.port), "-U", "postgres",
		"-D", s.dir, "-R", "-X", "stream", "-c", "fast", "-N")
	s.appendConf("port = " + strconv.Itoa(s.port))
	s.start()
	pair.waitStreaming(o.sync)
	return pair
}

// pgBinDir returns the directory of the PostgreSQL server binaries, or skips the test (fails
// it with CI set) when there is none.
func pgBinDir(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("PGCOORD_TEST_PG_BINDIR")
	if dir == "" {
		out, err := exec.Command("pg_config", "--bindir").Output()
		if err != nil {
			pgtest.Unavailable(t, fmt.Errorf("no PostgreSQL binaries for a replica pair (set PGCOORD_TEST_PG_BINDIR): pg_config: %w", err))
		}
		dir = strings.TrimSpace(string(out))
	}
	for _, b := range []string{"initdb", "pg_ctl", "pg_basebackup", "psql"} {
		if _, err := os.Stat(filepath.Join(dir, b)); err != nil {
			pgtest.Unavailable(t, fmt.Errorf("no %s for a replica pair: %w", b, err))
		}
	}
	return dir
}

// freeLoopbackPorts returns n distinct loopback ports nobody listens on right now.
func freeLoopbackPorts(t *testing.T, n int) []int {
	t.Helper()
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports
}

// asPostgres runs a command as the postgres user when the test runs as root (directly
// otherwise) and returns its combined output; it fails t if the command fails.
func asPostgres(t *testing.T, dir string, name string, args ...string) []byte {
	t.Helper()
	out, err := postgresCmd(dir, name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return out
}

func postgresCmd(dir, name string, args ...string) *exec.Cmd {
	var cmd *exec.Cmd
	if os.Geteuid() == 0 {
		cmd = exec.Command("runuser", append([]string{"-u", "postgres", "--", name}, args...)...)
	} else {
		cmd = exec.Command(name, args...)
	}
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	return cmd
}

// chownPostgres gives root to the postgres user (the test runs as root).
func chownPostgres(t *testing.T, root string) {
	t.Helper()
	if out, err := exec.Command("chown", "postgres:", root).CombinedOutput(); err != nil {
		t.Fatalf("chown %s: %v\n%s", root, err, out)
	}
}

// run runs one of the server binaries (initdb, pg_ctl, ...) as the postgres user.
func (s *replicaServer) run(bin string, args ...string) []byte {
	s.t.Helper()
	return asPostgres(s.t, filepath.Dir(s.dir), filepath.Join(s.bin, bin), args...)
}

func (s *replicaServer) appendConf(lines ...string) {
	s.t.Helper()
	f, err := os.OpenFile(filepath.Join(s.dir, "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		s.t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString("\n" + strings.Join(lines, "\n") + "\n"); err != nil {
		s.t.Fatal(err)
	}
}

func (s *replicaServer) logFile() string { return filepath.Join(filepath.Dir(s.dir), s.name+".log") }

// start starts the server and waits until it accepts connections (a standby: read-only
// ones).
func (s *replicaServer) start() {
	s.t.Helper()
	s.run("pg_ctl", "-D", s.dir, "-l", s.logFile(), "-w", "-t", "60", "start")
}

// stop stops the server: mode "immediate" is a crash (no shutdown checkpoint, no final
// WAL sent to standbys), "fast" a clean shutdown.
func (s *replicaServer) stop(mode string) {
	s.t.Helper()
	s.run("pg_ctl", "-D", s.dir, "-m", mode, "-w", "stop")
}

func (s *replicaServer) stopQuietly() {
	_ = postgresCmd(filepath.Dir(s.dir), filepath.Join(s.bin, "pg_ctl"), "-D", s.dir, "-m", "immediate", "-w", "stop").Run()
}

// promote ends the standby's recovery and waits until it accepts writes, on a new timeline.
func (s *replicaServer) promote() {
	s.t.Helper()
	s.run("pg_ctl", "-D", s.dir, "-w", "-t", "60", "promote")
}

// psql runs statements, each in its own transaction, as the superuser in database db.
func (s *replicaServer) psql(db string, stmts ...string) {
	s.t.Helper()
	args := []string{"-X", "-q", "-v", "ON_ERROR_STOP=1", "-h", "127.0.0.1", "-p", strconv.Itoa(s.port), "-U", "postgres", "-d", db}
	for _, st := range stmts {
		args = append(args, "-c", st)
	}
	s.run("psql", args...)
}

// pool connects to database coord as app, the non-superuser that installed pgcoord (in
// schema public).
func (s *replicaServer) pool(appName string) *pgxpool.Pool {
	s.t.Helper()
	return s.poolAs("app", appName)
}

// monitor connects to database coord as the superuser, who sees the replication and
// activity statistics of every role.
func (s *replicaServer) monitor() *pgxpool.Pool {
	s.t.Helper()
	return s.poolAs("postgres", "pgcoord-failover-monitor")
}

func (s *replicaServer) poolAs(user, appName string) *pgxpool.Pool {
	s.t.Helper()
	url := fmt.Sprintf("postgres://%s@127.0.0.1:%d/coord?sslmode=disable", user, s.port)
	cfg, err := pgconfig.Pool(url, pgconfig.Options{AppName: appName, StatementTimeout: pgtest.WaitLimit})
	if err != nil {
		s.t.Fatal(err)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		s.t.Fatal(err)
	}
	s.t.Cleanup(pool.Close)
	return pool
}

func (s *replicaServer) dumpLog() {
	b, err := os.ReadFile(s.logFile())
	if err != nil {
		return
	}
	if len(b) > 8000 {
		b = b[len(b)-8000:]
	}
	s.t.Logf("%s log (%s), last lines:\n%s", s.name, s.logFile(), bytes.TrimSpace(b))
}

// waitStreaming waits until the primary reports the standby streaming (and, with sync,
// synchronous).
func (p replicaPair) waitStreaming(sync bool) {
	p.primary.t.Helper()
	want := "async"
	if sync {
		want = "sync"
	}
	pool := p.primary.monitor()
	defer pool.Close()
	pollUntil(p.primary.t, "the standby to stream ("+want+")", func() (bool, error) {
		var n int
		err := pool.QueryRow(context.Background(),
			`SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming' AND sync_state = $1`, want).Scan(&n)
		return n == 1, err
	})
}

// waitReplayed waits until the standby has replayed everything the primary wrote so far.
func (p replicaPair) waitReplayed(primary, standby *pgxpool.Pool) {
	p.primary.t.Helper()
	var lsn string
	if err := primary.QueryRow(context.Background(), `SELECT pg_current_wal_lsn()::text`).Scan(&lsn); err != nil {
		p.primary.t.Fatal(err)
	}
	pollUntil(p.primary.t, "the standby to replay "+lsn, func() (bool, error) {
		var done bool
		err := standby.QueryRow(context.Background(), `SELECT pg_last_wal_replay_lsn() >= $1::pg_lsn`, lsn).Scan(&done)
		return done, err
	})
}

// pollUntil polls cond until it holds, for at most pgtest.WaitLimit.
func pollUntil(t *testing.T, what string, cond func() (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(pgtest.WaitLimit)
	for {
		ok, err := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("waited %v for %s (last error: %v)", pgtest.WaitLimit, what, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
