package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/pgcoord/pgcoord/internal/base"
)

// Bounds of --watch: the interval between the refreshes of a list.
const (
	defaultWatchInterval = 2 * time.Second
	minWatchInterval     = 100 * time.Millisecond
	maxWatchInterval     = time.Hour
)

// clearScreen moves the cursor home and clears the terminal, before each refresh of a
// watched list on a terminal.
const clearScreen = "\x1b[H\x1b[2J"

// watchFlag is --watch[=INTERVAL]: 0 when off, else the interval between refreshes.
type watchFlag time.Duration

func (w *watchFlag) String() string {
	if *w == 0 {
		return ""
	}
	return time.Duration(*w).String()
}

func (w *watchFlag) Type() string { return "interval" }

func (w *watchFlag) Set(s string) error {
	d, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	if d < minWatchInterval || d > maxWatchInterval {
		return fmt.Errorf("want an interval from %v to %s (--watch=INTERVAL)", minWatchInterval, compactDuration(maxWatchInterval))
	}
	*w = watchFlag(d)
	return nil
}

// listFlags are the flags every list command shares: --watch and --prefix.
type listFlags struct {
	watch  watchFlag
	prefix string
}

// addListFlags adds --watch to cmd, and --prefix unless prefixHelp (what it keeps: "only
// leases whose name starts with this") is empty.
func addListFlags(cmd *cobra.Command, l *listFlags, prefixHelp string) {
	f := cmd.Flags()
	wf := f.VarPF(&l.watch, "watch", "w", fmt.Sprintf("refresh every interval (--watch=1s; default %v; %v to %s) until interrupted", defaultWatchInterval, minWatchInterval, compactDuration(maxWatchInterval)))
	wf.NoOptDefVal = defaultWatchInterval.String()
	if prefixHelp != "" {
		f.StringVar(&l.prefix, "prefix", "", prefixHelp+", character for character (at most 255 bytes)")
	}
}

// checkPrefix refuses a --prefix no name could start with, before anything connects.
func (l *listFlags) checkPrefix() error {
	if l.prefix == "" {
		return nil
	}
	if err := check.Name("prefix", l.prefix); err != nil {
		return usagef("--prefix: %v", err)
	}
	return nil
}

// show runs render, which prints a list on a.out, once; with --watch, again every
// interval until ctx ends, and then returns nil (exit code 0).
//
// Each refresh is printed whole once it was read: on a terminal, in place (the screen is
// cleared and a header line names the refresh); on a pipe or file, after a header line of
// its own; with --json, as one line of compact JSON (NDJSON), with no header. The first
// refresh must succeed: its error ends the watch. A later refresh that fails prints its
// error on stderr (after the header) and the watch goes on; an error writing the output
// (a closed pipe) ends it.
func (a *app) show(ctx context.Context, cmd *cobra.Command, l *listFlags, render func() error) error {
	if l.watch == 0 {
		return render()
	}
	every := time.Duration(l.watch)
	out, errOut := a.out, a.errOut
	defer func() { a.out, a.errOut = out, errOut }()
	term := isTerminal(out)
	timer := time.NewTimer(every)
	defer timer.Stop()
	for n := 1; ; n++ {
		// Notes on stderr ("there are more") follow the refresh, so that clearing the
		// screen for it does not wipe them.
		var buf, notes bytes.Buffer
		a.out, a.errOut = &buf, &notes
		err := render()
		a.out, a.errOut = out, errOut
		if ctx.Err() != nil {
			return nil
		}
		if err != nil && n == 1 {
			errOut.Write(notes.Bytes())
			return err
		}
		if werr := a.writeRefresh(out, cmd.CommandPath(), every, n, term, buf.Bytes(), err); werr != nil {
			return werr
		}
		errOut.Write(notes.Bytes())
		timer.Reset(every)
		select {
		case <-ctx.Done():
			return nil
		case <-timer.C:
		}
	}
}

// writeRefresh prints refresh n of a watched list to out: its output, or the error that
// took its place (on stderr).
func (a *app) writeRefresh(out io.Writer, path string, every time.Duration, n int, term bool, body []byte, failed error) error {
	var w bytes.Buffer
	switch {
	case a.json && failed == nil:
		if err := json.Compact(&w, body); err != nil {
			return err
		}
		w.WriteByte('\n')
	case a.json:
	default:
		if term {
			w.WriteString(clearScreen)
		} else if n > 1 {
			w.WriteByte('\n')
		}
		fmt.Fprintf(&w, "Every %v: %s (refresh %d; Ctrl-C stops)\n\n", every, path, n)
		if failed == nil {
			w.Write(body)
		}
	}
	if _, err := out.Write(w.Bytes()); err != nil {
		return err
	}
	if failed != nil {
		fmt.Fprintf(a.errOut, "pgcoord: refresh %d failed (still watching): %s\n", n, base.PrintableLines(failed.Error()))
	}
	return nil
}
