//go:build unix

package workerproc

import (
	"bytes"
	"strings"
	"sync"
)

// lineWriter collects a process's output and hands out its complete lines, in order, on
// lines — none is dropped, however far behind the reader is, and the process never waits
// for the reader — and closes lines after the last one once the process has exited.
type lineWriter struct {
	mu      sync.Mutex
	more    *sync.Cond // pending grew, or closed was set
	partial []byte
	pending []string
	closed  bool
	tail    []byte // the last tailSize bytes written
	cut     bool   // tail lost earlier bytes
	lines   chan string
}

// tailSize is how much of a process's output lineWriter keeps for error messages.
const tailSize = 4000

func newLineWriter() *lineWriter {
	w := &lineWriter{lines: make(chan string)}
	w.more = sync.NewCond(&w.mu)
	go w.pump()
	return w
}

func (w *lineWriter) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.tail = append(w.tail, b...)
	if n := len(w.tail); n > 2*tailSize {
		w.tail, w.cut = append(w.tail[:0], w.tail[n-tailSize:]...), true
	}
	w.partial = append(w.partial, b...)
	for {
		i := bytes.IndexByte(w.partial, '\n')
		if i < 0 {
			break
		}
		w.pending = append(w.pending, string(w.partial[:i]))
		w.partial = w.partial[i+1:]
	}
	w.more.Broadcast()
	return len(b), nil
}

// pump moves pending lines to the channel.
func (w *lineWriter) pump() {
	for {
		w.mu.Lock()
		for len(w.pending) == 0 && !w.closed {
			w.more.Wait()
		}
		if len(w.pending) == 0 {
			w.mu.Unlock()
			close(w.lines)
			return
		}
		line := w.pending[0]
		w.pending = w.pending[1:]
		w.mu.Unlock()
		w.lines <- line
	}
}

// close ends the output (the process has exited): a last unterminated line still counts.
func (w *lineWriter) close() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.partial) > 0 {
		w.pending = append(w.pending, string(w.partial))
		w.partial = nil
	}
	w.closed = true
	w.more.Broadcast()
}

// all returns everything written, its last tailSize bytes if it is longer.
func (w *lineWriter) all() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	s := string(w.tail)
	if len(s) > tailSize {
		return "..." + s[len(s)-tailSize:]
	}
	if w.cut {
		return "..." + s
	}
	return s
}

// lastLine returns the last line written, terminated or not.
func (w *lineWriter) lastLine() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	s := strings.TrimSuffix(string(w.tail), "\n")
	return s[strings.LastIndexByte(s, '\n')+1:]
}
