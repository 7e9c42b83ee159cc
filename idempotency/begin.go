package idempotency

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/internal/base"
	"github.com/pgcoord/pgcoord/internal/dbarg"
	"github.com/pgcoord/pgcoord/internal/dbsqlc"
	"github.com/pgcoord/pgcoord/internal/txhandle"
	"github.com/pgcoord/pgcoord/pgcoord"
)

// BeginOpts are the options of Begin. A nil *BeginOpts means the defaults.
type BeginOpts struct {
	// Retention is how long the key is kept, from its first attempt, by the database
	// clock: at least that long, a repeat replays (or is refused); then GC removes it and
	// leaves a tombstone. Default DefaultRetention; at most MaxRetention.
	Retention time.Duration
	// Wait, if positive, makes Begin wait up to Wait for a live attempt with the key to
	// finish, and then return what it left (its stored response, or the key to execute
	// again if it rolled back). It polls, every 5ms growing to 100ms, holding no
	// connection in between; with Atomic it also waits for a place in the pool's share.
	// Zero (the default) returns ErrInFlight (or ErrBusy) at once. A positive Wait is at
	// least a millisecond and at most an hour.
	Wait time.Duration
	// Lease is how long the attempt holds its key without a renewal, by the database clock.
	// While the attempt runs, a goroutine renews it every Lease/3 (a statement on a
	// connection of the pool, taken for the statement alone); a holder that dies is taken
	// over by the first attempt after its lease lapses: at most Lease after its last
	// renewal. Default DefaultLease; MinLease to MaxLease.
	Lease time.Duration
	// Atomic makes the attempt's transaction available as Attempt.Tx: the handler's own
	// writes then commit with the stored response, or not at all. An Atomic attempt holds
	// a connection of the pool while it runs; at most half of the pool's MaxConns Atomic
	// attempts run at once, and Begin returns ErrBusy beyond that (so their handlers always
	// find connections left). The first Atomic Begin on each of the pool's connections
	// costs one round trip more (pgx hands out a pgx.Tx only for a BEGIN of its own); later
	// ones on that connection cost what a non-atomic Begin does.
	Atomic bool
	// MaxResponseBytes is the largest body Complete stores. Default
	// DefaultMaxResponseBytes; at most MaxStoredBodyBytes.
	MaxResponseBytes int
	// Tracer, if set, traces the call (see pgcoord.Tracer): its outcome (first attempt,
	// recovery, replay, in flight, mismatch, expired) and the attempt's number. Default
	// nil: not traced.
	Tracer pgcoord.Tracer
}

// Begin starts an attempt of (scope, key) for a request whose fingerprint is fingerprint
// (see Fingerprint). It returns:
//
//   - an Attempt whose Replay is not nil when the key is completed with the same
//     fingerprint: send that response again (one round trip);
//   - an Attempt holding the key otherwise: the first attempt, or the recovery of one whose
//     holder died (Attempts > 1; RecoveryPoint says how far it got). Run the work, then call
//     Complete, or Close to give up (a rollback: the next attempt executes). Always Close
//     it (a no-op after Complete).
//   - ErrInFlight while a live attempt holds the key (after waiting BeginOpts.Wait, if set);
//     ErrBusy, for Atomic, while half of the pool's connections hold Atomic attempts;
//     ErrMismatch if the key was used with another fingerprint; ErrExpired if GC removed
//     the key and its tombstone is still kept.
//
// A holding attempt holds the key with a lease on the key's row (BeginOpts.Lease), renewed
// while it runs and ended by Complete or Close; without Atomic it holds no connection
// between those statements, so its work may use every connection of pool. A new key costs
// two round trips (the claim, and the stored response); in Atomic mode the claim rides
// with the BEGIN of the handler's transaction and the stored response with its COMMIT, so
// it adds none to the handler. A replay is the claim alone, which reads the completed key
// without locking or writing it. An Atomic attempt holds a connection
// of pool until it ends, and Begin returns ErrBusy (at once) while half of the pool's
// MaxConns are held so; a pool of fewer than 2 connections is refused for Atomic.
//
// The key's times (its creation, and the expiry its Retention sets) are the database
// clock's; no option lets a caller choose them.
//
// Bad input — an invalid scope (pgcoord.ValidateName), an invalid key (ErrInvalidKey), an
// empty or over-long fingerprint, an option out of range, a nil pool — returns an error
// wrapping pgcoord.ErrInvalidName or pgcoord.ErrInvalidArgument before any SQL runs. On a
// standby, a key that is not completed returns an error wrapping pgcoord.ErrReadOnly.
func Begin(ctx context.Context, pool *pgxpool.Pool, scope, key string, fingerprint []byte, opts *BeginOpts) (*Attempt, error) {
	o, err := checkBegin(pool, scope, key, fingerprint, opts)
	if err != nil {
		return nil, err
	}
	if o.Tracer != nil {
		return beginTraced(ctx, pool, scope, key, fingerprint, o)
	}
	return begin(ctx, pool, scope, key, fingerprint, o)
}

// begin is Begin with checked input and options. With Wait, it tries again while the key
// is in flight (or, for Atomic, while the pool's Atomic share is taken), after a pause
// that grows from 5ms to 100ms, holding no connection between tries, until the key is
// free or completed or the wait has passed.
func begin(ctx context.Context, pool *pgxpool.Pool, scope, key string, fingerprint []byte, o BeginOpts) (*Attempt, error) {
	deadline := time.Now().Add(o.Wait)
	pause := 5 * time.Millisecond
	for {
		a, err := beginOnce(ctx, pool, scope, key, fingerprint, o)
		if o.Wait == 0 || !(errors.Is(err, ErrInFlight) || errors.Is(err, ErrBusy)) {
			return a, err
		}
		left := time.Until(deadline)
		if left <= 0 {
			return nil, fmt.Errorf("%w (waited %v)", err, o.Wait)
		}
		timer := time.NewTimer(min(pause, left))
		select {
		case <-ctx.Done():
			timer.Stop()
			return nil, fmt.Errorf("idempotency: begin %s/%s: %w", scope, key, ctx.Err())
		case <-timer.C:
		}
		pause = min(2*pause, 100*time.Millisecond)
	}
}

// beginOnce is one try of begin: one claim, which answers a repeat of a completed key (a
// replay), of a different request or of a live attempt's key from a plain read, and takes
// the key otherwise.
func beginOnce(ctx context.Context, pool *pgxpool.Pool, scope, key string, fingerprint []byte, o BeginOpts) (*Attempt, error) {
	a := &Attempt{scope: scope, key: key, maxBody: o.MaxResponseBytes, pool: pool, lease: o.Lease}
	if err := a.claim(ctx, pool, fingerprint, o); err != nil {
		return nil, err
	}
	return a, nil
}

// claimSQL is pgcoord_idempotency_claim. A non-Atomic attempt sends it alone (it commits
// at once); an Atomic one sends it with BEGIN, COMMIT and the BEGIN of the handler's
// transaction in one round trip (so not through sqlc). Either way it is alone in its
// transaction, which commits without waiting for the WAL flush: whatever commits later —
// the handler's writes, the stored response — flushes the WAL up to there, the claim's
// included, and a crash before that loses nothing an attempt has done in the database.
//
// A key the claim would answer from its plain read — completed (a replay), another
// request's, or held by a live attempt — is answered by the statement's own read, with the
// claim's condition; under LIMIT 1 the claim's branch then never starts. A replay costs an
// index lookup instead of a PL/pgSQL call; the claim's argument checks are skipped only
// then, and checkBegin has made them already. Any other key goes to the claim, which
// reads it again.
const claimSQL = `(SELECT k.* FROM pgcoord_idempotency_keys k
	 WHERE k.scope = $1::text AND k.key = $2::text
	   AND (k.state <> 'in_flight' OR k.fingerprint <> $3::bytea OR k.lease_expires_at > pgcoord_now()))
UNION ALL
(SELECT k.* FROM pgcoord_idempotency_claim($1::text, $2::text, $3::bytea, $4::text, $5::interval, $6::interval) k,
	set_config('synchronous_commit', 'off', true))
LIMIT 1`

// claim claims the key for a new holder: on the pool (coalesced with other attempts'
// claims), or for Atomic on the attempt's connection. A non-Atomic attempt then holds no
// connection; an Atomic one takes a slot of the pool's Atomic share and keeps a
// connection, in the open transaction its handler writes with. When the share is taken, an Atomic claim still
// answers what a repeat must hear (a replay, ErrInFlight, ErrMismatch, ErrExpired): it
// claims without a connection, and gives back a key it would hold, with ErrBusy.
func (a *Attempt) claim(ctx context.Context, pool *pgxpool.Pool, fingerprint []byte, o BeginOpts) error {
	a.holder = base.NewHolderID()
	args := []any{a.scope, a.key, fingerprint, a.holder, dbarg.Interval(o.Retention), dbarg.Interval(o.Lease)}
	onPool := func() error {
		r := coalesced(ctx, claims, keyCall{pool: pool, scope: a.scope, key: a.key, holder: a.holder, fingerprint: fingerprint,
			retention: dbarg.Interval(o.Retention), lease: dbarg.Interval(o.Lease)})
		return a.claimed(ctx, fingerprint, r.Row, r.OK, r.Err)
	}
	if !o.Atomic {
		return onPool()
	}
	slot, err := atomicSlot(pool)
	if errors.Is(err, ErrBusy) {
		if err := onPool(); err != nil || a.replay != nil {
			return err
		}
		a.finish(ctx, false) // the key is free: give it back, to run when there is room
		return ErrBusy
	}
	if err != nil {
		return err
	}
	a.slot = slot
	if a.conn, err = pool.Acquire(ctx); err != nil {
		a.finish(ctx, false)
		return fmt.Errorf("idempotency: begin %s/%s: %w", a.scope, a.key, err)
	}
	row, found, err := a.sendClaim(ctx, args)
	return a.claimed(ctx, fingerprint, row, found, err)
}

// claimed reads the outcome of a claim: the attempt holds the key (and renews its lease
// from now on), replays it, or is refused and finished.
func (a *Attempt) claimed(ctx context.Context, fingerprint []byte, row dbsqlc.PgcoordIdempotencyKey, found bool, err error) error {
	if err != nil {
		a.finish(ctx, false)
		return fmt.Errorf("idempotency: begin %s/%s: %w", a.scope, a.key, base.TranslateError(err))
	}
	if !found { // the holder released the key in the instant of the claim
		a.finish(ctx, false)
		return ErrInFlight
	}
	if err := a.decide(&row, fingerprint); err != nil || a.replay != nil {
		a.finish(ctx, false)
		return err
	}
	a.held = true
	a.startHeartbeat()
	return nil
}

// sendClaim sends BEGIN, the claim, COMMIT and BEGIN in one round trip on the Atomic
// attempt's connection, and returns the row, if any: the claim commits at once, and the
// transaction left open is the handler's. txhandle makes the pgx.Tx for it: a round trip
// more on a connection's first Atomic attempt.
func (a *Attempt) sendClaim(ctx context.Context, args []any) (row dbsqlc.PgcoordIdempotencyKey, found bool, err error) {
	b := &pgx.Batch{}
	b.Queue(claimSQL, args...)
	b.Queue("COMMIT")
	b.Queue("BEGIN")
	var br pgx.BatchResults
	if a.tx, br, err = txhandle.Begin(ctx, a.conn.Conn(), b); err != nil {
		return row, false, err
	}
	defer func() { err = errors.Join(err, br.Close()) }()
	rows, err := br.Query()
	if err != nil {
		return row, false, err
	}
	row, err = pgx.CollectExactlyOneRow(rows, pgx.RowToStructByPos[dbsqlc.PgcoordIdempotencyKey])
	found = err == nil
	if errors.Is(err, pgx.ErrNoRows) {
		err = nil
	}
	if err != nil {
		return row, false, err
	}
	if tag, err := br.Exec(); err != nil || tag.String() != "COMMIT" {
		return row, false, errors.Join(err, errors.New("the claim did not commit"))
	}
	_, err = br.Exec()
	return row, found, err
}

// decide reads the key's row: the attempt holds it, replays it, or is refused.
func (a *Attempt) decide(row *dbsqlc.PgcoordIdempotencyKey, fingerprint []byte) error {
	switch {
	case row.State == "expired":
		return ErrExpired
	case !bytes.Equal(row.Fingerprint, fingerprint):
		return ErrMismatch
	case row.State == StateCompleted:
		resp, err := toResponse(row.Status, row.Headers, row.Body)
		if err != nil {
			return fmt.Errorf("idempotency: stored response of %s/%s: %w", a.scope, a.key, err)
		}
		a.replay = resp
		return nil
	case row.Holder != a.holder:
		return ErrInFlight
	}
	a.attempts = int(row.Attempts)
	a.point, a.data = dbarg.Deref(row.RecoveryPoint), row.RecoveryData
	return nil
}

// toResponse decodes a stored response.
func toResponse(status *int32, headers, body []byte) (*Response, error) {
	r := &Response{Status: int(dbarg.Deref(status)), Header: http.Header{}, Body: body}
	if r.Body == nil {
		r.Body = []byte{}
	}
	if len(headers) > 0 {
		if err := json.Unmarshal(headers, &r.Header); err != nil {
			return nil, err
		}
	}
	return r, nil
}

// checkBegin validates Begin's input and fills in the defaults.
func checkBegin(pool *pgxpool.Pool, scope, key string, fingerprint []byte, opts *BeginOpts) (BeginOpts, error) {
	if err := check.Name("idempotency scope", scope); err != nil {
		return BeginOpts{}, err
	}
	if err := ValidateKey(key); err != nil {
		return BeginOpts{}, err
	}
	if pool == nil {
		return BeginOpts{}, check.Invalid("nil pool")
	}
	if len(fingerprint) == 0 || len(fingerprint) > MaxFingerprintLen {
		return BeginOpts{}, check.Invalid("fingerprint is %d bytes, want 1 to %d", len(fingerprint), MaxFingerprintLen)
	}
	if opts != nil && opts.Atomic && pool.Stat().MaxConns() < 2 {
		return BeginOpts{}, check.Invalid("an Atomic attempt holds a connection while its handler runs: its pool needs MaxConns of at least 2, not %d", pool.Stat().MaxConns())
	}
	return opts.withDefaults()
}

// withDefaults returns the options with defaults filled in, or an error wrapping
// pgcoord.ErrInvalidArgument for one out of range.
func (opts *BeginOpts) withDefaults() (BeginOpts, error) {
	var o BeginOpts
	if opts != nil {
		o = *opts
	}
	if o.Retention == 0 {
		o.Retention = DefaultRetention
	}
	if o.MaxResponseBytes == 0 {
		o.MaxResponseBytes = DefaultMaxResponseBytes
	}
	if o.Lease == 0 {
		o.Lease = DefaultLease
	}
	switch {
	case o.Lease < MinLease || o.Lease > MaxLease:
		return o, check.Invalid("lease %v is outside %v..%v", o.Lease, MinLease, MaxLease)
	case o.Retention < time.Millisecond || o.Retention > MaxRetention:
		return o, check.Invalid("retention %v is outside 1ms..%v", o.Retention, MaxRetention)
	case o.Wait < 0 || o.Wait > time.Hour || (o.Wait > 0 && o.Wait < time.Millisecond):
		return o, check.Invalid("wait %v is neither 0 nor within 1ms..1h", o.Wait)
	case o.MaxResponseBytes < 0 || o.MaxResponseBytes > MaxStoredBodyBytes:
		return o, check.Invalid("MaxResponseBytes %d is outside 0..%d", o.MaxResponseBytes, MaxStoredBodyBytes)
	}
	return o, nil
}

var queries dbsqlc.Queries
