// Package listen is the waiting side shared by pgcoord's blocking calls (leases.Acquire,
// semaphore.Acquire, outbox relays).
//
// Every waiter of a pool shares one LISTEN connection: the pool's notifier, which takes a
// connection from the pool once (and hijacks it, so the pool may open another in its
// place), LISTENs on the channels its waiters need and fans each notification out to the
// waiters it concerns. A waiter holds no connection while it waits: however many wait, the
// pool keeps its connections for the work that must not wait — a holder's renewals above
// all. The notifier closes its connection shortly after its last waiter leaves.
package listen

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// linger is how long a notifier keeps its connection after its last waiter left, so that
// waiters that come and go do not open and close a connection each. A notifier reads it
// once, when it is created (under the registry's lock, so tests may change it).
var linger = 10 * time.Second

// Waiter waits for a notification on one channel carrying one payload (any payload when
// it is ""), or for a timeout. Create it before the attempt whose failure it waits after,
// so nothing sent in between is missed.
type Waiter struct {
	n    *notifier // nil: the waiter only sleeps
	wake chan struct{}
	key  subKey
}

// New returns a waiter on pool for notifications on channel with payload. With an empty
// channel the waiter only sleeps (polling, for connections through a transaction-mode
// pooler, where notifications are not delivered). When New returns, the pool's notifier is
// LISTENing on channel. Close the waiter when done.
func New(ctx context.Context, pool *pgxpool.Pool, channel, payload string) (*Waiter, error) {
	w := &Waiter{wake: make(chan struct{}, 1), key: subKey{channel, payload}}
	if channel == "" {
		return w, nil
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	for {
		n := notifierOf(pool)
		err := n.subscribe(ctx, w)
		if errors.Is(err, errRetired) {
			continue // it retired between the lookup and the subscription: take the new one
		}
		if err != nil {
			return nil, err
		}
		w.n = n
		return w, nil
	}
}

// Wait returns after d, when a notification for the waiter arrives (or arrived since the
// last Wait), or with ctx's error when ctx ends. It may also return early when the
// notifier lost its connection and notifications may have been missed: the caller checks
// again either way.
func (w *Waiter) Wait(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	case <-w.wake:
		return nil
	}
}

// Close removes the waiter from its notifier.
func (w *Waiter) Close() {
	if w.n != nil {
		w.n.unsubscribe(w)
		w.n = nil
	}
}

// signal wakes the waiter without blocking; a wake-up already pending is enough.
func (w *Waiter) signal() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

type subKey struct{ channel, payload string }

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
	linger    time.Duration // how long it stays idle before it retires
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
			listening: map[string]bool{}}
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
		n.kick() // UNLISTEN it
	}
}

// loop (re)connects, brings the LISTENed channels in line with the waiters', answers
// pending subscribers and waits for notifications, until nobody has waited for linger.
// It closes done when it returns.
func (n *notifier) loop(done chan struct{}) {
	defer close(done)
	backoff := 10 * time.Millisecond
	lost := false // the connection failed: notifications may have been missed until it is back
	for {
		n.mu.Lock()
		if len(n.channels) == 0 && len(n.pending) == 0 {
			if n.idleSince.IsZero() {
				n.idleSince = time.Now()
			}
			if (n.conn == nil || time.Since(n.idleSince) >= n.linger) && n.retire() {
				conn := n.conn
				n.conn = nil
				n.mu.Unlock()
				if conn != nil {
					closeConn(conn)
				}
				return
			}
		}
		want := make([]string, 0, len(n.channels))
		for ch := range n.channels {
			want = append(want, ch)
		}
		n.syncing = true
		n.mu.Unlock()

		err := n.sync(want)
		// Answer the subscribers whose channel is now LISTENed (or all, with the error);
		// one that came during the sync, for a channel the sync did not know, waits for
		// the next round.
		n.mu.Lock()
		n.syncing = false
		var answer []pendingSub
		keep := n.pending[:0]
		for _, p := range n.pending {
			// (A subscriber whose channel has no waiter any more gave up: it reads no answer.)
			if err != nil || n.listening[p.channel] || n.channels[p.channel] == 0 {
				answer = append(answer, p)
			} else {
				keep = append(keep, p)
			}
		}
		n.pending = keep
		n.mu.Unlock()
		for _, p := range answer {
			p.done <- err
		}
		if err != nil {
			n.wakeAll() // notifications may have been lost with the connection: check again
			lost = true
			time.Sleep(Jitter(backoff))
			backoff = min(2*backoff, 5*time.Second)
			continue
		}
		backoff = 10 * time.Millisecond
		if lost {
			// LISTENing again: whatever was sent between the failure and now was missed.
			lost = false
			n.wakeAll()
			n.mu.Lock()
			n.relisten++
			n.mu.Unlock()
		}

		ctx, interrupt := context.WithCancel(context.Background())
		n.mu.Lock()
		if len(n.pending) > 0 || n.channelsChanged() {
			n.mu.Unlock()
			interrupt()
			continue
		}
		n.interrupt = interrupt
		idle, wait := len(n.channels) == 0, n.linger
		n.mu.Unlock()
		cancel := interrupt
		if idle {
			ctx, cancel = context.WithTimeout(ctx, wait)
		}
		note, err := n.conn.WaitForNotification(ctx)
		interrupted := ctx.Err() != nil
		cancel()
		interrupt()
		n.mu.Lock()
		n.interrupt = nil
		n.mu.Unlock()
		switch {
		case err == nil:
			n.dispatch(note)
		case interrupted && !n.conn.IsClosed():
			// interrupted or timed out: pgx leaves the connection usable after a deadline
		default:
			n.drop()
			n.wakeAll()
			lost = true
		}
	}
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

// channelsChanged reports whether the LISTENed channels differ from the waiters'. n.mu is
// held.
func (n *notifier) channelsChanged() bool {
	if len(n.listening) != len(n.channels) {
		return true
	}
	for ch := range n.channels {
		if !n.listening[ch] {
			return true
		}
	}
	return false
}

// sync connects if needed and LISTENs on exactly the channels want. A connection that
// fails on the way (the server ended it while it was idle, say) is replaced once at once:
// a subscriber should not be failed for the death of a connection it never saw.
func (n *notifier) sync(want []string) error {
	fresh, err := n.syncOnce(want)
	if err != nil && !fresh {
		_, err = n.syncOnce(want)
	}
	return err
}

// syncOnce is one attempt of sync; fresh reports whether it opened the connection it used.
func (n *notifier) syncOnce(want []string) (fresh bool, err error) {
	if n.conn != nil && n.conn.IsClosed() {
		n.drop()
	}
	if n.conn == nil {
		if len(want) == 0 {
			return false, nil
		}
		fresh = true
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c, err := n.pool.Acquire(ctx)
		if err != nil {
			return fresh, err
		}
		conn := c.Hijack()
		n.mu.Lock()
		n.conn, n.listening = conn, map[string]bool{}
		n.mu.Unlock()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	wanted := map[string]bool{}
	for _, ch := range want {
		wanted[ch] = true
	}
	n.mu.Lock()
	var add, drop []string
	for _, ch := range want {
		if !n.listening[ch] {
			add = append(add, ch)
		}
	}
	for ch := range n.listening {
		if !wanted[ch] {
			drop = append(drop, ch)
		}
	}
	n.mu.Unlock()
	for _, ch := range add {
		if _, err := n.conn.Exec(ctx, "LISTEN "+pgx.Identifier{ch}.Sanitize()); err != nil {
			n.drop()
			return fresh, err
		}
		n.mu.Lock()
		n.listening[ch] = true
		n.mu.Unlock()
	}
	for _, ch := range drop {
		if _, err := n.conn.Exec(ctx, "UNLISTEN "+pgx.Identifier{ch}.Sanitize()); err != nil {
			n.drop()
			return fresh, err
		}
		n.mu.Lock()
		delete(n.listening, ch)
		n.mu.Unlock()
	}
	return fresh, nil
}

// drop closes the loop's connection after an error on it.
func (n *notifier) drop() {
	n.mu.Lock()
	conn := n.conn
	n.conn, n.listening = nil, map[string]bool{}
	n.mu.Unlock()
	if conn != nil {
		closeConn(conn)
	}
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

func closeConn(c *pgx.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = c.Close(ctx)
}

// Jitter spreads d by ±20% so waiters do not retry in lockstep.
func Jitter(d time.Duration) time.Duration {
	return time.Duration(float64(d) * (0.8 + 0.4*rand.Float64()))
}

// Ambiguous reports whether err leaves unknown whether a statement committed: the
// connection failed after the statement may have been sent. A grant in that state is
// recovered by asking again as the same holder.
func Ambiguous(ctx context.Context, err error) bool {
	if ctx.Err() != nil {
		return false
	}
	var pgErr *pgconn.PgError
	return !errors.As(err, &pgErr) && !pgconn.SafeToRetry(err)
}
