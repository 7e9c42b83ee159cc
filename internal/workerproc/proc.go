//go:build unix

package workerproc

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"
)

// Spec says which worker to start.
type Spec struct {
	// Name names the process in errors.
	Name string
	// Role is the key of the roles given to Main in the worker process.
	Role string
	// URL and Schema are the database of the worker's pool and its search_path.
	URL, Schema string
	// Params are the role's parameters (Worker.Param).
	Params map[string]string
	// Lifetime bounds the worker's work; 0 means the package's Lifetime.
	Lifetime time.Duration
}

// Proc is a running worker process, seen from its parent.
type Proc struct {
	name    string
	cmd     *exec.Cmd
	stdin   io.WriteCloser
	out     *lineWriter
	errOut  *lineWriter
	done    chan struct{} // closed when the process has exited and its output is read
	waitErr error         // cmd.Wait's result, valid after done
}

// killWait bounds the wait for a killed process to be gone.
const killWait = 15 * time.Second

// Start starts a worker process: this executable again, which runs the role of spec in
// Main. Stop it when done with it.
func Start(spec Spec) (*Proc, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), envRole+"="+spec.Role, envURL+"="+spec.URL, envSchema+"="+spec.Schema, envName+"="+spec.Name)
	if spec.Lifetime > 0 {
		cmd.Env = append(cmd.Env, envLife+"="+spec.Lifetime.String())
	}
	for k, v := range spec.Params {
		cmd.Env = append(cmd.Env, envParam+k+"="+v)
	}
	// Under the race detector a process sleeps 1s at exit unless told otherwise.
	if gorace := os.Getenv("GORACE"); !strings.Contains(gorace, "atexit_sleep_ms") {
		cmd.Env = append(cmd.Env, "GORACE="+strings.TrimSpace(gorace+" atexit_sleep_ms=0"))
	}
	setDeathSignal(cmd)
	p := &Proc{name: spec.Name, cmd: cmd, out: newLineWriter(), errOut: newLineWriter(), done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p.out, p.errOut
	// Bounds Wait if the process is gone but something still holds its output open.
	cmd.WaitDelay = 5 * time.Second
	if p.stdin, err = cmd.StdinPipe(); err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start worker %s: %w", spec.Name, err)
	}
	go func() {
		p.waitErr = cmd.Wait()
		if said := p.out.lastLine(); p.waitErr != nil && strings.HasPrefix(said, "error ") {
			p.waitErr = fmt.Errorf("%w; its last line: %s", p.waitErr, said)
		}
		p.out.close()
		p.errOut.close()
		close(p.done)
	}()
	return p, nil
}

// AppName is the application_name of the pool of the worker named name (Spec.Name): the
// server shows its connections under it in pg_stat_activity. The server keeps its first
// 63 bytes.
func AppName(name string) string { return "pgcoord-worker " + name }

// Name is the process's name (Spec.Name).
func (p *Proc) Name() string { return p.name }

// Pid is the process's id.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// Lines are p's lines on stdout, in order; the channel closes after the last one, once p
// has exited. Read a process's lines one way only: Lines, Expect or a Group.
func (p *Proc) Lines() <-chan string { return p.out.lines }

// Stderr is what p wrote to stderr (its last tailSize bytes).
func (p *Proc) Stderr() string { return p.errOut.all() }

// Expect returns p's next line, which must start with one of prefixes, waiting at most d.
func (p *Proc) Expect(d time.Duration, prefixes ...string) (string, error) {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case line, ok := <-p.Lines():
		if !ok {
			return "", fmt.Errorf("worker %s exited (%v) before saying %q%s", p.name, p.Wait(killWait), prefixes, p.stderr())
		}
		for _, pre := range prefixes {
			if strings.HasPrefix(line, pre) {
				return line, nil
			}
		}
		return "", fmt.Errorf("worker %s said %q, want a line starting with one of %q%s", p.name, line, prefixes, p.stderr())
	case <-timer.C:
		return "", fmt.Errorf("worker %s said nothing for %v, want one of %q%s", p.name, d, prefixes, p.stderr())
	}
}

// stderr is what p wrote to stderr, for an error message.
func (p *Proc) stderr() string {
	if s := strings.TrimSpace(p.Stderr()); s != "" {
		return "; its stderr: " + s
	}
	return ""
}

func (p *Proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Send writes one line to p's stdin.
func (p *Proc) Send(line string) error {
	if _, err := io.WriteString(p.stdin, line+"\n"); err != nil {
		return fmt.Errorf("worker %s: write %q: %w", p.name, line, err)
	}
	return nil
}

// Signal sends sig to p.
func (p *Proc) Signal(sig syscall.Signal) error {
	if err := syscall.Kill(p.cmd.Process.Pid, sig); err != nil {
		return fmt.Errorf("worker %s: %v: %w", p.name, sig, err)
	}
	return nil
}

// Wait waits at most d for p to exit and returns its exit error (nil for exit 0).
func (p *Proc) Wait(d time.Duration) error {
	if p.exited() {
		return p.waitErr
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-p.done:
		return p.waitErr
	case <-timer.C:
		return fmt.Errorf("worker %s did not exit within %v%s", p.name, d, p.stderr())
	}
}

// Stop ends p: it closes p's stdin (which ends its role's context), continues p if it is
// stopped, and kills it if it has not exited after grace. It returns an error only if p is
// still there well after being killed.
func (p *Proc) Stop(grace time.Duration) error {
	_ = p.stdin.Close()
	if p.exited() {
		return nil
	}
	_ = p.Signal(syscall.SIGCONT) // a stopped process must run to exit
	if p.Wait(grace) == nil || p.exited() {
		return nil
	}
	_ = p.cmd.Process.Kill()
	select {
	case <-p.done:
		return nil
	case <-time.After(killWait):
		return fmt.Errorf("worker %s (pid %d) still there %v after SIGKILL", p.name, p.Pid(), killWait)
	}
}

// Group is several processes whose lines are read together.
type Group struct {
	procs []*Proc
	lines chan Line
}

// Line is a line said by one process of a group.
type Line struct {
	Proc *Proc
	Text string
}

// NewGroup reads the lines of procs together; read them with Next only, not with Expect.
func NewGroup(procs ...*Proc) *Group {
	g := &Group{procs: procs, lines: make(chan Line)}
	for _, p := range procs {
		go func() {
			for l := range p.Lines() {
				g.lines <- Line{p, l}
			}
		}()
	}
	return g
}

// Next returns the next line of any process of g that starts with prefix, skipping other
// lines and waiting at most d; a line starting with "error" is an error.
func (g *Group) Next(d time.Duration, prefix string) (Line, error) {
	timer := time.NewTimer(d)
	defer timer.Stop()
	for {
		select {
		case l := <-g.lines:
			if strings.HasPrefix(l.Text, "error") {
				return l, fmt.Errorf("worker %s: %s%s", l.Proc.name, l.Text, l.Proc.stderr())
			}
			if strings.HasPrefix(l.Text, prefix) {
				return l, nil
			}
		case <-timer.C:
			return Line{}, fmt.Errorf("no worker said %q within %v", prefix, d)
		}
	}
}

// Send writes line to every process of g that is still running.
func (g *Group) Send(line string) {
	for _, p := range g.procs {
		_ = p.Send(line) // a process that is gone (killed) needs no instruction
	}
}
