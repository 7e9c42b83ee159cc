package cli

import (
	"fmt"
	"io"
)

// progress follows long work done in batches (gc, dedupe gc, idempotency gc, outbox gc,
// outbox retry --all-dead): it counts the batches that changed rows, for the final count
// line, and on a terminal keeps one line on stderr up to date after each batch.
type progress struct {
	w     io.Writer
	what  string // what is changed: "rows", "expired claims"
	verb  string // what is done to it: "deleted", "retried"
	term  bool   // stderr is a terminal: show the line
	total int64
	n     int // batches that changed rows
	shown bool
}

// newProgress follows work that verb ("deleted") what ("rows"); a dry run shows no line
// (it changes nothing).
func (a *app) newProgress(dryRun bool, what, verb string) *progress {
	return &progress{w: a.errOut, what: what, verb: verb, term: isTerminal(a.errOut) && !dryRun}
}

// update takes the total changed so far, after a batch.
func (p *progress) update(total int64) {
	if total == p.total { // a round that changed nothing
		return
	}
	p.total = total
	p.n++
	if p.term {
		fmt.Fprintf(p.w, "\rpgcoord: %s %d %s in %s...", p.verb, total, p.what, batches(p.n))
		p.shown = true
	}
}

// done ends the progress line, if one was shown.
func (p *progress) done() {
	if p.shown {
		fmt.Fprintln(p.w)
	}
}

// in is " in 3 batches" for the final count line, or "" when nothing changed.
func (p *progress) in() string {
	if p.n == 0 {
		return ""
	}
	return " in " + batches(p.n)
}

// batches is "1 batch" or "n batches".
func batches(n int) string {
	if n == 1 {
		return "1 batch"
	}
	return fmt.Sprintf("%d batches", n)
}
