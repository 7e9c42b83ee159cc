// Package exampletest runs the tests of the example programs under examples/: each test gets
// a fresh migrated schema (package pgtest), and can run the example's own main function in a
// process of its own — the test binary, re-run — the way a team would start it, with
// PGCOORD_DATABASE_URL pointing at the test's schema, and stop it with SIGTERM.
package exampletest

import (
	"bytes"
	"context"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/internal/pgtest"
)

// envRunMain, set in a re-run test binary, makes Main run the example's main function
// instead of the tests.
const envRunMain = "PGCOORD_EXAMPLE_RUN_MAIN"

// EnvDatabaseURL is the variable every example's main reads its database from.
const EnvDatabaseURL = "PGCOORD_DATABASE_URL"

// Main runs the package's tests (see pgtest.Main), or, in a process started by StartMain or
// RunMain, the example's main function. Call it from TestMain:
//
//	func TestMain(m *testing.M) { exampletest.Main(m, main) }
func Main(m *testing.M, main func()) {
	if os.Getenv(envRunMain) != "" {
		main()
		os.Exit(0)
	}
	pgtest.Main(m)
}

// Process is an example's main running in a process of its own.
type Process struct {
	cmd  *exec.Cmd
	out  bytes.Buffer // stdout and stderr, read only once the process has exited
	done chan struct{}
}

// DatabaseURL returns a connection string for the test database whose search_path is the
// schema of pool (a pool from pgtest.Pool): what a test hands an example's main.
func DatabaseURL(t testing.TB, pool *pgxpool.Pool) string {
	t.Helper()
	u, err := url.Parse(pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("search_path", pool.Config().ConnConfig.RuntimeParams["search_path"])
	u.RawQuery = q.Encode()
	return u.String()
}

// StartMain starts the example's main in a new process with env (KEY=value entries) added
// to the environment, from which PGCOORD_DATABASE_URL is removed unless env sets it. The
// process is killed when t ends if it still runs.
func StartMain(t testing.TB, env ...string) *Process {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, EnvDatabaseURL+"=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, envRunMain+"=1")
	cmd.Env = append(cmd.Env, env...)
	return Start(t, cmd)
}

// Start starts cmd (an example run some other way: a script, say) as a Process whose
// standard output and error it keeps. The process is killed when t ends if it still runs.
func Start(t testing.TB, cmd *exec.Cmd) *Process {
	t.Helper()
	p := &Process{cmd: cmd, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = &p.out, &p.out
	if err := cmd.Start(); err != nil {
		t.Fatalf("exampletest: start %s: %v", cmd.Path, err)
	}
	go func() {
		_ = cmd.Wait() // the exit code is in cmd.ProcessState
		close(p.done)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-p.done
	})
	return p
}

// RunMain runs the example's main to its end (see StartMain), at most pgtest.WaitLimit,
// and returns its exit code and its output (standard output and error).
func RunMain(t testing.TB, env ...string) (code int, output string) {
	t.Helper()
	return StartMain(t, env...).Wait(t)
}

// Pid returns the process's id.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Signal sends the process sig.
func (p *Process) Signal(sig os.Signal) error { return p.cmd.Process.Signal(sig) }

// Stop sends the process SIGTERM and waits, at most pgtest.WaitLimit, for it to exit. It
// fails t unless the process exits with code 0.
func (p *Process) Stop(t testing.TB) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatalf("exampletest: SIGTERM: %v", err)
	}
	if code, output := p.Wait(t); code != 0 {
		t.Fatalf("exampletest: main exited with code %d after SIGTERM; output:\n%s", code, output)
	}
}

// Wait waits, at most pgtest.WaitLimit, for the process to exit, and returns its exit code
// and its output (standard output and error).
func (p *Process) Wait(t testing.TB) (code int, output string) {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(pgtest.WaitLimit):
		_ = p.cmd.Process.Kill()
		<-p.done
		t.Fatalf("exampletest: %s did not exit within %v; output:\n%s", p.cmd.Path, pgtest.WaitLimit, p.out.String())
	}
	return p.cmd.ProcessState.ExitCode(), p.out.String()
}

// WaitFor polls cond until it reports true, failing t if that takes longer than
// pgtest.WaitLimit or cond returns an error.
func WaitFor(t testing.TB, what string, cond func(ctx context.Context) (bool, error)) {
	t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(pgtest.WaitLimit)
	for {
		ok, err := cond(ctx)
		if err != nil {
			t.Fatalf("exampletest: waiting for %s: %v", what, err)
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("exampletest: %s: not within %v", what, pgtest.WaitLimit)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Count runs query, which must return one integer, on pool.
func Count(t testing.TB, pool *pgxpool.Pool, query string, args ...any) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), query, args...).Scan(&n); err != nil {
		t.Fatalf("exampletest: %s: %v", query, err)
	}
	return n
}
