package cli_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/pgcoord/pgcoord/dedupe"
	"github.com/pgcoord/pgcoord/internal/cli"
	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/outbox"
)

// openTerminal opens a pseudo-terminal: the command writes to the returned terminal as to
// a user's, and what it wrote (output processing turns "\n" into "\r\n") accumulates in the
// returned buffer.
func openTerminal(t *testing.T) (*os.File, *syncBuffer) {
	t.Helper()
	master, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Skipf("no pseudo-terminal here: %v", err)
	}
	var unlock int32
	if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, master.Fd(), syscall.TIOCSPTLCK, uintptr(unsafe.Pointer(&unlock))); e != 0 {
		t.Fatal(e)
	}
	var n uint32
	if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, master.Fd(), syscall.TIOCGPTN, uintptr(unsafe.Pointer(&n))); e != 0 {
		t.Fatal(e)
	}
	term, err := os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	var screen syncBuffer
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 4096)
		for {
			k, err := master.Read(buf)
			screen.Write(buf[:k])
			if err != nil {
				return
			}
		}
	}()
	t.Cleanup(func() {
		term.Close()
		master.Close()
		<-done
	})
	return term, &screen
}

// A collection shows its progress on a terminal: one line on stderr, updated in place after
// each batch; the final count on stdout says how many rows went in how many batches, and
// it is the number of rows the database lost.
func TestProgressOnATerminal(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	pgtest.At(t, d.pool, time.Now().Add(-2*time.Hour), func() {
		dedupeClaims(t, d.pool, "expired", 7, &dedupe.ClaimOpts{Retention: time.Hour})
	})
	dedupeClaims(t, d.pool, "live", 2, &dedupe.ClaimOpts{Retention: time.Hour})
	term, screen := openTerminal(t)
	var out syncBuffer
	code := cli.Run(context.Background(), append(slices.Clone(d.flags), "dedupe", "gc", "--batch", "3"), &out, term)
	if code != cli.ExitOK || strings.TrimSpace(out.String()) != "deleted 7 expired dedupe claims in 3 batches" {
		t.Fatalf("dedupe gc --batch 3 = %d, %q", code, out.String())
	}
	if n := countClaims(t, d.pool); n != 2 {
		t.Fatalf("%d claims left, want the 2 live ones: the final count lied", n)
	}
	want := "\rpgcoord: deleted 3 expired claims in 1 batch...\rpgcoord: deleted 6 expired claims in 2 batches..." +
		"\rpgcoord: deleted 7 expired claims in 3 batches...\r\n"
	waitFor(t, progressLimit, "the progress line", func() bool { return screen.String() == want })

	// pgcoord gc, every kind at once, counts its rounds the same way.
	pgtest.At(t, d.pool, time.Now().Add(-2*time.Hour), func() {
		dedupeClaims(t, d.pool, "old", 5, &dedupe.ClaimOpts{Retention: time.Hour})
	})
	out = syncBuffer{}
	code = cli.Run(context.Background(), append(slices.Clone(d.flags), "gc", "--batch", "2"), &out, term)
	if code != cli.ExitOK || !strings.Contains(out.String(), "deleted 5 rows older than 30d in 3 batches\n") {
		t.Fatalf("gc --batch 2 = %d, %q", code, out.String())
	}
	waitFor(t, progressLimit, "gc's progress line", func() bool {
		return strings.HasSuffix(screen.String(), "\rpgcoord: deleted 5 rows in 3 batches...\r\n")
	})
	if n := countClaims(t, d.pool); n != 2 {
		t.Fatalf("%d claims left after gc, want the 2 live ones", n)
	}
}

// On a terminal, --watch clears the screen and redraws the list in place at each refresh.
func TestWatchRedrawsOnATerminal(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	grant(t, d.pool, "w:a", "h1", time.Hour, time.Time{})
	term, screen := openTerminal(t)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var errOut syncBuffer
	code := make(chan int, 1)
	go func() {
		code <- cli.Run(ctx, append(slices.Clone(d.flags), "leases", "list", "--watch=100ms"), term, &errOut)
	}()
	const home = "\x1b[H\x1b[2JEvery 100ms: pgcoord leases list (refresh "
	waitFor(t, progressLimit, "a first screen", func() bool { return strings.Contains(screen.String(), "w:a") })
	grant(t, d.pool, "w:b", "h2", time.Hour, time.Time{})
	waitFor(t, progressLimit, "a screen with w:b", func() bool {
		screens := strings.Split(screen.String(), home)
		return len(screens) > 2 && strings.Contains(screens[len(screens)-1], "w:b")
	})
	cancel()
	select {
	case c := <-code:
		if c != cli.ExitOK {
			t.Fatalf("watch exited %d: %s", c, errOut.String())
		}
	case <-time.After(progressLimit):
		t.Fatalf("watch did not end within %v of its context", progressLimit)
	}
	screens := strings.Split(screen.String(), home)
	if screens[0] != "" || !strings.HasPrefix(screens[1], "1; Ctrl-C stops)") || strings.Contains(screens[1], "w:b") {
		t.Fatalf("the first screen is not a cleared screen with w:a alone: %q", screen.String())
	}
}

// outbox retry --all-dead retries in batches, with the same progress line on a terminal and
// a final count that is the number of dead messages made pending.
func TestRetryAllDeadProgress(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	var msgs []outbox.Message
	for i := range 5 {
		msgs = append(msgs, obMsg("audit", fmt.Sprint("k", i), "1"))
	}
	obEnqueue(t, d.pool, msgs...)
	obKill(t, d.pool)
	if s, err := outbox.Stats(t.Context(), d.pool, nil); err != nil || len(s) != 1 || s[0].Dead != 5 {
		t.Fatalf("stats %+v, %v: want 5 dead messages", s, err)
	}
	term, screen := openTerminal(t)
	var out syncBuffer
	code := cli.Run(context.Background(), append(slices.Clone(d.flags), "outbox", "retry", "--all-dead", "--batch", "2"), &out, term)
	if code != cli.ExitOK || out.String() != "retried 5 dead messages in 3 batches\n" {
		t.Fatalf("outbox retry --all-dead --batch 2 = %d, %q", code, out.String())
	}
	if s, err := outbox.Stats(t.Context(), d.pool, nil); err != nil || len(s) != 1 || s[0].Dead != 0 || s[0].Pending != 5 {
		t.Fatalf("stats after the retry %+v, %v: want 5 pending, none dead", s, err)
	}
	waitFor(t, progressLimit, "the progress line", func() bool {
		return strings.HasSuffix(screen.String(), "\rpgcoord: retried 4 dead messages in 2 batches...\rpgcoord: retried 5 dead messages in 3 batches...\r\n")
	})
	code, outStr, _ := d.run(t, "audit", "list", "--action", "outbox.retry_dead", "--json")
	if code != cli.ExitOK || !strings.Contains(outStr, `"retried": 5`) {
		t.Fatalf("audit of the retry = %d %q", code, outStr)
	}
}

// A note a refresh prints on stderr (there are more rows than --limit) comes after the
// redraw, so that clearing the screen does not wipe it.
func TestWatchNotesSurviveTheRedraw(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	grant(t, d.pool, "w:a", "h1", time.Hour, time.Time{})
	grant(t, d.pool, "w:b", "h1", time.Hour, time.Time{})
	term, screen := openTerminal(t)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	code := make(chan int, 1)
	go func() {
		code <- cli.Run(ctx, append(slices.Clone(d.flags), "leases", "list", "--limit", "1", "--watch=100ms"), term, term)
	}()
	waitFor(t, progressLimit, "two screens, each with its note", func() bool {
		screens := strings.Split(screen.String(), "\x1b[H\x1b[2J")
		return len(screens) > 2 && strings.Contains(screens[1], "there are more") && strings.Contains(screens[2], "there are more")
	})
	cancel()
	if c := <-code; c != cli.ExitOK {
		t.Fatalf("watch exited %d", c)
	}
	if screens := strings.Split(screen.String(), "\x1b[H\x1b[2J"); screens[0] != "" {
		t.Fatalf("%q came before the first redraw, which wipes it", screens[0])
	}
}
