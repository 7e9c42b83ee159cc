package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/pgcoord/pgcoord/internal/base"
	"github.com/pgcoord/pgcoord/leases"
)

// Environment variables `pgcoord leases run` adds to its command's environment.
const (
	EnvFenceToken  = "PGCOORD_FENCE_TOKEN"
	EnvLeaseName   = "PGCOORD_LEASE_NAME"
	EnvLeaseHolder = "PGCOORD_LEASE_HOLDER"
)

// Exit codes of `leases run` besides the child's own.
const (
	exitCannotExecute = 126 // the command was found but could not be started
	exitNotFound      = 127 // the command was not found
)

// errGaveUp is the cause of cancelling `leases run`'s wait when --wait elapses.
var errGaveUp = errors.New("gave up waiting for the lease")

// lockedWriter serializes writes from several goroutines (the child's stderr copier, the
// renewal loop's logger, pgcoord's own messages) to one writer.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// forwardedSignal picks the signal to stop the child with for the cause of its context's
// cancellation: the signal pgcoord received (signal.NotifyContext's cause names it), else
// SIGTERM.
func forwardedSignal(cause error) syscall.Signal {
	if cause != nil && !errors.Is(cause, leases.ErrLost) {
		for _, s := range []syscall.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP} {
			if cause.Error() == s.String()+" signal received" {
				return s
			}
		}
	}
	return syscall.SIGTERM
}

// sigName names the signals `leases run` sends.
func sigName(s syscall.Signal) string {
	switch s {
	case syscall.SIGINT:
		return "SIGINT"
	case syscall.SIGTERM:
		return "SIGTERM"
	case syscall.SIGHUP:
		return "SIGHUP"
	case syscall.SIGKILL:
		return "SIGKILL"
	}
	return s.String()
}

// childResult is what became of the command `leases run` started.
type childResult struct {
	started bool
	code    int   // exit code, 128+signal if a signal killed it
	stopped error // why pgcoord stopped it (lease lost, interrupted), or nil
}

func (a *app) leasesRunCommand() *cobra.Command {
	var (
		name, holder     string
		ttl, grace, wait time.Duration
	)
	cmd := &cobra.Command{
		Use:   "run --name NAME --ttl TTL [flags] -- COMMAND [ARG...]",
		Short: "Run a command while holding a lease, renewed as it runs; stop it if the lease is lost",
		Long: `Acquire the lease --name (waiting for it, woken as soon as it is released), run COMMAND
with the lease's fence token in its environment, renew the lease every third of --ttl while
the command runs, and release it when the command exits.

The command gets stdin, stdout and stderr of pgcoord, and its environment without
pgcoord's own settings (every PGCOORD_* variable, such as the database URL), PGPASSWORD
and any variable holding the connection string or the password, plus:
  PGCOORD_FENCE_TOKEN   the grant's fence token: send it with every write the lease protects
  PGCOORD_LEASE_NAME    the lease's name
  PGCOORD_LEASE_HOLDER  the holder identity (--holder, default host/pid/random)

The command runs in a process group of its own. If the lease is lost while it runs (an
operator expired it, another holder took it over, or no renewal succeeded before the
trust deadline), pgcoord says so on stderr and stops the whole group: SIGTERM, then
SIGKILL after --grace. SIGINT, SIGTERM and SIGHUP sent to pgcoord (Ctrl-C included) are
forwarded to the group as the same signal, once; SIGKILL follows after --grace. A command
that reads from the terminal is stopped by the terminal (SIGTTIN): run non-interactive
commands.

Exit status:
  the command's         when it ran to its end holding the lease (128+N if signal N killed it)
  the command's, or 1   when pgcoord stopped it or the lease was lost before it was
                        released: never 0 then (1 if the command still exited 0)
  1                     pgcoord failed, or gave up waiting (--wait), or was interrupted
                        before the command started
  2                     usage error (missing --name, --ttl or command, bad values)
  126 / 127             the command could not be started / was not found

The command runs as pgcoord's user: it can read any file pgcoord can (a
--database-url-file, a PGPASSFILE, a service file). On Linux pgcoord hides the password
in its own command line and environment as /proc shows them, and makes itself not
dumpable, so a command without CAP_SYS_PTRACE cannot read its memory. To keep the
password from the command entirely, run the command as another user.

Fencing is what makes this safe: a command paused past its TTL keeps running until it is
stopped, and only a store that rejects lower tokens stops its late writes.`,
		Example: `  pgcoord leases run --name nightly-report --ttl 30s -- ./report.sh
  pgcoord leases run --name reindex --ttl 1m --wait 0 -- psql -c 'REINDEX TABLE big'
  pgcoord leases run --name sync --ttl 20s --holder "$HOSTNAME" -- sh -c 'exec sync --token "$PGCOORD_FENCE_TOKEN"'`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return usagef("%s: missing the command to run (after --)", cmd.CommandPath())
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			switch {
			case name == "":
				return usagef("--name is required")
			case !cmd.Flags().Changed("ttl"):
				return usagef("--ttl is required")
			case ttl < leases.MinTTL || ttl > leases.MaxTTL:
				return usagef("--ttl %v: want %v to %v", ttl, leases.MinTTL, leases.MaxTTL)
			case grace < 0:
				return usagef("--grace %v: want 0 or more", grace)
			case wait < 0:
				return usagef("--wait %v: want 0 or more", wait)
			}
			if err := check.Name("lease", name); err != nil {
				return usageError{err}
			}
			if holder == "" {
				holder = base.NewHolderID()
			} else if err := check.Name("holder", holder); err != nil {
				return usageError{err}
			}
			if _, err := exec.LookPath(args[0]); err != nil {
				fmt.Fprintf(a.errOut, "pgcoord: %s: command not found\n", args[0])
				return exitCode(exitNotFound)
			}

			// The password is in pgcoord's memory (and maybe its environment): keep it
			// from the command, which runs as the same user.
			if err := keepMemoryFromChildren(); err != nil {
				fmt.Fprintf(a.errOut, "pgcoord: warning: cannot keep the command from reading pgcoord's memory: %v\n", err)
			}
			pool, err := a.connect(ctx)
			if err != nil {
				return err
			}
			defer pool.Close()
			return a.runUnderLease(ctx, pool, runSpec{
				name: name, holder: holder, ttl: ttl, grace: grace,
				wait: wait, waitSet: cmd.Flags().Changed("wait"), argv: args,
				secrets: a.secrets(pool),
			})
		},
	}
	f := cmd.Flags()
	f.SetInterspersed(false) // everything from COMMAND on belongs to the command
	f.StringVar(&name, "name", "", "the lease's name (required)")
	f.DurationVar(&ttl, "ttl", 0, "the lease's TTL, renewed every third of it (required)")
	f.StringVar(&holder, "holder", "", "holder identity (default: host/pid/random, new per run)")
	f.DurationVar(&grace, "grace", 5*time.Second, "time between SIGTERM and SIGKILL when the command must stop (0: SIGKILL at once)")
	f.DurationVar(&wait, "wait", 0, "give up (exit 1) if the lease is not granted within this time; 0: try once (default: wait as long as it takes)")
	return cmd
}

// runSpec is what `leases run` was asked to do.
type runSpec struct {
	name, holder     string
	ttl, grace, wait time.Duration
	waitSet          bool
	argv             []string
	secrets          []string // the connection string and password, kept from the command's environment
}

// runUnderLease runs spec.argv under the lease with leases.Do and maps the outcome to an
// exit status.
func (a *app) runUnderLease(ctx context.Context, pool *pgxpool.Pool, spec runSpec) error {
	errW := a.errOut
	if _, ok := errW.(*os.File); !ok {
		errW = &lockedWriter{w: errW}
	}
	opts := &leases.DoOpts{
		AcquireOpts: leases.AcquireOpts{
			Holder:   spec.holder,
			Metadata: map[string]string{"command": filepath.Base(spec.argv[0])},
		},
		Logger: slog.New(slog.NewTextHandler(errW, &slog.HandlerOptions{Level: slog.LevelWarn})),
	}

	runCtx, cancelRun := context.WithCancelCause(ctx)
	defer cancelRun(nil)
	var (
		timer *time.Timer
		trial leases.Lease // the grant of --wait 0's single attempt
	)
	switch {
	case spec.waitSet && spec.wait == 0:
		// Try once. Do then acquires as the same holder, which gives back this very grant
		// (same token) instead of waiting.
		l, err := leases.TryAcquire(ctx, pool, spec.name, spec.ttl, &opts.AcquireOpts)
		if errors.Is(err, leases.ErrHeld) {
			return a.gaveUp(ctx, pool, spec)
		}
		if err != nil {
			return argError(err)
		}
		trial = l
	case spec.waitSet:
		timer = time.AfterFunc(spec.wait, func() { cancelRun(errGaveUp) })
		defer timer.Stop()
	}

	var res childResult
	err := leases.Do(runCtx, pool, spec.name, spec.ttl, func(fnCtx context.Context, l leases.Lease) error {
		if timer != nil && !timer.Stop() {
			return errGaveUp // --wait elapsed just as the lease was granted
		}
		if fnCtx.Err() != nil {
			return context.Cause(fnCtx)
		}
		var err error
		res, err = a.runChild(fnCtx, l, spec, errW)
		return err
	}, opts)

	if !res.started {
		if trial.Token != 0 {
			// Do never got to the grant the single attempt made: give it back.
			relCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			_ = leases.Release(relCtx, pool, trial, nil)
			cancel()
		}
		switch {
		case errors.Is(context.Cause(runCtx), errGaveUp) || errors.Is(err, errGaveUp):
			return a.gaveUp(ctx, pool, spec)
		case ctx.Err() != nil:
			return fmt.Errorf("interrupted (%v) before the command started; lease %q was not used", context.Cause(ctx), spec.name)
		case errors.Is(err, errStartFailed):
			return exitCode(exitCannotExecute) // already reported
		case err != nil:
			return argError(err)
		}
		return errors.New("the command was not started") // unreachable: fn always starts it or fails
	}

	code := res.code
	lost := errors.Is(err, leases.ErrLost)
	switch {
	case lost && !errors.Is(res.stopped, leases.ErrLost):
		// Do found the lease gone only at release: the command finished, but not all of it
		// ran under the lease.
		fmt.Fprintf(errW, "pgcoord: lease %q was no longer held when the command finished (%v): part of the command may have run without it\n", spec.name, err)
	case err != nil && !lost:
		fmt.Fprintf(errW, "pgcoord: warning: could not release lease %q: %v; it stays held until its grant expires\n", spec.name, err)
	}
	if (lost || res.stopped != nil) && code == 0 {
		code = ExitFailure // stopped or lost: never report success
	}
	if code != 0 {
		return exitCode(code)
	}
	return nil
}

// errHangup is the cause of stopping the command when pgcoord gets SIGHUP; its text is the
// one signal.NotifyContext would give, so forwardedSignal forwards SIGHUP.
var errHangup = errors.New(syscall.SIGHUP.String() + " signal received")

// minSecretMatch is the shortest password childEnviron looks for inside a variable's
// value; a shorter one only drops a variable whose whole value it is (a short string would
// match unrelated values, PATH say).
const minSecretMatch = 8

// childEnviron is the environment a command run under a lease inherits: pgcoord's without
// its own settings (PGCOORD_*: the database URL, the dashboard's and metrics' tokens),
// PGPASSWORD, and any variable holding one of secrets (the connection string, the
// password), so a command is handed the lease and not pgcoord's credentials. dropped names
// the variables of that last kind, which pgcoord mentions.
func childEnviron(env, secrets []string) (out, dropped []string) {
	out = make([]string, 0, len(env))
	for _, kv := range env {
		if strings.HasPrefix(kv, "PGCOORD_") || strings.HasPrefix(kv, "PGPASSWORD=") {
			continue
		}
		k, v, _ := strings.Cut(kv, "=")
		if holdsAny(v, secrets) {
			dropped = append(dropped, k)
			continue
		}
		out = append(out, kv)
	}
	return out, dropped
}

// secrets are the connection string, when it holds a password, and the password pool
// connects with.
func (a *app) secrets(pool *pgxpool.Pool) []string {
	s := []string{pool.Config().ConnConfig.Password}
	if c := a.connString(); connStringHasPassword(c) {
		s = append(s, c)
	}
	return s
}

// holdsAny reports whether v holds one of secrets.
func holdsAny(v string, secrets []string) bool {
	for _, s := range secrets {
		switch {
		case s == "":
		case v == s:
			return true
		case len(s) >= minSecretMatch && strings.Contains(v, s):
			return true
		}
	}
	return false
}

// errStartFailed means the command could not be started; runChild has said why.
var errStartFailed = errors.New("the command could not be started")

// runChild starts the command with the lease in its environment and waits for it. When
// ctx ends (lease lost, pgcoord interrupted) it signals the command's process group,
// then kills it after the grace period.
func (a *app) runChild(ctx context.Context, l leases.Lease, spec runSpec, errW io.Writer) (childResult, error) {
	c := exec.Command(spec.argv[0], spec.argv[1:]...)
	env, dropped := childEnviron(os.Environ(), spec.secrets)
	if len(dropped) > 0 {
		fmt.Fprintf(errW, "pgcoord: not passing %s to the command: it holds the database password\n", strings.Join(dropped, ", "))
	}
	c.Env = append(env,
		fmt.Sprintf("%s=%d", EnvFenceToken, l.Token),
		EnvLeaseName+"="+l.Name,
		EnvLeaseHolder+"="+l.Holder,
	)
	c.Stdin, c.Stdout, c.Stderr = os.Stdin, a.out, errW
	setProcessGroup(c)
	// Bounds how long Wait reads the command's output after it exited, should a process it
	// left behind keep the pipes open (only when pgcoord's output is not a file).
	c.WaitDelay = max(spec.grace, time.Second)
	// main turns SIGINT and SIGTERM into ctx's cancellation. A hangup would kill pgcoord and
	// leave the command, in its own process group, running without renewals: catch it here,
	// unless it is ignored (nohup).
	hup := make(chan os.Signal, 1)
	if !signal.Ignored(syscall.SIGHUP) {
		signal.Notify(hup, syscall.SIGHUP)
		defer signal.Stop(hup)
	}

	if err := c.Start(); err != nil {
		fmt.Fprintf(errW, "pgcoord: cannot run %s: %v\n", spec.argv[0], err)
		return childResult{}, errStartFailed
	}
	res := childResult{started: true}
	pgid := c.Process.Pid
	done := make(chan error, 1)
	go func() { done <- c.Wait() }()

	var waitErr error
	select {
	case waitErr = <-done:
	case <-ctx.Done():
		res.stopped = context.Cause(ctx)
	case <-hup:
		res.stopped = errHangup
	}
	if res.stopped != nil {
		sig := forwardedSignal(res.stopped)
		then := fmt.Sprintf("SIGKILL after %v", spec.grace)
		if spec.grace == 0 {
			sig, then = syscall.SIGKILL, "at once"
		}
		if errors.Is(res.stopped, leases.ErrLost) {
			fmt.Fprintf(errW, "pgcoord: lost lease %q (fence token %d) while the command ran: %v; stopping the command (%s, %s)\n",
				l.Name, l.Token, res.stopped, sigName(sig), then)
		} else {
			fmt.Fprintf(errW, "pgcoord: interrupted (%v); stopping the command (%s, %s)\n", res.stopped, sigName(sig), then)
		}
		_ = signalGroup(pgid, sig)
		waitErr = stopGroup(pgid, spec.grace, done)
	}

	ps := c.ProcessState
	if ps == nil {
		fmt.Fprintf(errW, "pgcoord: waiting for %s: %v\n", spec.argv[0], waitErr)
		res.code = ExitFailure
		return res, nil
	}
	ws, _ := ps.Sys().(syscall.WaitStatus)
	switch {
	case ws.Signaled():
		res.code = 128 + int(ws.Signal())
	default:
		res.code = ps.ExitCode()
	}
	return res, nil
}

// stopGroup waits for the signalled process group pgid: its leader's Wait result on done,
// and any other members, until grace has passed, then kills whatever is left of the group.
func stopGroup(pgid int, grace time.Duration, done <-chan error) error {
	deadline := time.NewTimer(grace)
	defer deadline.Stop()
	var waitErr error
	select {
	case waitErr = <-done:
	case <-deadline.C:
		_ = signalGroup(pgid, syscall.SIGKILL)
		return <-done
	}
	// The leader is gone; members that outlive it get the rest of the grace period.
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for groupAlive(pgid) {
		select {
		case <-deadline.C:
			_ = signalGroup(pgid, syscall.SIGKILL)
			return waitErr
		case <-tick.C:
		}
	}
	return waitErr
}

// gaveUp reports that the lease was not granted within --wait, naming its holder.
func (a *app) gaveUp(ctx context.Context, pool *pgxpool.Pool, spec runSpec) error {
	what := fmt.Sprintf("after %v", spec.wait)
	if spec.wait == 0 {
		what = "(--wait 0: one attempt)"
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if i, err := leases.Get(rctx, pool, spec.name); err == nil && i.Held() {
		fmt.Fprintf(a.errOut, "pgcoord: gave up waiting for lease %q %s: held by %s (fence token %d, %s left); the command did not run\n",
			spec.name, what, base.Printable(i.Holder), i.Token, ttlLeft(i))
	} else {
		fmt.Fprintf(a.errOut, "pgcoord: gave up waiting for lease %q %s; the command did not run\n", spec.name, what)
	}
	return exitCode(ExitFailure)
}
