package leases

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/pgcoord/pgcoord/internal/listen"
)

// IsLeader reports whether this candidate leads now: it holds a grant of the lease, that
// grant has not been found lost, and its trust deadline has not passed by the local
// monotonic clock. It turns false as soon as the term's context is cancelled (before
// OnStartedLeading returns), or when OnStartedLeading returns.
//
// The trust deadline is the grant's Lease.TrustUntil, moved forward each time the leader
// reads its lease back (at least every RenewEvery) and finds it renewed, computed like a
// renewal's: never later than the database's expiry minus SafetyMargin. When renewals
// fail, IsLeader therefore turns false at that deadline, possibly a little before the
// keep-alive gives up the term; should a renewal get through in that gap, IsLeader
// reports true again.
//
// It is a local judgement: a leader paused right after IsLeader returned true may act
// after it was deposed, so fence its writes with the lease's token.
func (e *Elector) IsLeader() bool {
	_, ok := e.Leader()
	return ok
}

// Leader returns the grant this candidate leads with, and true, when IsLeader would
// report true; otherwise a zero Lease and false. The grant's ExpiresAt and TrustUntil
// reflect the latest renewal the leader has observed; its Token is the one to fence writes
// with.
func (e *Elector) Leader() (Lease, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	t := e.term
	if t == nil || t.ctx.Err() != nil || !t.lease.Trusted() {
		return Lease{}, false
	}
	return t.lease, true
}

// ObservedLeader returns the holder this candidate last saw leading (itself included), or
// "" if it has seen none yet. It may be stale by up to PollInterval.
func (e *Elector) ObservedLeader() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.seenHolder
}

// report records that holder leads with token and calls OnNewLeader if the leader changed.
// Observations older than the last reported one (lower token) are dropped.
func (e *Elector) report(holder string, token int64) {
	e.cbMu.Lock()
	defer e.cbMu.Unlock()
	e.mu.Lock()
	if token < e.seenToken {
		e.mu.Unlock()
		return
	}
	e.seenToken = token
	changed := holder != e.seenHolder
	e.seenHolder = holder
	e.mu.Unlock()
	if changed && e.cfg.OnNewLeader != nil {
		e.cfg.OnNewLeader(holder)
	}
}

// poke makes the observer read the lease now.
func (e *Elector) poke() {
	select {
	case e.wake <- struct{}{}:
	default:
	}
}

// observe reads the lease every PollInterval while following, and at least every
// RenewEvery while leading, until ctx ends.
func (e *Elector) observe(ctx context.Context) {
	timer := time.NewTimer(0)
	defer timer.Stop()
	failures := 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		case <-e.wake:
			timer.Stop()
		}
		if err := e.poll(ctx); err != nil && ctx.Err() == nil {
			failures++
			if failures == 1 || failures%10 == 0 {
				e.log.Warn("pgcoord: reading the leader lease failed", "err", err, "failures", failures)
			}
		} else {
			failures = 0
		}
		every := e.cfg.PollInterval
		e.mu.Lock()
		if e.term != nil {
			every = min(every, e.cfg.RenewEvery)
		}
		e.mu.Unlock()
		timer.Reset(listen.Jitter(every))
	}
}

// poll reads the lease once: it reports the leader it finds, and while leading refreshes
// the term's trust deadline from the expiry the database reports, or ends the term if the
// grant is no longer current.
func (e *Elector) poll(ctx context.Context) error {
	e.mu.Lock()
	t := e.term
	e.mu.Unlock()
	rctx, cancel := context.WithTimeout(ctx, max(e.cfg.PollInterval, e.cfg.RenewEvery))
	defer cancel()
	start := time.Now()
	info, err := Get(rctx, e.pool, e.cfg.Name)
	if errors.Is(err, ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	if info.Held() {
		e.report(info.Holder, info.Token)
	}
	if t == nil {
		return nil
	}
	// t was current before the read started, so the read sees t's grant or a later state.
	if info.Held() && info.Token == t.lease.Token && info.Holder == t.lease.Holder {
		// The same computation as for a renewal's reply: the grant lasts at least the
		// remaining TTL the database reports, counted from before the request was sent.
		trust := start.Add(info.ExpiresAt.Sub(info.DBNow) - e.cfg.SafetyMargin)
		e.mu.Lock()
		if trust.After(t.lease.TrustUntil) {
			t.lease.TrustUntil = trust
			t.lease.ExpiresAt = info.ExpiresAt
		}
		e.mu.Unlock()
		return nil
	}
	t.cancel(fmt.Errorf("%w: %q token %d is no longer current (the lease has token %d, holder %q)",
		ErrLost, e.cfg.Name, t.lease.Token, info.Token, info.Holder))
	return nil
}
