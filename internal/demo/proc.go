//go:build unix

package demo

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/internal/pgconfig"
)

// Worker processes. The demo's replicas and workers are real processes: the demo re-runs its
// own executable with PGCOORD_DEMO_ROLE set, and WorkerMain, called first in main, runs
// that role instead of the demo. So a pause is a real SIGSTOP and a crash a real SIGKILL.
//
// A worker and the demo talk by lines: the worker says what it did on stdout and reads
// instructions on stdin. A worker whose stdin closes (the demo is gone) stops.

// Environment of a worker process.
const (
	envRole   = "PGCOORD_DEMO_ROLE"   // the key of roles to run
	envURL    = "PGCOORD_DEMO_URL"    // the database
	envSchema = "PGCOORD_DEMO_SCHEMA" // the demo's schema (search_path)
	envParam  = "PGCOORD_DEMO_P_"     // prefix of the role's parameters
)

// workerLifetime bounds a worker's life, so an orphan never lingers.
const workerLifetime = 2 * time.Minute

// stepTimeout bounds every wait of the demo for a worker.
const stepTimeout = 30 * time.Second

// roles maps a role name to the program a worker process runs.
var roles = map[string]func(ctx context.Context, w *worker) error{
	paymentRole: paymentWorker,
	emailRole:   emailWorker,
	tenantRole:  tenantWorker,
}

// WorkerMain runs the worker role named by the environment and exits, when this process was
// started by the demo as a worker; otherwise it returns at once. Call it first in main (and
// in TestMain of tests that run the demo).
func WorkerMain() {
	role := os.Getenv(envRole)
	if role == "" {
		return
	}
	if err := runWorker(role); err != nil {
		fmt.Printf("error %s\n", strings.ReplaceAll(err.Error(), "\n", " "))
		os.Exit(1)
	}
	os.Exit(0)
}

func runWorker(role string) error {
	fn, ok := roles[role]
	if !ok {
		return fmt.Errorf("unknown demo role %q", role)
	}
	ctx, cancel := context.WithTimeout(context.Background(), workerLifetime)
	defer cancel()
	cfg, err := pgconfig.Pool(os.Getenv(envURL), pgconfig.Options{
		AppName: "pgcoord-demo-" + role, Schema: os.Getenv(envSchema), MaxConns: 4,
	})
	if err != nil {
		return err
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	w := &worker{pool: pool, in: make(chan string)}
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	go func() { // stdin: instructions; its end stops the worker
		sc := bufio.NewScanner(os.Stdin)
		for sc.Scan() {
			select {
			case w.in <- sc.Text():
			case <-ctx.Done():
				return
			}
		}
		stop()
	}()
	return fn(ctx, w)
}

// worker is what a role works with inside a worker process.
type worker struct {
	pool *pgxpool.Pool
	in   chan string
	mu   sync.Mutex
}

// param returns the role parameter name.
func (w *worker) param(name string) string { return os.Getenv(envParam + name) }

// say writes one line to the demo.
func (w *worker) say(format string, args ...any) {
	w.mu.Lock()
	defer w.mu.Unlock()
	fmt.Fprintf(os.Stdout, format+"\n", args...)
}

// await waits for the instruction want.
func (w *worker) await(ctx context.Context, want string) error {
	select {
	case got := <-w.in:
		if got != want {
			return fmt.Errorf("got %q, want %q", got, want)
		}
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// proc is a running worker process, seen from the demo.
type proc struct {
	name   string
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	lines  chan string // stdout, line by line; closed when the process has exited
	mu     sync.Mutex
	stderr strings.Builder
}

// start starts a worker process running role with params, as the demo's name.
func (d *demo) start(name, role string, params map[string]string) (*proc, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), envRole+"="+role, envURL+"="+d.url, envSchema+"="+d.schema)
	for k, v := range params {
		cmd.Env = append(cmd.Env, envParam+k+"="+v)
	}
	// Under the race detector a process sleeps 1s at exit unless told otherwise.
	cmd.Env = append(cmd.Env, "GORACE="+strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
	p := &proc{name: name, cmd: cmd, lines: make(chan string, 1024)}
	cmd.Stderr = writerFunc(func(b []byte) (int, error) {
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.stderr.Write(b)
	})
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if p.stdin, err = cmd.StdinPipe(); err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	d.procs = append(d.procs, p)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			p.lines <- sc.Text()
		}
		_ = cmd.Wait()
		close(p.lines)
	}()
	return p, nil
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(b []byte) (int, error) { return f(b) }

// expect returns the next line of p, which must start with prefix.
func (p *proc) expect(prefix string) (string, error) {
	timer := time.NewTimer(stepTimeout)
	defer timer.Stop()
	select {
	case l, ok := <-p.lines:
		switch {
		case !ok:
			return "", fmt.Errorf("%s exited before saying %q%s", p.name, prefix, p.stderrText())
		case !strings.HasPrefix(l, prefix):
			return "", fmt.Errorf("%s said %q, want %q...%s", p.name, l, prefix, p.stderrText())
		}
		return l, nil
	case <-timer.C:
		return "", fmt.Errorf("%s did not say %q within %v%s", p.name, prefix, stepTimeout, p.stderrText())
	}
}

func (p *proc) stderrText() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if s := strings.TrimSpace(p.stderr.String()); s != "" {
		return "; its stderr: " + s
	}
	return ""
}

// group is several processes whose lines are read together.
type group struct {
	procs []*proc
	lines chan procLine
}

// procLine is a line said by one process of a group.
type procLine struct {
	p    *proc
	line string
}

// newGroup reads the lines of procs together.
func newGroup(procs ...*proc) *group {
	g := &group{procs: procs, lines: make(chan procLine, 1024)}
	for _, p := range procs {
		go func() {
			for l := range p.lines {
				g.lines <- procLine{p, l}
			}
		}()
	}
	return g
}

// next returns the next line of any process of g that starts with prefix, skipping other
// lines; a line starting with "error" is an error.
func (g *group) next(prefix string) (procLine, error) {
	timer := time.NewTimer(stepTimeout)
	defer timer.Stop()
	for {
		select {
		case l := <-g.lines:
			if strings.HasPrefix(l.line, "error") {
				return l, fmt.Errorf("%s: %s%s", l.p.name, l.line, l.p.stderrText())
			}
			if strings.HasPrefix(l.line, prefix) {
				return l, nil
			}
		case <-timer.C:
			return procLine{}, fmt.Errorf("no worker said %q within %v", prefix, stepTimeout)
		}
	}
}

// send writes line to every process of g that is still running.
func (g *group) send(line string) {
	for _, p := range g.procs {
		_ = p.send(line) // a process that is gone (killed) needs no instruction
	}
}

// send writes one line to p's stdin.
func (p *proc) send(line string) error {
	if _, err := io.WriteString(p.stdin, line+"\n"); err != nil {
		return fmt.Errorf("%s: write %q: %w", p.name, line, err)
	}
	return nil
}

// signal sends sig to p.
func (p *proc) signal(sig syscall.Signal) error {
	if err := p.cmd.Process.Signal(sig); err != nil {
		return fmt.Errorf("%s: %v: %w", p.name, sig, err)
	}
	return nil
}

// stop ends p: it closes p's stdin (a worker stops when it ends), and kills p if it has not
// exited after grace.
func (p *proc) stop(grace time.Duration) {
	_ = p.stdin.Close()
	_ = p.cmd.Process.Signal(syscall.SIGCONT) // a stopped process must run to exit
	timer := time.NewTimer(grace)
	defer timer.Stop()
	for {
		select {
		case _, ok := <-p.lines:
			if !ok {
				return
			}
		case <-timer.C:
			_ = p.cmd.Process.Kill()
			for range p.lines {
			}
			return
		}
	}
}
