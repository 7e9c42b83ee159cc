package cli_test

import (
	"context"
	"errors"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pgcoord/pgcoord/internal/cli"
	"github.com/pgcoord/pgcoord/leases"
)

func fileExists(path string) func() bool {
	return func() bool { _, err := os.Stat(path); return err == nil }
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// leases run hands the child the granted token, name and holder, exits with the child's
// code, and releases the lease afterwards.
func TestLeasesRunPassesTokenAndExitCode(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	// Earlier grants: each run's token is higher than every one before.
	var last int64
	for range 3 {
		l := grant(t, d.pool, "job", "someone", time.Minute, time.Time{})
		if err := leases.Release(context.Background(), d.pool, l, nil); err != nil {
			t.Fatal(err)
		}
		last = l.Token
	}
	script := `echo "$PGCOORD_LEASE_NAME $PGCOORD_LEASE_HOLDER $PGCOORD_FENCE_TOKEN"; exit "$1"`
	for _, exit := range []int{0, 7} {
		code, out, errOut := d.run(t, "leases", "run", "--name", "job", "--ttl", "10s", "--holder", "runner",
			"--", "sh", "-c", script, "sh", strconv.Itoa(exit))
		f := strings.Fields(out)
		var token int64
		if len(f) == 3 {
			token, _ = strconv.ParseInt(f[2], 10, 64)
		}
		if code != exit || len(f) != 3 || f[0] != "job" || f[1] != "runner" || token <= last {
			t.Errorf("run exiting %d: pgcoord exit %d, stdout %q, stderr %q; want exit %d and \"job runner <a token above %d>\"",
				exit, code, out, errOut, exit, last)
		}
		if errOut != "" {
			t.Errorf("run exiting %d wrote %q to stderr", exit, errOut)
		}
		if info := getInfo(t, d.pool, "job"); info.Holder != "" || info.Token != token || info.Metadata["command"] != "sh" {
			t.Errorf("after the run the lease is %+v; want it released, token %d, command sh", info, token)
		}
		last = token
	}

	// Without --holder each run gets a new identity; the flags before the command are
	// pgcoord's, everything after it the command's (no -- needed).
	code, out, _ := d.run(t, "leases", "run", "--name", "job", "--ttl", "10s", "sh", "-c", `echo "$PGCOORD_LEASE_HOLDER" "$0"`, "--json")
	if f := strings.Fields(out); code != 0 || len(f) != 2 || f[0] == "runner" || !strings.Contains(f[0], "/") || f[1] != "--json" {
		t.Errorf("run without --holder = %d, %q; want a host/pid/random holder and --json passed to the command", code, out)
	}
}

// A child killed by a signal gives 128+signal, as in shells; a command that cannot be found
// gives 127 without touching the lease.
func TestLeasesRunSignalAndNotFoundCodes(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	code, _, errOut := d.run(t, "leases", "run", "--name", "job", "--ttl", "10s", "--", "sh", "-c", "kill -KILL $$")
	if code != 128+int(syscall.SIGKILL) {
		t.Errorf("child killed by SIGKILL: exit %d, want %d (stderr %q)", code, 128+int(syscall.SIGKILL), errOut)
	}
	code, out, errOut := d.run(t, "leases", "run", "--name", "other", "--ttl", "10s", "--", "pgcoord-no-such-command-x")
	if code != 127 || out != "" || !strings.Contains(errOut, "command not found") {
		t.Errorf("run of a missing command = %d, stdout %q, stderr %q; want 127", code, out, errOut)
	}
	if _, err := leases.Get(context.Background(), d.pool, "other"); !errors.Is(err, leases.ErrNotFound) {
		t.Errorf("a run whose command was not found touched the lease: %v", err)
	}
}

// leases run waits for a held lease and is woken when it is released.
func TestLeasesRunWaitsForRelease(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	ctx := context.Background()
	held := grant(t, d.pool, "job", "other", time.Minute, time.Time{})
	res := d.start(ctx, "leases", "run", "--name", "job", "--ttl", "10s", "--", "sh", "-c", `echo "$PGCOORD_FENCE_TOKEN"`)
	waitFor(t, progressLimit, "pgcoord to register as a waiter", func() bool {
		var waiting bool
		err := d.pool.QueryRow(ctx, "SELECT coalesce(wanted_until > now(), false) FROM pgcoord_leases WHERE name = 'job'").Scan(&waiting)
		return err == nil && waiting
	})
	select {
	case r := <-res:
		t.Fatalf("pgcoord ran while the lease was held: %+v", r)
	default:
	}
	if err := leases.Release(ctx, d.pool, held, nil); err != nil {
		t.Fatal(err)
	}
	r := await(t, res, progressLimit)
	if token, _ := strconv.ParseInt(strings.TrimSpace(r.out), 10, 64); r.code != 0 || token <= held.Token {
		t.Fatalf("run after the release = %d, stdout %q, stderr %q; want a token above %d", r.code, r.out, r.errOut, held.Token)
	}
}

// --wait D gives up after D, and --wait 0 after one attempt, with exit 1 and without running
// the command; on a free lease --wait 0 runs it with a single grant.
func TestLeasesRunWaitGivesUp(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	dir := t.TempDir()
	marker := filepath.Join(dir, "ran")
	held := grant(t, d.pool, "job", "other", time.Minute, time.Time{})
	for _, wait := range []string{"300ms", "0"} {
		t0 := time.Now()
		code, out, errOut := d.run(t, "leases", "run", "--name", "job", "--ttl", "10s", "--wait", wait, "--", "touch", marker)
		if code != cli.ExitFailure || out != "" || !strings.Contains(errOut, `gave up waiting for lease "job"`) || !strings.Contains(errOut, "held by other") {
			t.Errorf("run --wait %s on a held lease = %d, stdout %q, stderr %q", wait, code, out, errOut)
		}
		if wait == "300ms" && time.Since(t0) < 300*time.Millisecond {
			t.Errorf("run --wait 300ms gave up after %v", time.Since(t0))
		}
		if fileExists(marker)() {
			t.Fatalf("run --wait %s ran the command although the lease was held", wait)
		}
	}
	if i := getInfo(t, d.pool, "job"); i.Holder != "other" || i.Token != held.Token {
		t.Fatalf("giving up changed the lease: %+v", i)
	}

	if err := leases.Release(context.Background(), d.pool, held, nil); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := d.run(t, "leases", "run", "--name", "job", "--ttl", "10s", "--wait", "0", "--", "sh", "-c", `echo "$PGCOORD_FENCE_TOKEN"`)
	token, _ := strconv.ParseInt(strings.TrimSpace(out), 10, 64)
	if code != 0 || token <= held.Token {
		t.Fatalf("run --wait 0 on a free lease = %d, stdout %q, stderr %q; want a token above %d", code, out, errOut, held.Token)
	}
	if i := getInfo(t, d.pool, "job"); i.Holder != "" || i.Token != token {
		t.Fatalf("after run --wait 0 the lease is %+v; want it released after the grant with token %d", i, token)
	}
}

// startSleeper starts `leases run` with a child that runs traps (its signal handlers),
// records its token, signals readiness, then runs script (which must not return soon). It
// returns the background result and the token the child saw.
func startSleeper(t *testing.T, ctx context.Context, d testDB, dir, traps, script string, flags ...string) (<-chan result, string) {
	t.Helper()
	// A TTL of a few seconds: an expiry is noticed at the next renewal (a third of it), and
	// a loaded machine (-race beside CPU hogs) has missed a 1s lease's trust deadline before
	// the child even started.
	args := append([]string{"leases", "run", "--name", "job", "--ttl", "5s"}, flags...)
	args = append(args, "--", "sh", "-c", traps+`
		echo "$PGCOORD_FENCE_TOKEN" > "$1/token"; touch "$1/ready"
		`+script, "sh", dir)
	res := d.start(ctx, args...)
	ready := fileExists(filepath.Join(dir, "ready"))
	waitFor(t, progressLimit, "the child to start", func() bool {
		select {
		case r := <-res:
			t.Fatalf("pgcoord exited %d before the child started; stderr %q", r.code, r.errOut)
		default:
		}
		return ready()
	})
	return res, readFile(t, filepath.Join(dir, "token"))
}

// When an operator expires the lease while the command runs, the command is stopped
// (SIGTERM to its process group) and pgcoord exits non-zero promptly, saying why.
func TestLeasesRunStopsChildWhenLeaseLost(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	dir := t.TempDir()
	res, token := startSleeper(t, context.Background(), d, dir, "", "exec sleep 60")
	info := getInfo(t, d.pool, "job")
	if !info.Held() || strconv.FormatInt(info.Token, 10) != token {
		t.Fatalf("while the child runs the lease is %+v; the child saw token %s", info, token)
	}
	if _, err := leases.Expire(context.Background(), d.pool, "job", "test operator"); err != nil {
		t.Fatal(err)
	}
	r := await(t, res, progressLimit)
	if r.code != 128+int(syscall.SIGTERM) {
		t.Errorf("exit %d after the lease was lost, want %d (the child's SIGTERM); stderr %q", r.code, 128+int(syscall.SIGTERM), r.errOut)
	}
	if !strings.Contains(r.errOut, `lost lease "job" (fence token `+token+")") || !strings.Contains(r.errOut, "stopping the command (SIGTERM") {
		t.Errorf("stderr %q does not say the lease was lost and the command stopped", r.errOut)
	}
	// A new holder gets it with a higher token.
	l := grant(t, d.pool, "job", "next", time.Minute, time.Time{})
	if strconv.FormatInt(l.Token-1, 10) != token {
		t.Errorf("the next grant has token %d, want %s+1", l.Token, token)
	}
}

// A child that ignores SIGTERM is killed after --grace; a shell's own children in the
// process group are stopped too.
func TestLeasesRunKillsAfterGrace(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	dir := t.TempDir()
	// The shell ignores SIGTERM; its background sleep records its pid so the test can check
	// that it was stopped with the group.
	res, _ := startSleeper(t, context.Background(), d, dir, `trap "" TERM`,
		`sleep 60 & echo $! > "$1/bg.tmp"; mv "$1/bg.tmp" "$1/bg"; wait`, "--grace", "300ms")
	waitFor(t, progressLimit, "the background child to start", fileExists(filepath.Join(dir, "bg")))
	bg, err := strconv.Atoi(readFile(t, filepath.Join(dir, "bg")))
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	if _, err := leases.Expire(context.Background(), d.pool, "job", "test operator"); err != nil {
		t.Fatal(err)
	}
	r := await(t, res, progressLimit)
	if r.code != 128+int(syscall.SIGKILL) || !strings.Contains(r.errOut, "SIGKILL after 300ms") {
		t.Errorf("exit %d, stderr %q; want %d (SIGKILL after the grace period)", r.code, r.errOut, 128+int(syscall.SIGKILL))
	}
	if e := time.Since(t0); e < 300*time.Millisecond {
		t.Errorf("the child was killed %v after the expiry, before the 300ms grace period", e)
	}
	waitFor(t, 5*time.Second, "the shell's background child to be gone", func() bool { return processGone(bg) })
}

// processGone reports whether pid no longer runs: gone, or a zombie nobody reaped yet.
func processGone(pid int) bool {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return true
	}
	// The state follows the parenthesized command name.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] == 'Z' || s[i+2] == 'X'
}

// Cancelling pgcoord's context (as main does on a signal it cannot name) stops the child with
// SIGTERM; a child that then exits 0 still makes pgcoord exit 1; the lease is released.
func TestLeasesRunInterruptedStopsChild(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	dir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	res, _ := startSleeper(t, ctx, d, dir, `trap 'echo TERM > "$1/got"; exit 0' TERM`, `while :; do sleep 0.05; done`, "--ttl", "10s")
	cancel()
	r := await(t, res, progressLimit)
	if r.code != cli.ExitFailure || !strings.Contains(r.errOut, "interrupted") {
		t.Errorf("interrupted run = %d, stderr %q; want exit 1 and a message", r.code, r.errOut)
	}
	if got := readFile(t, filepath.Join(dir, "got")); got != "TERM" {
		t.Errorf("the child got %q, want TERM", got)
	}
	if i := getInfo(t, d.pool, "job"); i.Holder != "" || i.ExpiredBy != "" {
		t.Errorf("after an interrupted run the lease is %+v; want it released", i)
	}
}

// A real SIGINT to the process, turned into a cancelled context by signal.NotifyContext as
// cmd/pgcoord's main does, reaches the child as SIGINT, once.
func TestLeasesRunForwardsSignal(t *testing.T) {
	// Not parallel: it sends SIGINT to the test process.
	d := newTestDB(t)
	dir := t.TempDir()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	res, _ := startSleeper(t, ctx, d, dir,
		`trap 'echo INT >> "$1/got"' INT; trap 'echo TERM >> "$1/got"; exit 0' TERM`, `while :; do sleep 0.05; done`,
		"--ttl", "10s", "--grace", "500ms")
	if err := syscall.Kill(os.Getpid(), syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	r := await(t, res, progressLimit)
	// The child keeps running after its INT trap, so it is killed after the grace period.
	if r.code != 128+int(syscall.SIGKILL) || !strings.Contains(r.errOut, "interrupt signal received") || !strings.Contains(r.errOut, "SIGINT") {
		t.Errorf("run after SIGINT = %d, stderr %q", r.code, r.errOut)
	}
	if got := readFile(t, filepath.Join(dir, "got")); got != "INT" {
		t.Errorf("the child received %q, want INT exactly once", got)
	}
}

// A SIGHUP to pgcoord (a terminal hangup), which main does not catch, is forwarded to the
// command as SIGHUP too, instead of killing pgcoord and leaving the command unrenewed.
func TestLeasesRunForwardsHangup(t *testing.T) {
	// Not parallel: it sends SIGHUP to the test process.
	if signal.Ignored(syscall.SIGHUP) {
		t.Skip("SIGHUP is ignored in this process (nohup): leases run leaves it alone")
	}
	d := newTestDB(t)
	dir := t.TempDir()
	res, _ := startSleeper(t, context.Background(), d, dir, `trap 'echo HUP > "$1/got"; exit 0' HUP`, `while :; do sleep 0.05; done`, "--ttl", "10s")
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	r := await(t, res, progressLimit)
	if r.code != cli.ExitFailure || !strings.Contains(r.errOut, "hangup signal received") || !strings.Contains(r.errOut, "(SIGHUP, SIGKILL after 5s)") {
		t.Errorf("run after SIGHUP = %d, stderr %q; want exit 1 and a message", r.code, r.errOut)
	}
	if got := readFile(t, filepath.Join(dir, "got")); got != "HUP" {
		t.Errorf("the child received %q, want HUP", got)
	}
}
