package semaphore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgcoord/pgcoord/internal/base"
	"github.com/pgcoord/pgcoord/internal/dbarg"
	"github.com/pgcoord/pgcoord/internal/dbsqlc"
	"github.com/pgcoord/pgcoord/internal/listen"
	"github.com/pgcoord/pgcoord/internal/tracing"
	"github.com/pgcoord/pgcoord/pgcoord"
)

// Errors returned by this package. Driver errors are wrapped, so a *pgconn.PgError stays
// reachable with errors.As.
var (
	// ErrFull means TryAcquire was refused: the key has its limit of live permits, or
	// others wait in line for it (a TryAcquire never jumps the line). The refusal is
	// counted (KeyStatus.Refused) and nothing else changed.
	ErrFull = errors.New("semaphore: full")
	// ErrLost means the permit a Renew, Release or Done names (key + holder + token) is no
	// longer held: it expired (for Renew and Done, even if no admission reclaimed it yet),
	// an operator drained the key, or it was released or done. A call that returns it
	// changed nothing; after Done, the caller's transaction must roll back.
	ErrLost = errors.New("semaphore: permit lost")
	// ErrNoWork means Next found no key to serve: none has a unit of demand that no live
	// permit of Next holds, and room for one more permit (with nobody in line for it).
	ErrNoWork = errors.New("semaphore: no key to serve")
	// ErrNotFound means no semaphore of that key exists.
	ErrNotFound = errors.New("semaphore: no such key")
)

// Bounds of the arguments, checked before any SQL runs.
const (
	// MinTTL is the shortest permit pgcoord grants.
	MinTTL = time.Millisecond
	// MaxTTL is the longest permit pgcoord grants. A permit is meant to be renewed: a TTL
	// of hours means a crashed worker keeps its slot that long.
	MaxTTL = 24 * time.Hour
	// MaxLimit is the largest limit of a key.
	MaxLimit = 1_000_000
	// MaxWeight is the largest weight of a key (the database refuses more).
	MaxWeight = 1_000_000
)

// Permit is one of the at most limit concurrent slots of a key, held by one holder. It is a
// plain value: pass it to Renew and Release (in a defer), and send Token with every write
// the job makes.
type Permit struct {
	// Key is the semaphore's key (a tenant, say).
	Key string
	// Holder identifies the holder of this permit.
	Holder string
	// Token is the permit's fence token: higher than every earlier permit of Key, so a job
	// redone under a later permit of the same key can fence out the writes of a holder
	// that lost its permit (see package fenced).
	Token int64
	// AcquiredAt is when the permit was granted, by the database clock (the start of the
	// granting transaction).
	AcquiredAt time.Time
	// ExpiresAt is when the permit expires unless renewed, by the database clock.
	ExpiresAt time.Time
	// TrustUntil is the local instant (with Go's monotonic clock reading) after which the
	// holder must stop trusting the permit even if it has heard nothing: the start of the
	// request that granted or renewed it, plus the TTL the database reported left, minus
	// the safety margin, as leases.Lease.TrustUntil. Zero in permits read by an observer
	// (Drain, Permits).
	TrustUntil time.Time
}

// Trusted reports whether the holder may still rely on the permit by its own clock
// (time.Now() before TrustUntil). It is a local judgement only: fence every write anyway.
func (p Permit) Trusted() bool { return time.Now().Before(p.TrustUntil) }

// AcquireOpts are the options of TryAcquire and Acquire. A nil *AcquireOpts means the
// defaults.
type AcquireOpts struct {
	// Holder identifies the holder. Default: a new identity per call ("host/pid/random",
	// pgcoord.NewHolderID), so two calls never share a permit. A holder that asks again
	// while it holds a permit of the key gets that permit back (same token) instead of a
	// second one; so one identity must not be shared by two jobs.
	Holder string
	// SafetyMargin is subtracted from the TTL to give the local trust deadline. Default: a
	// tenth of the TTL. It must be less than the TTL.
	SafetyMargin time.Duration
	// PollInterval bounds how long Acquire waits between attempts when no notification
	// arrives (behind a transaction-mode pooler, or when a holder dies without
	// releasing). Default 1s, with ±20% jitter. A waiter that stops polling (a dead
	// process) loses its place in line after twice this interval plus a second (the
	// second covers slow round trips: a live waiter must not lose its place to them).
	PollInterval time.Duration
	// NoListen makes Acquire poll only, without LISTEN. Behind a transaction-mode pooler,
	// where notifications are not delivered, the pool's first wait finds the pooler and
	// polls without it; NoListen only saves that one check.
	NoListen bool
	// SyncCommit is the synchronous_commit level of the admission's commit, as
	// leases.AcquireOpts.SyncCommit: "on", "remote_write" or "remote_apply" make just this
	// grant wait for the synchronous standbys (see docs/failover.md). Default "": the
	// server's setting.
	SyncCommit string
	// Metrics, if set, receives the latency and the outcome of the call (see Metrics).
	// Default nil: not counted.
	Metrics *Metrics
	// Tracer, if set, traces the call (see pgcoord.Tracer): Acquire's wait and admission,
	// TryAcquire's admission or refusal. Default nil: not traced.
	Tracer pgcoord.Tracer
}

func (o *AcquireOpts) withDefaults(ttl time.Duration) (AcquireOpts, error) {
	var v AcquireOpts
	if o != nil {
		v = *o
	}
	var err error
	if v.Holder, err = holderOrNew(v.Holder); err != nil {
		return v, err
	}
	if v.SafetyMargin, err = safetyMargin(v.SafetyMargin, ttl); err != nil {
		return v, err
	}
	if err := check.SyncCommit(v.SyncCommit); err != nil {
		return v, err
	}
	if v.PollInterval == 0 {
		v.PollInterval = time.Second
	}
	if v.PollInterval < 0 {
		return v, check.Invalid("negative poll interval %v", v.PollInterval)
	}
	return v, nil
}

func holderOrNew(h string) (string, error) {
	if h == "" {
		return base.NewHolderID(), nil
	}
	return h, check.Name("holder", h)
}

func safetyMargin(m, ttl time.Duration) (time.Duration, error) {
	if m == 0 {
		m = ttl / 10
	}
	if m < 0 || m >= ttl {
		return 0, check.Invalid("safety margin %v must be between 0 and the TTL %v", m, ttl)
	}
	return m, nil
}

func validateKey(key string) error { return check.Name("semaphore key", key) }

func validateTTL(ttl time.Duration) error {
	if ttl < MinTTL || ttl > MaxTTL {
		return check.Invalid("TTL %v is outside %v..%v", ttl, MinTTL, MaxTTL)
	}
	return nil
}

func validateLimit(limit int) error {
	if limit < 1 || limit > MaxLimit {
		return check.Invalid("limit %d is outside 1..%d", limit, MaxLimit)
	}
	return nil
}

func validateAcquire(key string, limit int, ttl time.Duration) error {
	if err := validateKey(key); err != nil {
		return err
	}
	if err := validateLimit(limit); err != nil {
		return err
	}
	return validateTTL(ttl)
}

// TryAcquire grants the caller a permit of key for ttl, in one round trip, if fewer than
// the key's limit of permits are live and nobody waits in line for it; otherwise it returns
// ErrFull at once. Permits past their expiry (dead workers) are reclaimed by this
// admission, judged by the database clock. The permit's fence token is higher than every
// earlier permit's of key.
//
// limit is the key's limit if this call creates the key; an existing key keeps its stored
// limit (set it with SetLimit). db may be the caller's transaction: the permit then exists
// only if that transaction commits, and the key's row stays locked until it ends, so keep
// such a transaction short.
//
// If the reply is lost after the grant committed (a connection cut), TryAcquire retries
// once as the same holder and gets its own permit back instead of ErrFull.
func TryAcquire(ctx context.Context, db pgcoord.DBTX, key string, limit int, ttl time.Duration, opts *AcquireOpts) (Permit, error) {
	if err := validateAcquire(key, limit, ttl); err != nil {
		return Permit{}, err
	}
	if err := check.DB(db); err != nil {
		return Permit{}, err
	}
	generated := opts == nil || opts.Holder == ""
	o, err := opts.withDefaults(ttl)
	if err != nil {
		return Permit{}, err
	}
	if o.Tracer == nil {
		return tryAcquire(ctx, db, key, limit, ttl, o, generated)
	}
	ctx, span := tracing.Start(ctx, o.Tracer, tracing.SemTryAcquire, keyAttrs(key, limit, o.Holder)...)
	p, err := tryAcquire(ctx, db, key, limit, ttl, o, generated)
	if err == nil {
		span.Set(tracing.Int(tracing.AttrToken, p.Token))
	}
	span.End(err)
	return p, err
}

// keyAttrs are the attributes of a traced admission to key.
func keyAttrs(key string, limit int, holder string) []pgcoord.Attr {
	return []pgcoord.Attr{tracing.Str(tracing.AttrKey, key), tracing.Int(tracing.AttrLimit, int64(limit)),
		tracing.Str(tracing.AttrHolder, holder)}
}

// tryAcquire is TryAcquire with checked input and options.
func tryAcquire(ctx context.Context, db pgcoord.DBTX, key string, limit int, ttl time.Duration, o AcquireOpts, generated bool) (Permit, error) {
	start := time.Now()
	for attempt := 0; ; attempt++ {
		sent := time.Now()
		r := admit(ctx, acquireCall{db: db, key: key, holder: o.Holder, generated: generated, limit: int32(limit), ttl: dbarg.Interval(ttl),
			syncCommit: o.SyncCommit})
		switch err := r.Err; {
		case r.OK:
			o.Metrics.admitted(key, time.Since(start))
			return permitFrom(r.Row, sent, o.SafetyMargin), nil
		case err == nil:
			o.Metrics.refused(key)
			return Permit{}, fmt.Errorf("%w: %q", ErrFull, key)
		case attempt == 0 && listen.Ambiguous(ctx, err):
			continue // the grant may have committed: ask again as the same holder
		default:
			return Permit{}, fmt.Errorf("semaphore: acquire %q: %w", key, base.TranslateError(err))
		}
	}
}

// RenewOpts are the options of Renew. A nil *RenewOpts means the defaults.
type RenewOpts struct {
	// AsyncCommit commits the renewal without waiting for the WAL flush
	// (synchronous_commit = off for that transaction): faster by the cost of a WAL flush
	// (1.3-1.5x here with 1-8 workers; see docs/benchmarks.md).
	// Losing the renewal in a crash only shortens the permit. Never set it when db is a
	// transaction that also carries other writes: they would lose durability too.
	AsyncCommit bool
	// SafetyMargin as in AcquireOpts. Default: a tenth of the TTL.
	SafetyMargin time.Duration
}

// Renew extends the permit p to ttl from now (by the database clock), in one round trip, and
// returns it with a new ExpiresAt and TrustUntil. It returns ErrLost, having changed
// nothing, if p is no longer held — including when it has expired, even if nobody was
// admitted since: a holder that let its permit expire must acquire again. A job that runs
// longer than its TTL must renew (heartbeat) well before expiry, every third of the TTL say.
func Renew(ctx context.Context, db pgcoord.DBTX, p Permit, ttl time.Duration, opts *RenewOpts) (Permit, error) {
	if err := validateKey(p.Key); err != nil {
		return Permit{}, err
	}
	if err := validateTTL(ttl); err != nil {
		return Permit{}, err
	}
	if err := check.DB(db); err != nil {
		return Permit{}, err
	}
	var o RenewOpts
	if opts != nil {
		o = *opts
	}
	margin, err := safetyMargin(o.SafetyMargin, ttl)
	if err != nil {
		return Permit{}, err
	}
	sent := time.Now()
	r := renew(ctx, renewCall{db: db, key: p.Key, holder: p.Holder, token: p.Token, ttl: dbarg.Interval(ttl), durable: !o.AsyncCommit})
	if r.Err != nil {
		return Permit{}, fmt.Errorf("semaphore: renew %q: %w", p.Key, base.TranslateError(r.Err))
	}
	if !r.OK {
		return Permit{}, fmt.Errorf("%w: %q token %d", ErrLost, p.Key, p.Token)
	}
	return permitFrom(r.Row, sent, margin), nil
}

// Release frees the permit p in one round trip, waking the first Acquire waiting for its
// key. A permit of Next gives its unit of demand back: its job is queued again. Release is
// scoped to the permit (key + holder + token): if p is no longer held it changes nothing
// and returns ErrLost, so calling it twice, or after Done, is harmless and a late release
// never frees someone else's slot. Meant for defer. A permit that expired but was not yet
// reclaimed by an admission is still there: Release frees it and returns nil.
func Release(ctx context.Context, db pgcoord.DBTX, p Permit) error {
	if err := validateKey(p.Key); err != nil {
		return err
	}
	if err := check.DB(db); err != nil {
		return err
	}
	r := release(ctx, releaseCall{db: db, key: p.Key, holder: p.Holder, token: p.Token})
	if r.Err != nil {
		return fmt.Errorf("semaphore: release %q: %w", p.Key, base.TranslateError(r.Err))
	}
	if !r.OK {
		return fmt.Errorf("%w: %q token %d was not held at release", ErrLost, p.Key, p.Token)
	}
	return nil
}

// Done ends the permit p because its unit of work is done: in tx, the caller's
// transaction that removes the job from the application's queue, it consumes the unit of
// the key's demand that p reserved (a permit of Next) and frees p's slot, like a Release.
// The job and its unit of demand then go together: both when tx commits, neither if it
// rolls back (the permit then stays held, and a deferred Release gives the unit back).
// Call it last in tx: it locks the key's row until tx ends, and admissions to the key
// wait for that.
//
// It returns ErrLost, having changed nothing, if p is no longer live by the database
// clock: it expired — its unit went back to the key's demand and another worker may have
// taken the job since — or was drained or released. The caller must then roll tx back,
// leaving the job queued: deleting it would leave its unit of demand with no job behind
// it. On a permit of TryAcquire or Acquire, which reserves no unit, Done only frees the
// slot, with tx.
func Done(ctx context.Context, tx pgx.Tx, p Permit) error {
	if err := validateKey(p.Key); err != nil {
		return err
	}
	if p.Token < 1 {
		return check.Invalid("done %q: token %d is not a permit's", p.Key, p.Token)
	}
	if err := check.DB(tx); err != nil {
		return err
	}
	n, err := queries.SemaphoreDone(ctx, tx, dbsqlc.SemaphoreDoneParams{
		Key: p.Key, Holder: p.Holder, FenceToken: p.Token,
	})
	if err != nil {
		return fmt.Errorf("semaphore: done %q: %w", p.Key, base.TranslateError(err))
	}
	if n == 0 {
		return fmt.Errorf("%w: %q token %d was not live at done", ErrLost, p.Key, p.Token)
	}
	return nil
}

// permitFrom turns a granted row into a Permit. sent is the local instant the request was
// sent: the trust deadline counts the TTL left by the database clock from there.
func permitFrom(r dbsqlc.SemaphoreAcquireRow, sent time.Time, margin time.Duration) Permit {
	return Permit{
		Key: r.Key, Holder: r.Holder, Token: r.FenceToken, AcquiredAt: r.AcquiredAt, ExpiresAt: r.ExpiresAt,
		TrustUntil: sent.Add(r.ExpiresAt.Sub(r.DbNow) - margin),
	}
}

var queries dbsqlc.Queries
