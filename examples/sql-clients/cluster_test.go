package sqlclients

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/internal/pgtest"
)

// cronCluster is a PostgreSQL server of the test's own, with pg_cron loaded: pg_cron needs
// shared_preload_libraries, which only a restart applies, so the tests never touch the
// shared test server for it. It runs from this machine's server binaries
// (PGCOORD_TEST_PG_BINDIR, else `pg_config --bindir`) as the postgres user when the test
// runs as root (PostgreSQL refuses to run as root), on loopback, in a temporary directory.
//
// Its database coord belongs to the role app (not a superuser), which may schedule pg_cron
// jobs (they run as app) and whose search_path in coord is the schema coord, owned by app,
// where pgcoord is to be installed.
type cronCluster struct {
	t    *testing.T
	bin  string // the server binaries
	root string // the data directory, the socket and the log are in it
	port int
}

// startCronCluster starts a cronCluster, stopped and removed when t ends.
func startCronCluster(t *testing.T) *cronCluster {
	t.Helper()
	c := &cronCluster{t: t, bin: serverBinaries(t)}
	var err error
	if c.root, err = os.MkdirTemp("", "pgcoord-cron-"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(c.root) })
	if os.Geteuid() == 0 {
		if out, err := exec.Command("chown", "postgres:", c.root).CombinedOutput(); err != nil {
			t.Fatalf("chown %s: %v\n%s", c.root, err, out)
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c.port = l.Addr().(*net.TCPAddr).Port
	l.Close()

	data := filepath.Join(c.root, "data")
	c.server("initdb", "-D", data, "-U", "postgres", "-A", "trust", "-E", "UTF8", "-N")
	conf := fmt.Sprintf(`
listen_addresses = '127.0.0.1'
port = %d
unix_socket_directories = '%s'
max_connections = 20
shared_buffers = '16MB'
fsync = off
shared_preload_libraries = 'pg_cron'
cron.database_name = 'coord'
cron.host = '127.0.0.1'
`, c.port, c.root)
	if err := appendFile(filepath.Join(data, "postgresql.conf"), conf); err != nil {
		t.Fatal(err)
	}
	log := filepath.Join(c.root, "server.log")
	t.Cleanup(func() {
		if t.Failed() {
			if b, err := os.ReadFile(log); err == nil {
				t.Logf("server log:\n%s", b[max(0, len(b)-8000):])
			}
		}
		_, _ = c.run("pg_ctl", "-D", data, "-m", "immediate", "-w", "stop")
	})
	c.server("pg_ctl", "-D", data, "-l", log, "-w", "-t", "60", "start")

	c.psql("postgres", "postgres", nil, "CREATE ROLE app LOGIN", "CREATE DATABASE coord OWNER app")
	c.psql("postgres", "coord", nil,
		"CREATE EXTENSION pg_cron",
		"GRANT USAGE ON SCHEMA cron TO app",
		"CREATE SCHEMA coord AUTHORIZATION app",
		"ALTER ROLE app IN DATABASE coord SET search_path = coord")
	return c
}

// serverBinaries returns the directory of the server binaries, or skips t (fails it in CI)
// when there is none, or no pg_cron for them.
func serverBinaries(t *testing.T) string {
	t.Helper()
	bin := os.Getenv("PGCOORD_TEST_PG_BINDIR")
	if bin == "" {
		out, err := exec.Command("pg_config", "--bindir").Output()
		if err != nil {
			missing(t, "PostgreSQL's server binaries (set PGCOORD_TEST_PG_BINDIR)", err)
		}
		bin = strings.TrimSpace(string(out))
	}
	lib, err := exec.Command(filepath.Join(bin, "pg_config"), "--pkglibdir").Output()
	if err == nil {
		_, err = os.Stat(filepath.Join(strings.TrimSpace(string(lib)), "pg_cron.so"))
	}
	if err != nil {
		missing(t, "pg_cron for the server binaries in "+bin, err)
	}
	return bin
}

// server runs one of the server binaries, as the postgres user when the test runs as root.
func (c *cronCluster) server(name string, args ...string) {
	c.t.Helper()
	if out, err := c.run(name, args...); err != nil {
		c.t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
}

func (c *cronCluster) run(name string, args ...string) ([]byte, error) {
	path := filepath.Join(c.bin, name)
	cmd := exec.Command(path, args...)
	if os.Geteuid() == 0 {
		cmd = exec.Command("runuser", append([]string{"-u", "postgres", "--", path}, args...)...)
	}
	cmd.Dir, cmd.Env = c.root, append(os.Environ(), "LC_ALL=C")
	return cmd.CombinedOutput()
}

// psql runs psql as user in database db, stopping at the first error: the statements, each
// in a transaction of its own, or else the script read from stdin.
func (c *cronCluster) psql(user, db string, stdin io.Reader, stmts ...string) {
	c.t.Helper()
	args := []string{"-X", "-q", "-v", "ON_ERROR_STOP=1", "-h", "127.0.0.1", "-p", strconv.Itoa(c.port), "-U", user, "-d", db}
	for _, s := range stmts {
		args = append(args, "-c", s)
	}
	cmd := exec.Command(filepath.Join(c.bin, "psql"), args...)
	cmd.Stdin = stdin
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		c.t.Fatalf("psql as %s: %v\n%s", user, err, out.String())
	}
}

// pool connects to database coord as user, with search_path coord.
func (c *cronCluster) pool(user string) *pgxpool.Pool {
	c.t.Helper()
	return pgtest.NewPool(c.t, fmt.Sprintf("postgres://%s@127.0.0.1:%d/coord?sslmode=disable", user, c.port), "coord")
}

func appendFile(path, text string) error {
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(text); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
