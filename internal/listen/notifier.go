package listen

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// pendingSub is a subscriber waiting until the notifier LISTENs on channel.
type pendingSub struct {
	channel string
	done    chan error
}

// notifier owns a pool's LISTEN connection. Its loop goroutine alone uses the connection;
// mu guards the rest.
type notifier struct {
	pool *pgxpool.Pool

	mu        sync.Mutex
	linger    time.Duration // how long it stays idle before it retires (and keeps an emptied channel)
	waiters   map[subKey]map[*Waiter]struct{}
	channels  map[string]int     // waiters per channel
	listening map[string]bool    // channels LISTENed on the current connection
	pending   []pendingSub       // subscribers waiting for the loop to LISTEN
	syncing   bool               // the loop is bringing the LISTENed channels in line
	interrupt context.CancelFunc // stops the loop's current wait
	running   bool               // the loop goroutine runs
	retired   bool               // the notifier left the registry: subscribe to a new one
	idleSince time.Time          // when the loop first saw no waiter (zero while some wait)
	conn      *pgx.Conn          // the loop's connection, nil while it has none
	done      chan struct{}      // closed when the loop goroutine has returned (tests wait on it)
	relisten  int                // times the loop LISTENed again after losing its connection
	// emptied holds the LISTENed channels whose last waiter left, and when: each stays
	// LISTENed for linger, so that a waiter coming back (the next Acquire of a handoff)
	// finds it LISTENed instead of waiting for an UNLISTEN and a LISTEN.
	emptied map[string]time.Time
	syncs   int // rounds of sync (tests count them)
}

// errRetired is subscribe's answer from a notifier that has left the registry.
var errRetired = errors.New("listen: notifier retired")

var registry struct {
	sync.Mutex
	m map[*pgxpool.Pool]*notifier
}

// notifierOf returns pool's notifier, creating it on first use.
func notifierOf(pool *pgxpool.Pool) *notifier {
	registry.Lock()
	defer registry.Unlock()
	if registry.m == nil {
		registry.m = map[*pgxpool.Pool]*notifier{}
	}
	n := registry.m[pool]
	if n == nil {
		n = &notifier{pool: pool, linger: linger, waiters: map[subKey]map[*Waiter]struct{}{}, channels: map[string]int{},
			listening: map[string]bool{}, emptied: map[string]time.Time{}}
		registry.m[pool] = n
	}
	return n
}

// subscribe adds w and returns once the notifier LISTENs on w's channel, or with an error
// if it cannot (the waiter is not added then).
func (n *notifier) subscribe(ctx context.Context, w *Waiter) error {
	n.mu.Lock()
	if n.retired {
		n.mu.Unlock()
		return errRetired
	}
	if n.waiters[w.key] == nil {
		n.waiters[w.key] = map[*Waiter]struct{}{}
	}
	n.waiters[w.key][w] = struct{}{}
	n.channels[w.key.channel]++
	delete(n.emptied, w.key.channel)
	n.idleSince = time.Time{}
	// Already LISTENing, and no sync under way that might UNLISTEN the channel (it had no
	// waiter when the sync started).
	if n.conn != nil && n.listening[w.key.channel] && !n.syncing {
		n.mu.Unlock()
		return nil
	}
	done := make(chan error, 1)
	n.pending = append(n.pending, pendingSub{w.key.channel, done})
	n.kick()
	n.mu.Unlock()
	var err error
	select {
	case err = <-done:
	case <-ctx.Done():
		err = ctx.Err()
	}
	if err != nil {
		n.unsubscribe(w)
	}
	return err
}

// kick makes the loop run its next round soon: starts it, or interrupts its wait. n.mu is
// held.
func (n *notifier) kick() {
	if n.retired {
		return // nobody can subscribe any more; the last unsubscriber needs no UNLISTEN
	}
	if !n.running {
		n.running = true
		n.done = make(chan struct{})
		go n.loop(n.done)
		return
	}
	if n.interrupt != nil {
		n.interrupt()
	}
}

func (n *notifier) unsubscribe(w *Waiter) {
	n.mu.Lock()
	defer n.mu.Unlock()
	set := n.waiters[w.key]
	if _, ok := set[w]; !ok {
		return
	}
	delete(set, w)
	if len(set) == 0 {
		delete(n.waiters, w.key)
	}
	if n.channels[w.key.channel]--; n.channels[w.key.channel] == 0 {
		delete(n.channels, w.key.channel)
		if n.listening[w.key.channel] {
			n.emptied[w.key.channel] = time.Now()
		}
		n.kick() // UNLISTEN it once it has had no waiter for linger
	}
}

// wanted returns the channels to LISTEN on at now: those with waiters, and those LISTENed
// whose last waiter left less than linger ago. It forgets the others. n.mu is held.
func (n *notifier) wanted(now time.Time) map[string]bool {
	want := make(map[string]bool, len(n.channels)+len(n.emptied))
	for ch := range n.channels {
		want[ch] = true
	}
	for ch, since := range n.emptied {
		if n.listening[ch] && now.Sub(since) < n.linger {
			want[ch] = true
		} else {
			delete(n.emptied, ch)
		}
	}
	return want
}

// nextUnlisten returns when the first of the emptied channels is due for UNLISTEN (zero
// if none is). n.mu is held.
func (n *notifier) nextUnlisten() time.Time {
	var next time.Time
	for _, since := range n.emptied {
		if at := since.Add(n.linger); next.IsZero() || at.Before(next) {
			next = at
		}
	}
	return next
}

// retire removes the idle notifier from the registry, unless a waiter came meanwhile.
// n.mu is held.
func (n *notifier) retire() bool {
	registry.Lock()
	defer registry.Unlock()
	if len(n.channels) > 0 || len(n.pending) > 0 {
		return false
	}
	n.running, n.retired = false, true
	if registry.m[n.pool] == n {
		delete(registry.m, n.pool)
	}
	return true
}

// dispatch wakes the waiters a notification concerns. A nil notification (the pool's
// connections hand theirs to an application handler, pgconn.Config.OnNotification) wakes
// every waiter: they check again.
func (n *notifier) dispatch(note *pgconn.Notification) {
	if note == nil {
		n.wakeAll()
		return
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	for w := range n.waiters[subKey{note.Channel, note.Payload}] {
		w.signal()
	}
	if note.Payload != "" {
		for w := range n.waiters[subKey{note.Channel, ""}] {
			w.signal()
		}
	}
}

func (n *notifier) wakeAll() {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, set := range n.waiters {
		for w := range set {
			w.signal()
		}
	}
}
