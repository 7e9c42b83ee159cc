//go:build unix

package workerproc_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pgcoord/pgcoord/internal/workerproc"
)

// The roles of this test binary's worker processes. None touches the database: the pool
// connects on first use only.
var roles = map[string]workerproc.Role{
	// count says "line 1" .. "line N", N its parameter.
	"count": func(_ context.Context, w *workerproc.Worker) error {
		n, err := strconv.Atoi(w.Param("N"))
		if err != nil {
			return err
		}
		for i := 1; i <= n; i++ {
			w.Say("line %d", i)
		}
		return nil
	},
	// echo says "ready", waits for "go" and says "done".
	"echo": func(_ context.Context, w *workerproc.Worker) error {
		w.Say("ready %s", w.Param("NAME"))
		if err := w.Await("go"); err != nil {
			return err
		}
		w.Say("done")
		return nil
	},
	// wait says "ready" and, when its context ends, says why and returns.
	"wait": func(ctx context.Context, w *workerproc.Worker) error {
		w.Say("ready")
		<-ctx.Done()
		w.Say("ended %v", ctx.Err())
		return nil
	},
	// parent starts a "stubborn" worker of its own, says "child <pid>" and waits.
	"parent": func(ctx context.Context, w *workerproc.Worker) error {
		child, err := workerproc.Start(workerproc.Spec{Name: "child", Role: "stubborn"})
		if err != nil {
			return err
		}
		if _, err := child.Expect(wait, "ready"); err != nil {
			return err
		}
		w.Say("child %d", child.Pid())
		<-ctx.Done()
		return child.Stop(0)
	},
	// stubborn says "ready" and sleeps through the end of its context.
	"stubborn": func(_ context.Context, w *workerproc.Worker) error {
		w.Say("ready")
		time.Sleep(workerproc.Lifetime)
		return nil
	},
}

func TestMain(m *testing.M) {
	workerproc.Main(roles)
	os.Exit(m.Run())
}

const wait = 30 * time.Second

func start(t *testing.T, name, role string, params map[string]string) *workerproc.Proc {
	t.Helper()
	p, err := workerproc.Start(workerproc.Spec{Name: name, Role: role, Params: params})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Stop(0); err != nil {
			t.Error(err)
		}
	})
	return p
}

// Every line arrives, in order, though the parent reads them only after the worker has
// written them all and exited; the role's parameter reaches it.
func TestLinesArriveInOrder(t *testing.T) {
	const n = 20000
	p := start(t, "counter", "count", map[string]string{"N": strconv.Itoa(n)})
	if err := p.Wait(wait); err != nil {
		t.Fatalf("exit: %v", err)
	}
	for i := 1; i <= n; i++ {
		want := fmt.Sprintf("line %d", i)
		l, err := p.Expect(wait, want)
		if err != nil {
			t.Fatal(err)
		}
		if l != want {
			t.Fatalf("line %d is %q", i, l)
		}
	}
	if _, err := p.Expect(wait, ""); err == nil || !strings.Contains(err.Error(), "exited") {
		t.Errorf("after the last line: %v, want an error saying the worker exited", err)
	}
}

func TestInstructions(t *testing.T) {
	p := start(t, "echo", "echo", map[string]string{"NAME": "e1"})
	if _, err := p.Expect(wait, "ready e1"); err != nil {
		t.Fatal(err)
	}
	if err := p.Send("go"); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Expect(wait, "done"); err != nil {
		t.Fatal(err)
	}
	if err := p.Wait(wait); err != nil {
		t.Errorf("exit: %v, want 0", err)
	}
}

// A role's error is said as an "error" line, and the process exits with 1.
func TestRoleErrorIsSaidAndExitsNonZero(t *testing.T) {
	p := start(t, "echo", "echo", nil)
	if _, err := p.Expect(wait, "ready"); err != nil {
		t.Fatal(err)
	}
	if err := p.Send("halt"); err != nil {
		t.Fatal(err)
	}
	l, err := p.Expect(wait, "error")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(l, `got "halt" on stdin, want "go"`) {
		t.Errorf("error line %q", l)
	}
	var exit *exec.ExitError
	if err := p.Wait(wait); !errors.As(err, &exit) || exit.ExitCode() != 1 || !strings.Contains(err.Error(), l) {
		t.Errorf("exit: %v, want exit status 1 with the error line %q", err, l)
	}

	unknown := start(t, "nobody", "no-such-role", nil)
	if l, err := unknown.Expect(wait, `error unknown worker role "no-such-role"`); err != nil {
		t.Errorf("%v (%q)", err, l)
	}
}

// A worker whose lifetime passes before its parent stops it ends its role's context and
// exits with an error that says so: a parent that needed it longer must not mistake its
// silence for a quiet run.
func TestLifetimeEndsTheWorkerWithAnError(t *testing.T) {
	p, err := workerproc.Start(workerproc.Spec{Name: "short", Role: "wait", Lifetime: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Stop(0) })
	if _, err := p.Expect(wait, "ready"); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Expect(wait, "ended context deadline exceeded"); err != nil {
		t.Fatal(err)
	}
	var exit *exec.ExitError
	if err := p.Wait(wait); !errors.As(err, &exit) || exit.ExitCode() != 1 || !strings.Contains(err.Error(), "lifetime passed") {
		t.Errorf("exit: %v, want exit status 1 saying the lifetime passed", err)
	}
}

// Stop on a paused worker continues it and closes its stdin, which ends its role's
// context: the role finishes on its own.
func TestStopEndsThePausedWorkersContext(t *testing.T) {
	p := start(t, "waiter", "wait", nil)
	if _, err := p.Expect(wait, "ready"); err != nil {
		t.Fatal(err)
	}
	if err := p.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	if err := p.Stop(wait); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Expect(wait, "ended context canceled"); err != nil {
		t.Fatal(err)
	}
	if err := p.Wait(0); err != nil {
		t.Errorf("exit: %v, want 0 (the role returned)", err)
	}
}

// A worker that does not stop when its stdin closes is killed after the grace period.
func TestStopKillsAfterGrace(t *testing.T) {
	p := start(t, "stubborn", "stubborn", nil)
	if _, err := p.Expect(wait, "ready"); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	if err := p.Stop(200 * time.Millisecond); err != nil {
		t.Fatal(err)
	}
	var exit *exec.ExitError
	if err := p.Wait(0); !errors.As(err, &exit) || exit.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Errorf("exit: %v, want killed", err)
	}
	t.Logf("stopped in %v", time.Since(began))
}

// A group reads the lines of several workers together, says which worker said each, and
// turns an "error" line into an error.
func TestGroup(t *testing.T) {
	var procs []*workerproc.Proc
	for i := range 3 {
		name := "e" + strconv.Itoa(i)
		procs = append(procs, start(t, name, "echo", map[string]string{"NAME": name}))
	}
	g := workerproc.NewGroup(procs...)
	seen := map[string]bool{}
	for range procs {
		l, err := g.Next(wait, "ready")
		if err != nil {
			t.Fatal(err)
		}
		if l.Text != "ready "+l.Proc.Name() || seen[l.Proc.Name()] {
			t.Fatalf("line %q from %s (seen: %v)", l.Text, l.Proc.Name(), seen)
		}
		seen[l.Proc.Name()] = true
	}
	if err := procs[0].Send("go"); err != nil {
		t.Fatal(err)
	}
	if l, err := g.Next(wait, "done"); err != nil || l.Proc != procs[0] {
		t.Fatalf("done from %v: %v", l.Proc, err)
	}
	g.Send("stop")
	_, err := g.Next(wait, "done")
	if err == nil || !strings.Contains(err.Error(), `got "stop" on stdin`) {
		t.Errorf("after a wrong instruction: %v, want the worker's error", err)
	}
	if _, err := g.Next(100*time.Millisecond, "nothing"); err == nil {
		t.Error("Next found a line nobody said")
	}
}

// On Linux the kernel kills a worker whose parent dies without stopping it (a test binary
// killed mid-run), even one that ignores the end of its stdin.
func TestWorkerDiesWithItsParent(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the parent-death signal is Linux's; elsewhere a worker ends with its stdin or its Lifetime")
	}
	p := start(t, "parent", "parent", nil)
	l, err := p.Expect(wait, "child ")
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimPrefix(l, "child "))
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(wait)
	for alive(pid) {
		if time.Now().After(deadline) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			t.Fatalf("worker %d still alive %v after its parent was killed", pid, wait)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// alive says whether process pid exists and is not a zombie.
func alive(pid int) bool {
	if syscall.Kill(pid, 0) != nil {
		return false
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// The state follows the command name, which is in parentheses.
	fields := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
	return len(fields) > 0 && fields[0] != "Z"
}
