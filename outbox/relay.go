package outbox

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/internal/base"
	"github.com/pgcoord/pgcoord/internal/dbarg"
	"github.com/pgcoord/pgcoord/internal/dbsqlc"
	"github.com/pgcoord/pgcoord/internal/listen"
	"github.com/pgcoord/pgcoord/partition"
)

// Handler delivers messages: to a broker (Kafka, NATS, SQS), a webhook, or the
// application's own code. Returning nil marks the message delivered; an error counts a
// failed attempt, and the message is retried after a backoff (or goes dead after
// Config.MaxAttempts), while the later messages of its key wait.
//
// Delivery is at least once: a relay that crashes or stalls after Handle returned but
// before the outcome was recorded, or whose claim was taken over, causes a redelivery.
// Make the effect idempotent downstream, keyed by Message.ID (see package inbox). Handle's
// context ends when the relay stops or the claim's trust deadline passes; return soon after.
type Handler interface {
	Handle(ctx context.Context, msg Message) error
}

// HandlerFunc adapts a function to a Handler.
type HandlerFunc func(ctx context.Context, msg Message) error

// Handle calls f(ctx, msg).
func (f HandlerFunc) Handle(ctx context.Context, msg Message) error { return f(ctx, msg) }

// RelayStats counts what a Relay did since it was created.
type RelayStats struct {
	// Claims counts claims that returned messages; Claimed the messages they returned.
	Claims, Claimed int64
	// Delivered counts messages marked delivered; Failed the failed attempts recorded
	// (those that made a message dead included); Dead the messages that went dead.
	Delivered, Failed, Dead int64
	// Released counts claimed messages let go untried: behind a failure of their key, or
	// left when the claim's trust deadline passed or the relay stopped.
	Released int64
	// Fenced counts outcomes the database refused because the claim had been taken over
	// by another relay after it expired (this relay was too slow or paused): those
	// messages may be delivered again by the new claimant.
	Fenced int64
}

// Relay delivers the outbox's messages through a Handler. Create it with NewRelay and
// call Run; several relays, in one process or many, share the work.
type Relay struct {
	pool    *pgxpool.Pool
	cfg     Config
	group   string // GroupName(cfg.Topics)
	running atomic.Bool
	mu      sync.Mutex
	cur     cursor                     // where the next claim resumes
	batches map[chan struct{}]struct{} // the batches under way (startBatch)
	// The relay's membership of its partition group (join), from its first claim to
	// Leave; whether a Leave is under way; the last batch's end and the timer that leaves
	// when a relay not running stays idle (ranBatch); and a wake-up for Run when a
	// partition is granted to it.
	gmu       sync.Mutex
	member    *partition.Member
	leaving   bool
	lastBatch time.Time
	idle      *time.Timer
	assigned  chan struct{}
	stats     struct {
		claims, claimed, delivered, failed, dead, released, fenced atomic.Int64
	}
}

// NewRelay returns a relay on pool configured by cfg. It returns an error wrapping
// pgcoord.ErrInvalidArgument (or pgcoord.ErrInvalidName for a bad topic or claimant) for
// a nil pool, a missing Handler or a setting out of range.
func NewRelay(pool *pgxpool.Pool, cfg *Config) (*Relay, error) {
	if err := check.DB(pool); err != nil {
		return nil, err
	}
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	return &Relay{pool: pool, cfg: c, group: GroupName(c.Topics), batches: map[chan struct{}]struct{}{}, assigned: make(chan struct{}, 1)}, nil
}

// Claimant returns the relay's identity in its claims.
func (r *Relay) Claimant() string { return r.cfg.Claimant }

// Stats returns the relay's counters. It is safe to call while the relay runs.
func (r *Relay) Stats() RelayStats {
	s := &r.stats
	return RelayStats{
		Claims: s.claims.Load(), Claimed: s.claimed.Load(), Delivered: s.delivered.Load(),
		Failed: s.failed.Load(), Dead: s.dead.Load(), Released: s.released.Load(), Fenced: s.fenced.Load(),
	}
}

// Run delivers messages until ctx ends, then returns nil. It claims a batch, delivers it
// through the Handler, records the outcomes in one statement, and claims again. When no
// message is ready it registers as idle and waits for a producer's notification or
// PollInterval (see "Wake-ups" in the package documentation); it holds no connection while
// it waits: notifications come through the pool's one LISTEN connection, shared by every
// waiter of the process. When ctx ends, the batch in hand stops at the next message: the
// outcomes so far are recorded (for up to 5s) and the rest released for other relays.
//
// Errors along the way (the database unreachable) are logged and retried after
// PollInterval; Run does not return them. It returns ErrRelayRunning if this Relay is
// already running. A Relay may be run again after Run returned.
func (r *Relay) Run(ctx context.Context) error {
	if !r.running.CompareAndSwap(false, true) {
		return fmt.Errorf("%w: %s", ErrRelayRunning, r.cfg.Claimant)
	}
	defer r.running.Store(false)
	// The waiter exists before the relay first registers as idle, so no notification sent
	// after a registration is missed.
	w, listening := r.waiter(ctx, true)
	defer func() { w.Close() }()
	var (
		registered bool          // registered as idle (pgcoord_outbox_idle)
		recheck    bool          // registered since the last claim: claim once more before waiting
		renew      time.Time     // when to register again
		loose      time.Duration // the wait after a loose registration: doubles until one is tight
	)
	defer func() {
		if registered {
			r.setIdle(context.WithoutCancel(ctx), false)
		}
		r.leave(context.WithoutCancel(ctx))
	}()
	for ctx.Err() == nil {
		n, fromStart, err := r.batch(ctx)
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil:
			r.cfg.Logger.Error("outbox: relay claim failed", "claimant", r.cfg.Claimant, "error", err)
			r.wait(ctx, w, listen.Jitter(r.cfg.PollInterval))
			continue
		case n > 0:
			if registered {
				r.setIdle(ctx, false) // busy: producers need not notify on our account
			}
			// loose stays: while a long producer transaction stays open, the next
			// registration is loose too, and need not start again from the shortest wait.
			registered, recheck, renew = false, false, time.Time{}
			continue
		case !fromStart:
			continue // keys before the cursor may be ready
		}

		// Nothing is ready. Ask producers to notify us, then claim once more before
		// waiting, so that nothing committed before the registration is missed.
		if !listening && !r.cfg.NoListen {
			w.Close()
			w, listening = r.waiter(ctx, false)
		}
		if listening && !recheck && !time.Now().Before(renew) {
			if tight, ok := r.setIdle(ctx, true); ok {
				registered, recheck = true, true
				if tight {
					// Every producer that has not committed yet checks after the registration
					// and will notify: wait for that, renewing the registration every interval.
					loose, renew = 0, time.Now().Add(r.cfg.PollInterval)
				} else {
					// A producer that checked before the registration may commit without
					// notifying: register again soon, each time a little later.
					loose = min(max(2*loose, minLooseWait), r.cfg.PollInterval)
					renew = time.Now().Add(loose)
				}
				continue
			}
		}
		recheck = false
		wait := listen.Jitter(r.cfg.PollInterval)
		if registered {
			wait = min(wait, time.Until(renew))
		}
		r.wait(ctx, w, wait)
	}
	return nil
}

// wait waits on w for d (or until ctx ends), or until a partition is granted to the relay.
func (r *Relay) wait(ctx context.Context, w *listen.Waiter, d time.Duration) {
	select {
	case <-r.assigned:
		return
	default:
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-r.assigned:
			cancel()
		case <-wctx.Done():
		}
	}()
	_ = w.Wait(wctx, d)
}

// minLooseWait is the first wait after a registration that was not tight: producer
// transactions are usually that short, so the next registration is tight.
const minLooseWait = 5 * time.Millisecond

// setIdle registers the relay as waiting for a notification (until three poll intervals
// from now; Run renews it every interval while it waits), or removes the registration. It
// reports whether that worked and, for a registration, whether it was tight: no producer
// could have checked for waiting relays before it and still be uncommitted.
func (r *Relay) setIdle(ctx context.Context, idle bool) (tight, ok bool) {
	arg := dbsqlc.OutboxIdleParams{Claimant: r.cfg.Claimant}
	if idle {
		arg.Ttl = dbarg.Interval(3*r.cfg.PollInterval + time.Second)
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	tight, err := queries.OutboxIdle(ctx, r.pool, arg)
	if err != nil {
		r.cfg.Logger.Warn("outbox: relay cannot record whether it waits", "claimant", r.cfg.Claimant, "idle", idle, "error", base.TranslateError(err))
		return false, false
	}
	return tight, true
}

// Leave gives up the relay's partitions at once (see "Several relays" in the package
// documentation): it waits for the batch under way (bounded by the relay's lease and by
// ctx: if ctx ends first, it returns ctx's error, and its partitions move when its lease
// expires), then leaves its partition group, whose plan gives its partitions to the other
// relays of its topics, rather than when its lease expires; claims made meanwhile take
// nothing. Run leaves when it returns; call Leave after the last RunBatch of a relay
// driven by the caller's own loop. A relay that claims again joins again. Leave of a relay
// that is not a member (or is leaving) does nothing and returns nil; otherwise, on a
// standby, it returns an error wrapping pgcoord.ErrReadOnly.
func (r *Relay) Leave(ctx context.Context) error {
	r.gmu.Lock()
	m := r.member
	if m == nil || r.leaving {
		r.gmu.Unlock()
		return nil
	}
	r.leaving = true
	r.gmu.Unlock()
	err := m.Leave(ctx)
	r.gmu.Lock()
	r.member, r.leaving = nil, false
	r.gmu.Unlock()
	if err != nil {
		return fmt.Errorf("outbox: leave: %w", err)
	}
	return nil
}

// leave is Leave for Run's exit, bounded and logged.
func (r *Relay) leave(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := r.Leave(ctx); err != nil {
		r.cfg.Logger.Warn("outbox: relay cannot leave its partition group; the others take its partitions when its lease expires",
			"claimant", r.cfg.Claimant, "error", err)
	}
}

// RunBatch claims one batch, delivers it and records the outcomes, as one round of Run
// does, and returns how many messages it claimed: 0 when none was ready (after a batch
// that no limit cut short, the next one starts again from the first key of its partitions).
// For a relay driven by the caller's own loop or schedule (a cron job draining the
// outbox), and for tests. It may run beside Run. On a standby it returns an error wrapping
// pgcoord.ErrReadOnly.
//
// Like Run, it makes the relay a member of its topics' partition group, which it stays
// (heartbeating in a goroutine of its own) until Leave, or until it has made no batch for
// its lease while Run is not running: a batch comes only from the keys of the relay's
// partitions. So with other relays live it holds only its share of what is ready, it is 0
// while the relay holds no partition yet (the others hold them all: a relay that joined
// waits for their holders to release them), and the share of a relay that died without
// Leave moves when its lease (ClaimTTL, at most 15s) expires. A relay alone, with no dead
// relay's lease lasting, is granted every partition at its first batch: claiming until
// RunBatch returns 0 drains the outbox. Reuse one Relay rather than create one per batch,
// and call Leave when done.
func (r *Relay) RunBatch(ctx context.Context) (int, error) {
	n, _, err := r.batch(ctx)
	return n, err
}

// waiter returns what Run waits on, and whether it listens: a waiter on the outbox channel
// of the pool's shared notifier, or, with NoListen or when listening fails (logged if
// warn), one that only sleeps.
func (r *Relay) waiter(ctx context.Context, warn bool) (*listen.Waiter, bool) {
	if !r.cfg.NoListen && !listen.Pooled(r.pool) {
		channel, err := queries.OutboxChannel(ctx, r.pool)
		var w *listen.Waiter
		if err == nil {
			w, err = listen.New(ctx, r.pool, channel, "")
		}
		if err == nil {
			return w, w.Listening() // not behind a transaction pooler (listen.Pooled)
		}
		if warn && ctx.Err() == nil {
			r.cfg.Logger.Warn("outbox: relay cannot listen for commits; polling", "claimant", r.cfg.Claimant, "error", err)
		}
	}
	w, _ := listen.New(ctx, r.pool, "", "") // sleeps only: never fails
	return w, false
}
