package bench

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgcoord/pgcoord/leases"
)

// leases.handoff
//
// A handoff needs a second session per worker: the one blocked in leases.Acquire (which
// takes a pool and holds one of its connections while it waits). Each worker gets a side
// pool of one connection, opened from its own connection's config and shared with the
// same worker's leases.floor_notify, where it is the listening session: the scenario and its
// floor run in alternate rounds, so at most one of them uses it at a time, and a bench at
// concurrency c opens at most c extra connections. A side pool closes itself once idle
// for workerPoolIdle, since workers have no end-of-measurement hook.
//
// One op of leases.handoff, on one lease per worker:
//
//	the waiter goroutine is blocked in leases.Acquire on the side pool (the op waits for the
//	   registration of its wait to return, seen by a query tracer on the side pool)
//	the op releases the current grant on the worker's connection       <- op latency starts
//	the release notifies; the waiter's Acquire is granted and returns  <- the handoff
//	the op takes the new grant as current; the waiter calls Acquire again and blocks
//
// The waiter lives for one round (it is tied to the round's context), so nothing holds the
// side connection during the floor's rounds.

// sidePools are the workers' side sessions: every query on them goes through waitTracer.
var sidePools = &workerPools{what: "side connection", tracer: func(next pgx.QueryTracer) pgx.QueryTracer {
	return waitTracer{next: next}
}}

// waitTracer calls the function stored in a query's context under waitHookKey when a call
// of pgcoord_lease_wait returns: the sign that a waiting leases.Acquire has registered and
// listens. It passes every query on to next, if any.
type waitTracer struct{ next pgx.QueryTracer }

type (
	waitHookKey  struct{}
	waitQueryKey struct{}
)

func (t waitTracer) TraceQueryStart(ctx context.Context, conn *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	if t.next != nil {
		ctx = t.next.TraceQueryStart(ctx, conn, data)
	}
	if ctx.Value(waitHookKey{}) != nil && strings.Contains(data.SQL, "pgcoord_lease_wait(") {
		ctx = context.WithValue(ctx, waitQueryKey{}, true)
	}
	return ctx
}

func (t waitTracer) TraceQueryEnd(ctx context.Context, conn *pgx.Conn, data pgx.TraceQueryEndData) {
	if t.next != nil {
		t.next.TraceQueryEnd(ctx, conn, data)
	}
	if ctx.Value(waitQueryKey{}) != nil && data.Err == nil {
		if hook, ok := ctx.Value(waitHookKey{}).(func()); ok {
			hook()
		}
	}
}

// handoffPatience bounds each wait of a handoff op: for the waiter to block, and for the
// handoff itself. Far beyond any fair wait; hitting it is a bug worth failing the bench.
const handoffPatience = 10 * time.Second

// handoffWorker is the state of one leases.handoff worker.
type handoffWorker struct {
	w    Worker
	side *workerPool
	name string
	cur  leases.Lease // the grant the op releases next; zero before the first op
	wt   *waiter      // this round's waiter
	seen int64        // wt.waits when the waiter was last granted the lease
}

// waiter is the goroutine that waits in leases.Acquire, for one round.
type waiter struct {
	ctx   context.Context // the round's
	waits atomic.Int64    // calls of pgcoord_lease_wait that returned
	wake  chan struct{}   // signalled (without blocking) when waits grows
	got   chan acquired   // an Acquire returned
}

type acquired struct {
	lease leases.Lease
	err   error
	waits int64 // waiter.waits when Acquire returned
}

func newHandoffWorker(ctx context.Context, w Worker) (Op, error) {
	side, err := sidePools.poolFor(ctx, w)
	if err != nil {
		return nil, err
	}
	name, err := uniqueLeaseName("leases.handoff", w)
	if err != nil {
		return nil, err
	}
	h := &handoffWorker{w: w, side: side, name: name}
	return h.op, nil
}

func (h *handoffWorker) op(ctx context.Context) error {
	if h.wt == nil || h.wt.ctx != ctx {
		if err := h.startRound(ctx); err != nil {
			return err
		}
	}
	wt := h.wt
	timer := time.NewTimer(handoffPatience)
	defer timer.Stop()
	// Wait until the waiter has registered its wait (a pgcoord_lease_wait call returned
	// since it was last granted the lease): it now listens and will be notified.
	for wt.waits.Load() <= h.seen {
		select {
		case <-wt.wake:
		case r := <-wt.got:
			return fmt.Errorf("bench: leases.handoff: waiter returned (%v) while %q token %d was held", r.err, h.name, h.cur.Token)
		case <-timer.C:
			return fmt.Errorf("bench: leases.handoff: waiter not blocked after %v", handoffPatience)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if err := leases.Release(ctx, h.w.Conn, h.cur, nil); err != nil {
		return fmt.Errorf("bench: leases.handoff: %w", err)
	}
	select {
	case r := <-wt.got:
		if r.err != nil {
			return fmt.Errorf("bench: leases.handoff: waiter: %w", r.err)
		}
		if r.lease.Token <= h.cur.Token {
			return fmt.Errorf("bench: leases.handoff: token %d after %d", r.lease.Token, h.cur.Token)
		}
		h.cur, h.seen = r.lease, r.waits
	case <-timer.C:
		return fmt.Errorf("bench: leases.handoff: no handoff within %v of the release", handoffPatience)
	case <-ctx.Done():
		return ctx.Err()
	}
	return nil
}

// startRound takes the lease on the worker's connection if this worker has no grant yet and
// starts the round's waiter.
func (h *handoffWorker) startRound(ctx context.Context) error {
	if h.cur.Name == "" {
		l, err := leases.TryAcquire(ctx, h.w.Conn, h.name, benchTTL, nil)
		if err != nil {
			return fmt.Errorf("bench: leases.handoff: first acquire of %q: %w", h.name, err)
		}
		h.cur = l
	}
	pool, err := h.side.use()
	if err != nil {
		return err
	}
	wt := &waiter{ctx: ctx, wake: make(chan struct{}, 1), got: make(chan acquired, 1)}
	h.wt, h.seen = wt, 0
	wctx := context.WithValue(ctx, waitHookKey{}, func() {
		wt.waits.Add(1)
		select {
		case wt.wake <- struct{}{}:
		default:
		}
	})
	// The poll interval only matters if a notification is lost; the lease never expires
	// under a waiter, so a long one keeps the waiter quiet.
	opts := &leases.AcquireOpts{PollInterval: handoffPatience}
	go func() {
		defer h.side.done()
		for {
			l, err := leases.Acquire(wctx, pool, h.name, benchTTL, opts)
			select {
			case wt.got <- acquired{l, err, wt.waits.Load()}:
			case <-ctx.Done(): // the op that would take it failed
				return
			}
			if err != nil {
				return // the round is over (or the bench failed)
			}
		}
	}()
	return nil
}

// leases.floor_notify

func newFloorNotifyWorker(ctx context.Context, w Worker) (Op, error) {
	side, err := sidePools.poolFor(ctx, w)
	if err != nil {
		return nil, err
	}
	var schema string
	if err := w.Conn.QueryRow(ctx, "SELECT current_schema()").Scan(&schema); err != nil {
		return nil, err
	}
	// The bench schema's name is unique per Run: so is the channel.
	channel := fmt.Sprintf("%s_notify_%d", schema, w.ID)
	var (
		seq       int64
		listening *pgx.Conn // the side connection that LISTENs, if any
	)
	return func(ctx context.Context) error {
		pool, err := side.use()
		if err != nil {
			return err
		}
		defer side.done()
		c, err := pool.Acquire(ctx)
		if err != nil {
			return fmt.Errorf("bench: %s: %w", FloorNotify, err)
		}
		defer c.Release()
		if c.Conn() != listening {
			if _, err := c.Exec(ctx, "LISTEN "+pgx.Identifier{channel}.Sanitize()); err != nil {
				return fmt.Errorf("bench: %s: %w", FloorNotify, err)
			}
			listening = c.Conn()
		}
		seq++
		payload := strconv.FormatInt(seq, 10)
		if _, err := w.Conn.Exec(ctx, "SELECT pg_notify($1, $2)", channel, payload); err != nil {
			return fmt.Errorf("bench: %s: notify: %w", FloorNotify, err)
		}
		wctx, cancel := context.WithTimeout(ctx, handoffPatience)
		defer cancel()
		for {
			n, err := c.Conn().WaitForNotification(wctx)
			if err != nil {
				return fmt.Errorf("bench: %s: waiting for notification %s: %w", FloorNotify, payload, err)
			}
			if n.Channel == channel && n.Payload == payload {
				return nil
			}
		}
	}, nil
}
