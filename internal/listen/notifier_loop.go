package listen

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
)

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
		for ch := range n.wanted(time.Now()) {
			want = append(want, ch)
		}
		n.syncing = true
		n.syncs++
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
		now := time.Now()
		// No connection: the sync had no channel to LISTEN on (its subscribers gave up before
		// it ran), and there is nothing to wait on: the next round retires or connects.
		if n.conn == nil || len(n.pending) > 0 || n.channelsChanged(n.wanted(now)) {
			n.mu.Unlock()
			interrupt()
			continue
		}
		n.interrupt = interrupt
		// Wake up to retire once idle for linger, or to UNLISTEN a channel emptied as long.
		deadline := n.nextUnlisten()
		if len(n.channels) == 0 {
			since := n.idleSince
			if since.IsZero() {
				since = now
			}
			if at := since.Add(n.linger); deadline.IsZero() || at.Before(deadline) {
				deadline = at
			}
		}
		n.mu.Unlock()
		cancel := interrupt
		if !deadline.IsZero() {
			ctx, cancel = context.WithDeadline(ctx, deadline)
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

// channelsChanged reports whether the LISTENed channels differ from want. n.mu is held.
func (n *notifier) channelsChanged(want map[string]bool) bool {
	if len(n.listening) != len(want) {
		return true
	}
	for ch := range want {
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
		if Pooled(n.pool) {
			return fresh, errPooled
		}
		c, err := n.pool.Acquire(ctx)
		if err != nil {
			return fresh, err
		}
		if pooler, err := behindPooler(ctx, c); err != nil || pooler {
			c.Release() // nothing was LISTENed on it
			if err == nil {
				markPooled(n.pool)
				err = errPooled
			}
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

func closeConn(c *pgx.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = c.Close(ctx)
}
