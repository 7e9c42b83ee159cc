package outbox

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/internal/dbarg"
	"github.com/pgcoord/pgcoord/internal/dbsqlc"
	"github.com/pgcoord/pgcoord/internal/listen"
	"github.com/pgcoord/pgcoord/pgcoord"
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

// Bounds and defaults of Config.
const (
	DefaultBatchSize    = 1000
	MaxBatchSize        = 10000
	DefaultKeyBatchSize = 100
	DefaultClaimTTL     = 30 * time.Second
	DefaultMaxAttempts  = 10
	DefaultBackoff      = time.Second
	DefaultMaxBackoff   = 10 * time.Minute
	DefaultPollInterval = time.Second
	// DefaultBatchBytes and MaxBatchBytes bound Config.BatchBytes: 16 MiB by default, at
	// most 1 GiB.
	DefaultBatchBytes = 16 << 20
	MaxBatchBytes     = 1 << 30
)

// Config configures a Relay. Only Handler is required.
type Config struct {
	// Handler delivers each message. Required.
	Handler Handler
	// Topics restricts the relay to these topics. Default: every topic.
	Topics []string
	// BatchSize is the most messages one claim takes (1..MaxBatchSize). Default
	// DefaultBatchSize (1000).
	BatchSize int
	// KeyBatchSize is the most messages of one key one claim takes: the key's oldest
	// pending message and those right behind it, delivered in order by this relay.
	// Default DefaultKeyBatchSize (100); at most BatchSize.
	KeyBatchSize int
	// BatchBytes caps the payloads of one claim, in bytes: the relay holds one claim at a
	// time, so its payloads in memory stay below BatchBytes — or one message, since a
	// claim always takes at least one and a payload larger than BatchBytes is claimed
	// alone. Default DefaultBatchBytes (16 MiB); 1..MaxBatchBytes.
	BatchBytes int
	// Concurrency is how many keys of a batch are delivered at once (each key's messages
	// one after the other, in order). Default 1; above 1 the Handler must be safe for
	// concurrent use.
	Concurrency int
	// ClaimTTL is how long a claim holds its messages, by the database clock: a batch must
	// be delivered within it. Once it has passed, another relay may claim the messages
	// again, and this relay's outcomes for them are refused (counted in Stats.Fenced).
	// The relay stops delivering a batch a tenth of ClaimTTL before it ends, by its own
	// clock. Default DefaultClaimTTL (30s).
	ClaimTTL time.Duration
	// MaxAttempts is how many failed deliveries make a message dead. Default
	// DefaultMaxAttempts (10).
	MaxAttempts int
	// Backoff is the wait before the first retry; each further failure doubles it, up to
	// MaxBackoff, with ±20% jitter, by the database clock. Defaults DefaultBackoff (1s)
	// and DefaultMaxBackoff (10m).
	Backoff, MaxBackoff time.Duration
	// PollInterval is how long an idle relay waits before claiming again when no
	// notification arrives (behind a transaction-mode pooler, or for retries coming due),
	// and about the longest a committed message waits for an idle listening relay.
	// Default DefaultPollInterval (1s), with ±20% jitter; at most an hour.
	PollInterval time.Duration
	// NoListen makes the relay poll only, without LISTEN: for connections through a
	// transaction-mode pooler (PgBouncer), where notifications are not delivered.
	NoListen bool
	// Claimant names this relay in its claims (Message.ClaimedBy). Default: a new
	// identity, pgcoord.NewHolderID.
	Claimant string
	// Logger receives failures, dead messages, refused outcomes and errors. Default
	// slog.Default().
	Logger *slog.Logger
}

func (c *Config) withDefaults() (Config, error) {
	var v Config
	if c != nil {
		v = *c
	}
	if v.Handler == nil {
		return v, fmt.Errorf("%w: outbox: relay needs a Handler", pgcoord.ErrInvalidArgument)
	}
	for _, t := range v.Topics {
		if err := pgcoord.ValidateName("outbox topic", t); err != nil {
			return v, err
		}
	}
	v.Topics = slices.Clone(v.Topics)
	def := func(p *int, d int) {
		if *p == 0 {
			*p = d
		}
	}
	defDur := func(p *time.Duration, d time.Duration) {
		if *p == 0 {
			*p = d
		}
	}
	def(&v.BatchSize, DefaultBatchSize)
	def(&v.KeyBatchSize, min(DefaultKeyBatchSize, v.BatchSize))
	def(&v.BatchBytes, DefaultBatchBytes)
	def(&v.Concurrency, 1)
	def(&v.MaxAttempts, DefaultMaxAttempts)
	defDur(&v.ClaimTTL, DefaultClaimTTL)
	defDur(&v.Backoff, DefaultBackoff)
	defDur(&v.MaxBackoff, DefaultMaxBackoff)
	defDur(&v.PollInterval, DefaultPollInterval)
	switch {
	case v.BatchSize < 1 || v.BatchSize > MaxBatchSize:
		return v, fmt.Errorf("%w: outbox: batch size %d is outside 1..%d", pgcoord.ErrInvalidArgument, v.BatchSize, MaxBatchSize)
	case v.KeyBatchSize < 1 || v.KeyBatchSize > v.BatchSize:
		return v, fmt.Errorf("%w: outbox: key batch size %d is outside 1..%d (the batch size)", pgcoord.ErrInvalidArgument, v.KeyBatchSize, v.BatchSize)
	case v.BatchBytes < 1 || v.BatchBytes > MaxBatchBytes:
		return v, fmt.Errorf("%w: outbox: batch bytes %d is outside 1..%d", pgcoord.ErrInvalidArgument, v.BatchBytes, MaxBatchBytes)
	case v.Concurrency < 1 || v.Concurrency > 10000:
		return v, fmt.Errorf("%w: outbox: concurrency %d is outside 1..10000", pgcoord.ErrInvalidArgument, v.Concurrency)
	case v.ClaimTTL < 10*time.Millisecond || v.ClaimTTL > 24*time.Hour:
		return v, fmt.Errorf("%w: outbox: claim TTL %v is outside 10ms..24h", pgcoord.ErrInvalidArgument, v.ClaimTTL)
	case v.MaxAttempts < 1:
		return v, fmt.Errorf("%w: outbox: max attempts %d is below 1", pgcoord.ErrInvalidArgument, v.MaxAttempts)
	case v.Backoff < 0 || v.MaxBackoff < v.Backoff:
		return v, fmt.Errorf("%w: outbox: backoff %v and max backoff %v: want 0 <= backoff <= max backoff", pgcoord.ErrInvalidArgument, v.Backoff, v.MaxBackoff)
	case v.PollInterval < 0 || v.PollInterval > time.Hour:
		return v, fmt.Errorf("%w: outbox: poll interval %v is outside 0..1h", pgcoord.ErrInvalidArgument, v.PollInterval)
	}
	if v.Claimant == "" {
		v.Claimant = pgcoord.NewHolderID()
	} else if err := pgcoord.ValidateName("outbox claimant", v.Claimant); err != nil {
		return v, err
	}
	if v.Logger == nil {
		v.Logger = slog.Default()
	}
	return v, nil
}

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
	running atomic.Bool
	mu      sync.Mutex
	cur     cursor // where the next claim resumes
	stats   struct {
		claims, claimed, delivered, failed, dead, released, fenced atomic.Int64
	}
}

// NewRelay returns a relay on pool configured by cfg. It returns an error wrapping
// pgcoord.ErrInvalidArgument (or pgcoord.ErrInvalidName for a bad topic or claimant) for
// a nil pool, a missing Handler or a setting out of range.
func NewRelay(pool *pgxpool.Pool, cfg *Config) (*Relay, error) {
	if err := pgcoord.CheckDB(pool); err != nil {
		return nil, err
	}
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	return &Relay{pool: pool, cfg: c}, nil
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
	}()
	for ctx.Err() == nil {
		n, fromStart, err := r.batch(ctx)
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil:
			r.cfg.Logger.Error("outbox: relay claim failed", "claimant", r.cfg.Claimant, "error", err)
			_ = w.Wait(ctx, listen.Jitter(r.cfg.PollInterval))
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
		_ = w.Wait(ctx, wait)
	}
	return nil
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
		r.cfg.Logger.Warn("outbox: relay cannot record whether it waits", "claimant", r.cfg.Claimant, "idle", idle, "error", pgcoord.TranslateError(err))
		return false, false
	}
	return tight, true
}

// RunBatch claims one batch, delivers it and records the outcomes, as one round of Run
// does, and returns how many messages it claimed: 0 when none was ready (after a batch
// that no limit cut short, the next one starts again from the first key). For a relay
// driven by the caller's own loop or schedule (a cron job draining the outbox), and for
// tests. It may run beside Run. On a standby it returns an error wrapping
// pgcoord.ErrReadOnly.
func (r *Relay) RunBatch(ctx context.Context) (int, error) {
	n, _, err := r.batch(ctx)
	return n, err
}

// waiter returns what Run waits on, and whether it listens: a waiter on the outbox channel
// of the pool's shared notifier, or, with NoListen or when listening fails (logged if
// warn), one that only sleeps.
func (r *Relay) waiter(ctx context.Context, warn bool) (*listen.Waiter, bool) {
	if !r.cfg.NoListen {
		channel, err := queries.OutboxChannel(ctx, r.pool)
		var w *listen.Waiter
		if err == nil {
			w, err = listen.New(ctx, r.pool, channel, "")
		}
		if err == nil {
			return w, true
		}
		if warn && ctx.Err() == nil {
			r.cfg.Logger.Warn("outbox: relay cannot listen for commits; polling", "claimant", r.cfg.Claimant, "error", err)
		}
	}
	w, _ := listen.New(ctx, r.pool, "", "") // sleeps only: never fails
	return w, false
}

// cursor is where the next claim resumes in (topic, key) order: keys are served round
// robin, so a deep backlog of some keys never starves the others.
type cursor struct{ topic, key string }

func (c cursor) atStart() bool { return c == cursor{} }

// outcome is what became of one claimed message.
type outcome struct {
	id   int64
	err  error // nil: delivered
	done bool  // false: released untried
}

// batch claims one batch from the relay's cursor, delivers it and records the outcomes;
// it returns how many messages it claimed, and whether the claim started from the first
// key (so that claiming nothing means nothing is ready).
func (r *Relay) batch(ctx context.Context) (n int, fromStart bool, err error) {
	r.mu.Lock()
	cur := r.cur
	r.mu.Unlock()
	sent := time.Now()
	rows, err := queries.OutboxClaim(ctx, r.pool, dbsqlc.OutboxClaimParams{
		Claimant: r.cfg.Claimant, MaxRows: int32(r.cfg.BatchSize), KeyLimit: int32(r.cfg.KeyBatchSize),
		MaxBytes: int64(r.cfg.BatchBytes), Ttl: dbarg.Interval(r.cfg.ClaimTTL), Topics: r.topics(),
		AfterTopic: cur.topic, AfterKey: cur.key,
	})
	if err != nil {
		return 0, cur.atStart(), fmt.Errorf("outbox: claim: %w", pgcoord.TranslateError(err))
	}
	slices.SortFunc(rows, func(a, b dbsqlc.PgcoordOutbox) int {
		return cmp.Or(cmp.Compare(a.Topic, b.Topic), cmp.Compare(a.Key, b.Key), cmp.Compare(a.ID, b.ID))
	})
	next := cursor{} // the walk reached the last key: start again from the first
	if r.maybeCut(rows) {
		// A limit may have cut the walk short (what it cut off lies after the last key in
		// (topic, key) order): resume after that key.
		last := rows[len(rows)-1]
		next = cursor{last.Topic, last.Key}
	}
	r.mu.Lock()
	r.cur = next
	r.mu.Unlock()
	if len(rows) == 0 {
		return 0, cur.atStart(), nil
	}
	r.stats.claims.Add(1)
	r.stats.claimed.Add(int64(len(rows)))
	token := dbarg.Deref(rows[0].ClaimToken)

	// Deliver until a tenth of the TTL before the claim ends, by the local clock counted
	// from the moment the claim was sent.
	dctx, cancel := context.WithDeadline(ctx, sent.Add(r.cfg.ClaimTTL-r.cfg.ClaimTTL/10))
	defer cancel()
	outcomes := r.deliver(dctx, groupByKey(rows))
	return len(rows), cur.atStart(), r.settle(ctx, token, rows, outcomes)
}

func (r *Relay) topics() []string {
	if len(r.cfg.Topics) == 0 {
		return nil
	}
	return r.cfg.Topics
}

// maybeCut reports whether a claim of rows may have been cut short by BatchSize or
// BatchBytes: it has BatchSize messages, or its payloads come within one message's
// largest payload of BatchBytes.
func (r *Relay) maybeCut(rows []dbsqlc.PgcoordOutbox) bool {
	if len(rows) == 0 {
		return false
	}
	bytes := 0
	for _, row := range rows {
		bytes += len(row.Payload)
	}
	return len(rows) == r.cfg.BatchSize || bytes > r.cfg.BatchBytes-MaxPayload
}

// groupByKey splits rows, sorted by (topic, key, id), into one slice per key.
func groupByKey(rows []dbsqlc.PgcoordOutbox) [][]dbsqlc.PgcoordOutbox {
	var groups [][]dbsqlc.PgcoordOutbox
	start := 0
	for i := 1; i <= len(rows); i++ {
		if i == len(rows) || rows[i].Topic != rows[start].Topic || rows[i].Key != rows[start].Key {
			groups = append(groups, rows[start:i])
			start = i
		}
	}
	return groups
}

// deliver runs the handler over the groups, Concurrency keys at a time, and returns the
// outcome of every message.
func (r *Relay) deliver(ctx context.Context, groups [][]dbsqlc.PgcoordOutbox) []outcome {
	results := make([][]outcome, len(groups))
	if r.cfg.Concurrency == 1 || len(groups) == 1 {
		for i, g := range groups {
			results[i] = r.deliverKey(ctx, g)
		}
	} else {
		next := make(chan int)
		var wg sync.WaitGroup
		for range min(r.cfg.Concurrency, len(groups)) {
			wg.Go(func() {
				for i := range next {
					results[i] = r.deliverKey(ctx, groups[i])
				}
			})
		}
		for i := range groups {
			next <- i
		}
		close(next)
		wg.Wait()
	}
	return slices.Concat(results...)
}

// deliverKey delivers the messages of one key in order, stopping at the first failure:
// the messages behind it are released untried, so the key keeps its order.
func (r *Relay) deliverKey(ctx context.Context, msgs []dbsqlc.PgcoordOutbox) []outcome {
	out := make([]outcome, len(msgs))
	stopped := false
	for i, row := range msgs {
		out[i].id = row.ID
		if stopped || ctx.Err() != nil {
			continue
		}
		err := r.handle(ctx, messageFrom(row))
		if err != nil && ctx.Err() != nil {
			stopped = true // stopped by shutdown or the claim's deadline: not the message's fault
			continue
		}
		out[i].done, out[i].err = true, err
		stopped = err != nil
	}
	return out
}

// handle calls the handler, turning a panic into an error.
func (r *Relay) handle(ctx context.Context, msg Message) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("outbox: handler panicked: %v", p)
		}
	}()
	return r.cfg.Handler.Handle(ctx, msg)
}

// settle records the outcomes of one claim in one statement.
func (r *Relay) settle(ctx context.Context, token int64, rows []dbsqlc.PgcoordOutbox, outcomes []outcome) error {
	arg := dbsqlc.OutboxSettleParams{
		Token: token, Delivered: []int64{}, Failed: []int64{}, Errors: []string{}, Released: []int64{},
		MaxAttempts: int32(r.cfg.MaxAttempts), Backoff: dbarg.Interval(r.cfg.Backoff),
		MaxBackoff: dbarg.Interval(r.cfg.MaxBackoff),
	}
	attempts := make(map[int64]int32, len(rows))
	for _, row := range rows {
		attempts[row.ID] = row.Attempts
	}
	var dead []int64
	for _, o := range outcomes {
		switch {
		case !o.done:
			arg.Released = append(arg.Released, o.id)
		case o.err == nil:
			arg.Delivered = append(arg.Delivered, o.id)
		default:
			arg.Failed = append(arg.Failed, o.id)
			arg.Errors = append(arg.Errors, o.err.Error())
			if int(attempts[o.id])+1 >= r.cfg.MaxAttempts {
				dead = append(dead, o.id)
			}
		}
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	n, err := queries.OutboxSettle(sctx, r.pool, arg)
	if err != nil {
		return fmt.Errorf("outbox: record outcomes of claim %d: %w", token, pgcoord.TranslateError(err))
	}
	log := r.cfg.Logger
	if fenced := len(outcomes) - int(n); fenced > 0 {
		// Which ones is not known; in practice a claim is taken over whole.
		r.stats.fenced.Add(int64(fenced))
		log.Warn("outbox: outcomes refused: the claim was taken over by another relay", "claimant", r.cfg.Claimant,
			"claim_token", token, "refused", fenced, "of", len(outcomes))
		if int(n) == 0 {
			return nil
		}
	}
	r.stats.delivered.Add(int64(len(arg.Delivered)))
	r.stats.failed.Add(int64(len(arg.Failed)))
	r.stats.released.Add(int64(len(arg.Released)))
	r.stats.dead.Add(int64(len(dead)))
	for i, id := range arg.Failed {
		if slices.Contains(dead, id) {
			log.Error("outbox: message is dead", "id", id, "attempts", attempts[id]+1, "error", arg.Errors[i])
		} else {
			log.Warn("outbox: delivery failed; will retry", "id", id, "attempts", attempts[id]+1, "error", arg.Errors[i])
		}
	}
	return nil
}
