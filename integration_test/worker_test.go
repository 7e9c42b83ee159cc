//go:build unix

package integration_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/internal/pgconfig"
	"github.com/pgcoord/pgcoord/internal/pgtest"
)

// Worker processes. A test that needs real processes — to stop one with SIGSTOP (a real
// GC pause, not a simulation), kill one with SIGKILL, or run holders that share nothing but
// the database — re-runs its own test binary with -test.run=^TestWorkerProcess$ and
// PGCOORD_TEST_WORKER=1 (the pattern of the standard library's os/exec tests).
// TestWorkerProcess then runs the role named by PGCOORD_TEST_WORKER_ROLE, connected to the
// test's database and schema, and exits.
//
// A worker talks with the test by lines: it writes what it did on stdout and reads
// instructions on stdin. Register a role in workerRoles from an init function.

// Environment of a worker process.
const (
	envWorker       = "PGCOORD_TEST_WORKER"        // "1" in a worker process
	envWorkerRole   = "PGCOORD_TEST_WORKER_ROLE"   // the key of workerRoles to run
	envWorkerURL    = "PGCOORD_TEST_WORKER_URL"    // the database
	envWorkerSchema = "PGCOORD_TEST_WORKER_SCHEMA" // the test's schema (search_path)
	envWorkerParam  = "PGCOORD_TEST_WORKER_P_"     // prefix of the role's parameters
)

// workerLifetime bounds a worker process's own work, so an orphan cannot linger. Time
// spent stopped counts too, which is fine: tests stop workers for well under a second.
const workerLifetime = 2 * time.Minute

// workerRoles maps a role name to the function a worker process runs. A role returns nil
// after saying what it did; an error is printed as "error <message>" and exits with 1.
var workerRoles = map[string]func(ctx context.Context, w *workerEnv) error{}

// workerEnv is what a role works with inside the worker process.
type workerEnv struct {
	// Pool connects to the test's database with the test's schema as search_path.
	Pool *pgxpool.Pool
	in   *bufio.Scanner
	mu   sync.Mutex
}

// Param returns the role parameter name (given to startWorker).
func (w *workerEnv) Param(name string) string { return os.Getenv(envWorkerParam + name) }

// Say writes one line to the test.
func (w *workerEnv) Say(format string, args ...any) {
	w.mu.Lock()
	defer w.mu.Unlock()
	fmt.Fprintf(os.Stdout, format+"\n", args...)
}

// Await reads the next line from the test and returns an error unless it is want.
func (w *workerEnv) Await(want string) error {
	if !w.in.Scan() {
		return fmt.Errorf("stdin closed (err %v) while waiting for %q", w.in.Err(), want)
	}
	if got := w.in.Text(); got != want {
		return fmt.Errorf("got %q on stdin, want %q", got, want)
	}
	return nil
}

// TestWorkerProcess is not a test: it is the entry point of worker processes, and returns at
// once in a normal test run.
func TestWorkerProcess(t *testing.T) {
	if os.Getenv(envWorker) != "1" {
		return
	}
	// A worker exits here, never through the testing package: it prints nothing but its own
	// lines, and its exit code is its verdict.
	err := runWorker()
	if err != nil {
		fmt.Fprintf(os.Stdout, "error %v\n", strings.ReplaceAll(err.Error(), "\n", " "))
		os.Exit(1)
	}
	os.Exit(0)
}

func runWorker() error {
	role, ok := workerRoles[os.Getenv(envWorkerRole)]
	if !ok {
		return fmt.Errorf("unknown worker role %q", os.Getenv(envWorkerRole))
	}
	ctx, cancel := context.WithTimeout(context.Background(), workerLifetime)
	defer cancel()
	cfg, err := pgconfig.Pool(os.Getenv(envWorkerURL), pgconfig.Options{
		AppName: "pgcoord-test-worker", Schema: os.Getenv(envWorkerSchema), MaxConns: 8,
	})
	if err != nil {
		return err
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	return role(ctx, &workerEnv{Pool: pool, in: bufio.NewScanner(os.Stdin)})
}

// workerProc is a running worker process, seen from the test.
type workerProc struct {
	name    string
	cmd     *exec.Cmd
	stdin   io.WriteCloser
	out     *lineWriter
	errOut  *lineWriter
	done    chan struct{} // closed when the process has exited and its output is read
	waitErr error         // cmd.Wait's result, valid after done
}

// startWorker starts a worker process running role against the database url and schema,
// with params as its role parameters. The process is always gone when t ends: t's cleanup
// continues it (in case it is stopped), kills it and waits for it, bounded.
func startWorker(t testing.TB, name, role, url, schema string, params map[string]string) (*workerProc, error) {
	if pgtest.BehindPooler() && url == pgtest.URL(t) {
		url = pgtest.PoolerURL(t, schema) // in pooler mode the workers go through PgBouncer too
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestWorkerProcess$", "-test.count=1",
		fmt.Sprintf("-test.timeout=%v", workerLifetime+30*time.Second))
	cmd.Env = append(os.Environ(),
		envWorker+"=1", envWorkerRole+"="+role, envWorkerURL+"="+url, envWorkerSchema+"="+schema)
	for k, v := range params {
		cmd.Env = append(cmd.Env, envWorkerParam+k+"="+v)
	}
	// Under -race a process sleeps 1s at exit (atexit_sleep_ms) unless told otherwise.
	if gorace := os.Getenv("GORACE"); !strings.Contains(gorace, "atexit_sleep_ms") {
		cmd.Env = append(cmd.Env, "GORACE="+strings.TrimSpace(gorace+" atexit_sleep_ms=0"))
	}
	setWorkerDeathSignal(cmd)
	p := &workerProc{name: name, cmd: cmd, out: newLineWriter(), errOut: newLineWriter(), done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p.out, p.errOut
	// Bounds Wait if the process is gone but something still holds its output open.
	cmd.WaitDelay = 5 * time.Second
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	p.stdin = stdin
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start worker %s: %w", name, err)
	}
	go func() {
		p.waitErr = cmd.Wait()
		p.out.close()
		p.errOut.close()
		close(p.done)
	}()
	t.Cleanup(func() {
		_ = p.stdin.Close()
		if p.exited() {
			return
		}
		_ = syscall.Kill(cmd.Process.Pid, syscall.SIGCONT) // a stopped process must run to die cleanly
		_ = cmd.Process.Kill()
		select {
		case <-p.done:
		case <-time.After(15 * time.Second):
			t.Errorf("worker %s (pid %d) still there 15s after SIGKILL", name, cmd.Process.Pid)
		}
	})
	return p, nil
}

func (p *workerProc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// expect returns the worker's next line, which must start with one of prefixes, waiting at
// most d.
func (p *workerProc) expect(d time.Duration, prefixes ...string) (string, error) {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case line, ok := <-p.out.lines:
		if !ok {
			return "", fmt.Errorf("worker %s exited (%v) before saying %q; stderr: %s", p.name, p.waitErrIfDone(), prefixes, p.errOut.all())
		}
		for _, pre := range prefixes {
			if strings.HasPrefix(line, pre) {
				return line, nil
			}
		}
		return "", fmt.Errorf("worker %s said %q, want a line starting with one of %q; stderr: %s", p.name, line, prefixes, p.errOut.all())
	case <-timer.C:
		return "", fmt.Errorf("worker %s said nothing for %v, want one of %q; stderr: %s", p.name, d, prefixes, p.errOut.all())
	}
}

func (p *workerProc) waitErrIfDone() error {
	if p.exited() {
		return p.waitErr
	}
	return errors.New("still running")
}

// send writes one line to the worker's stdin.
func (p *workerProc) send(line string) error {
	if _, err := p.stdin.Write([]byte(line + "\n")); err != nil {
		return fmt.Errorf("worker %s: write %q: %w", p.name, line, err)
	}
	return nil
}

// signal sends sig to the worker process.
func (p *workerProc) signal(sig syscall.Signal) error {
	if err := syscall.Kill(p.cmd.Process.Pid, sig); err != nil {
		return fmt.Errorf("worker %s: %v: %w", p.name, sig, err)
	}
	return nil
}

// wait waits at most d for the worker to exit and returns its exit error (nil for exit 0).
func (p *workerProc) wait(d time.Duration) error {
	select {
	case <-p.done:
		return p.waitErr
	case <-time.After(d):
		return fmt.Errorf("worker %s did not exit within %v; stderr: %s", p.name, d, p.errOut.all())
	}
}

// lineWriter collects a process's output and hands out its complete lines, in order, on
// lines — none is dropped, however far behind the reader is — and closes lines after the
// last one once the process has exited.
type lineWriter struct {
	mu      sync.Mutex
	more    *sync.Cond // pending grew, or closed was set
	partial []byte
	pending []string
	closed  bool
	buf     strings.Builder
	lines   chan string
}

func newLineWriter() *lineWriter {
	w := &lineWriter{lines: make(chan string, 64)}
	w.more = sync.NewCond(&w.mu)
	go w.pump()
	return w
}

func (w *lineWriter) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(b)
	w.partial = append(w.partial, b...)
	for {
		i := bytes.IndexByte(w.partial, '\n')
		if i < 0 {
			break
		}
		w.pending = append(w.pending, string(w.partial[:i]))
		w.partial = w.partial[i+1:]
	}
	w.more.Broadcast()
	return len(b), nil
}

// pump moves pending lines to the channel, so that a slow reader never blocks the process.
func (w *lineWriter) pump() {
	for {
		w.mu.Lock()
		for len(w.pending) == 0 && !w.closed {
			w.more.Wait()
		}
		if len(w.pending) == 0 {
			w.mu.Unlock()
			close(w.lines)
			return
		}
		line := w.pending[0]
		w.pending = w.pending[1:]
		w.mu.Unlock()
		w.lines <- line
	}
}

// close ends the output (the process has exited): a last unterminated line still counts.
func (w *lineWriter) close() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.partial) > 0 {
		w.pending = append(w.pending, string(w.partial))
		w.partial = nil
	}
	w.closed = true
	w.more.Broadcast()
}

func (w *lineWriter) all() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	s := w.buf.String()
	if len(s) > 4000 {
		s = "..." + s[len(s)-4000:]
	}
	return s
}
