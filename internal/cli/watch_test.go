package cli_test

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"os/signal"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pgcoord/pgcoord/internal/cli"
)

// watching is a pgcoord command running in the background with live output streams.
type watching struct {
	out, errOut syncBuffer
	code        chan int
}

// startLive runs pgcoord against the test's schema in the background with ctx; its output
// can be read while it runs.
func (d testDB) startLive(ctx context.Context, args ...string) *watching {
	w := &watching{code: make(chan int, 1)}
	all := append(slices.Clone(d.flags), args...)
	go func() { w.code <- cli.Run(ctx, all, &w.out, &w.errOut) }()
	return w
}

// waitOut waits until the output satisfies cond, failing the test if the command exits
// first or progressLimit passes.
func (w *watching) waitOut(t *testing.T, what string, cond func(out string) bool) {
	t.Helper()
	waitFor(t, progressLimit, what, func() bool {
		select {
		case code := <-w.code:
			t.Fatalf("pgcoord exited with %d while waiting for %s:\n%s\n%s", code, what, w.out.String(), w.errOut.String())
		default:
		}
		return cond(w.out.String())
	})
}

// exit waits for the command to end and returns its exit code.
func (w *watching) exit(t *testing.T) int {
	t.Helper()
	select {
	case code := <-w.code:
		return code
	case <-t.Context().Done():
	case <-time.After(progressLimit):
	}
	t.Fatalf("pgcoord did not exit within %v", progressLimit)
	return 0
}

// refreshHeader starts each refresh of a watched table written to a pipe.
var refreshHeader = regexp.MustCompile(`(?m)^Every 100ms: pgcoord [a-z ]+ \(refresh (\d+); Ctrl-C stops\)$`)

// refreshes splits the output of a watched table into its refreshes, checking that they
// are numbered 1, 2, 3, ... and that nothing precedes the first.
func refreshes(t *testing.T, out string) []string {
	t.Helper()
	locs := refreshHeader.FindAllStringSubmatchIndex(out, -1)
	if len(locs) == 0 || locs[0][0] != 0 {
		t.Fatalf("watch output does not start with a refresh header:\n%s", out)
	}
	var parts []string
	for i, l := range locs {
		if n, _ := strconv.Atoi(out[l[2]:l[3]]); n != i+1 {
			t.Fatalf("refresh %d is numbered %d:\n%s", i+1, n, out)
		}
		end := len(out)
		if i+1 < len(locs) {
			end = locs[i+1][0]
		}
		parts = append(parts, out[l[1]:end])
	}
	return parts
}

// --watch on a pipe prints a refresh after a header line, again and again, each one
// reading the database anew, until the context ends: then it exits 0.
func TestWatchTableRefreshesUntilCancelled(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	grant(t, d.pool, "w:a", "h1", time.Hour, time.Time{})
	grant(t, d.pool, "other", "h1", time.Hour, time.Time{})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	w := d.startLive(ctx, "leases", "list", "--watch=100ms", "--prefix", "w:")
	w.waitOut(t, "a refresh listing w:a", func(out string) bool { return strings.Contains(out, "w:a") })
	grant(t, d.pool, "w:b", "h2", time.Hour, time.Time{})
	w.waitOut(t, "a refresh listing w:b", func(out string) bool { return strings.Contains(out, "w:b") })
	cancel()
	if code := w.exit(t); code != cli.ExitOK {
		t.Fatalf("watch ended by its context exited %d: %s", code, w.errOut.String())
	}
	parts := refreshes(t, w.out.String())
	first, last := parts[0], parts[len(parts)-1]
	if !strings.Contains(first, "NAME") || !strings.Contains(first, "w:a") || strings.Contains(first, "w:b") {
		t.Fatalf("first refresh:\n%s\nwant w:a alone", first)
	}
	if len(parts) < 2 || !strings.Contains(last, "w:a") || !strings.Contains(last, "w:b") {
		t.Fatalf("last refresh:\n%s\nwant w:a and w:b", last)
	}
	if strings.Contains(w.out.String(), "other") || strings.Contains(w.out.String(), "\x1b") {
		t.Fatalf("watch on a pipe printed a lease outside --prefix or an escape sequence:\n%q", w.out.String())
	}
}

// A refresh that fails prints its error on stderr and the watch goes on: the next
// refreshes succeed again once the cause is gone.
func TestWatchKeepsWatchingAfterAFailedRefresh(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	grant(t, d.pool, "w:a", "h1", time.Hour, time.Time{})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	w := d.startLive(ctx, "leases", "list", "--watch=100ms")
	w.waitOut(t, "a first refresh", func(out string) bool { return strings.Contains(out, "w:a") })
	if _, err := d.pool.Exec(t.Context(), `ALTER TABLE pgcoord_leases RENAME TO pgcoord_leases_away`); err != nil {
		t.Fatal(err)
	}
	waitFor(t, progressLimit, "a failed refresh on stderr", func() bool {
		return strings.Contains(w.errOut.String(), "failed (still watching)")
	})
	failedAt := len(refreshHeader.FindAllString(w.out.String(), -1))
	if _, err := d.pool.Exec(t.Context(), `ALTER TABLE pgcoord_leases_away RENAME TO pgcoord_leases`); err != nil {
		t.Fatal(err)
	}
	w.waitOut(t, "a refresh after the failure listing w:a again", func(out string) bool {
		parts := refreshHeader.Split(out, -1)
		return len(parts) > failedAt+1 && strings.Contains(parts[len(parts)-1], "w:a")
	})
	cancel()
	if code := w.exit(t); code != cli.ExitOK {
		t.Fatalf("watch exited %d: %s", code, w.errOut.String())
	}
	if !strings.Contains(w.errOut.String(), "pgcoord_leases") {
		t.Fatalf("the failed refresh did not say why: %s", w.errOut.String())
	}
}

// With --json, --watch prints one JSON document per line per refresh (NDJSON), and
// nothing else on stdout.
func TestWatchJSONIsNDJSON(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	semGrant(t, d.pool, "s:1", "h1", 2, time.Hour, time.Time{})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	w := d.startLive(ctx, "--json", "semaphores", "list", "-w=100ms")
	held := func(line string) float64 {
		var keys []map[string]any
		if err := json.Unmarshal([]byte(line), &keys); err != nil || len(keys) != 1 {
			t.Fatalf("watch --json printed %q: not a JSON array of one key (%v)", line, err)
		}
		return keys[0]["held"].(float64)
	}
	lines := func(out string) []string { // the complete lines
		l := strings.Split(out, "\n")
		return l[:len(l)-1]
	}
	w.waitOut(t, "a first document", func(out string) bool { return len(lines(out)) > 0 })
	semGrant(t, d.pool, "s:1", "h2", 2, time.Hour, time.Time{})
	w.waitOut(t, "a document with 2 permits held", func(out string) bool {
		l := lines(out)
		return len(l) > 0 && held(l[len(l)-1]) == 2
	})
	cancel()
	if code := w.exit(t); code != cli.ExitOK {
		t.Fatalf("watch --json exited %d: %s", code, w.errOut.String())
	}
	all := lines(w.out.String())
	if len(all) < 2 || held(all[0]) != 1 {
		t.Fatalf("watch --json printed %q: want at least two documents, the first with 1 permit held", all)
	}
	for _, l := range all {
		held(l)
	}
}

// --watch takes an interval from 100ms to 1h, given with "=", and --prefix at most 255
// bytes: anything else is a usage error (exit 2), refused before connecting.
func TestWatchAndPrefixBounds(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		args []string
		says string
	}{
		{[]string{"leases", "list", "--watch=99ms"}, "--watch"},
		{[]string{"jobs", "list", "--watch=61m"}, "--watch"},
		{[]string{"semaphores", "list", "--watch=soon"}, "--watch"},
		{[]string{"leases", "list", "--watch", "5s"}, "takes 0 argument(s), got 1"},
		{[]string{"outbox", "list", "--prefix", strings.Repeat("x", 256)}, "--prefix"},
		{[]string{"audit", "list", "--prefix", "a\x1b[2J"}, "--prefix"},
	} {
		code, _, errOut := run(t, append([]string{"--database-url", "postgres://nowhere.invalid/x"}, c.args...)...)
		if code != cli.ExitUsage || !strings.Contains(errOut, c.says) {
			t.Errorf("%v = %d %q, want a usage error saying %q", c.args, code, errOut, c.says)
		}
	}
}

// envCLIArgs makes the test binary act as the pgcoord command (TestCLIProcess), with
// these arguments (JSON), so a test can signal a real process.
const envCLIArgs = "PGCOORD_TEST_CLI_ARGS"

// TestCLIProcess is pgcoord's main when envCLIArgs is set: a real process the test signals.
func TestCLIProcess(t *testing.T) {
	raw := os.Getenv(envCLIArgs)
	if raw == "" {
		t.Skip("runs as a child process of TestWatchEndsOnSIGINT")
	}
	var args []string
	if err := json.Unmarshal([]byte(raw), &args); err != nil {
		t.Fatal(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := cli.Run(ctx, args, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// SIGINT (Ctrl-C) ends a watch in a real process with exit code 0.
func TestWatchEndsOnSIGINT(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	grant(t, d.pool, "w:a", "h1", time.Hour, time.Time{})
	args, _ := json.Marshal(append(slices.Clone(d.flags), "leases", "list", "--watch=100ms"))
	cmd := exec.Command(os.Args[0], "-test.run=^TestCLIProcess$")
	cmd.Env = append(os.Environ(), envCLIArgs+"="+string(args))
	var out, errOut syncBuffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	waitFor(t, progressLimit, "two refreshes", func() bool {
		select {
		case err := <-done:
			t.Fatalf("pgcoord exited early (%v):\n%s\n%s", err, out.String(), errOut.String())
		default:
		}
		return strings.Count(out.String(), "w:a") >= 2
	})
	if err := cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("watch after SIGINT: %v\n%s", err, errOut.String())
		}
	case <-time.After(progressLimit):
		_ = cmd.Process.Kill()
		t.Fatalf("watch did not end within %v of SIGINT", progressLimit)
	}
	refreshes(t, out.String())
	if errOut.String() != "" {
		t.Fatalf("watch ended by SIGINT printed on stderr: %s", errOut.String())
	}
}
