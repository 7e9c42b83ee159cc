//go:build linux

package cli_test

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/pgcoord/pgcoord/internal/cli"
	"github.com/pgcoord/pgcoord/pgcoord"
)

// openPTY opens a pseudo-terminal and returns its controlling side and its terminal.
func openPTY(t *testing.T) (ctl, tty *os.File) {
	t.Helper()
	ctl, err := os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Skipf("no pseudo-terminals here: %v", err)
	}
	t.Cleanup(func() { ctl.Close() })
	if err := unix.IoctlSetPointerInt(int(ctl.Fd()), unix.TIOCSPTLCK, 0); err != nil {
		t.Fatalf("unlock the pseudo-terminal: %v", err)
	}
	n, err := unix.IoctlGetInt(int(ctl.Fd()), unix.TIOCGPTN)
	if err != nil {
		t.Fatalf("pseudo-terminal number: %v", err)
	}
	tty, err = os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tty.Close() })
	return ctl, tty
}

// The real command with a real terminal as its standard input asks before rolling back,
// and goes ahead on the answer typed there.
func TestMigrateDownAsksOnARealTerminal(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	ctl, tty := openPTY(t)
	if _, err := ctl.WriteString("y\n"); err != nil { // typed ahead: the terminal holds the line
		t.Fatal(err)
	}
	code, stderr := runReal(t, nil, tty, append(slices.Clone(d.flags), "migrate", "down")...)
	if v := schemaVersion(t, d.pool); code != cli.ExitOK || v != pgcoord.LatestVersion()-1 ||
		!strings.Contains(stderr, "Roll back 1 migration(s)? [y/N] ") {
		t.Fatalf("migrate down on a terminal answered y: exit %d, version %d, stderr %q; want the newest migration rolled back", code, v, stderr)
	}
	if _, err := ctl.WriteString("n\n"); err != nil {
		t.Fatal(err)
	}
	code, stderr = runReal(t, nil, tty, append(slices.Clone(d.flags), "migrate", "down")...)
	if v := schemaVersion(t, d.pool); code != cli.ExitFailure || v != pgcoord.LatestVersion()-1 {
		t.Fatalf("migrate down on a terminal answered n: exit %d, version %d, stderr %q; want exit 1, nothing rolled back", code, v, stderr)
	}
}
