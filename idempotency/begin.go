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
	"github.com/jackc/pgx/v5/pgconn"
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
	// again if it rolled back). Zero (the default) returns ErrInFlight at once. A positive
	// Wait is at least a millisecond and at most an hour.
	Wait time.Duration
	// Atomic makes the attempt's transaction available as Attempt.Tx: the handler's own
	// writes then commit with the stored response, or not at all. The first Atomic Begin on
	// each of the pool's connections costs one round trip more (pgx hands out a pgx.Tx only
	// for a BEGIN of its own); later ones on that connection cost what a non-atomic Begin
	// does.
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
//     ErrMismatch if the key was used with another fingerprint; ErrExpired if GC removed
//     the key and its tombstone is still kept.
//
// A holding attempt keeps one connection of pool, in an open transaction holding the key's
// advisory lock, until Complete or Close: that lock is how others know it is alive, and it
// goes away with the connection if the process dies. A new key costs three round trips
// (a lookup, BEGIN with the claim, and the COMMIT with the stored response); in Atomic mode
// the BEGIN and COMMIT are the handler's own, so it adds one round trip to the handler.
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

// begin is Begin with checked input and options.
func begin(ctx context.Context, pool *pgxpool.Pool, scope, key string, fingerprint []byte, o BeginOpts) (*Attempt, error) {
	a := &Attempt{scope: scope, key: key, maxBody: o.MaxResponseBytes}
	// One plain read answers repeats of a completed key (a replay is one round trip) and
	// refuses mismatched and expired ones.
	row, err := queries.IdempotencyLookup(ctx, pool, dbsqlc.IdempotencyLookupParams{Scope: scope, Key: key})
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("idempotency: look up %s/%s: %w", scope, key, err)
	}
	if err == nil && (row.State != StateInFlight || !bytes.Equal(row.Fingerprint, fingerprint)) {
		if err := a.decide(&row, fingerprint); err != nil {
			return nil, err
		}
		return a, nil
	}
	if err := a.claim(ctx, pool, fingerprint, o); err != nil {
		return nil, err
	}
	return a, nil
}

// beginSQL is pgcoord_idempotency_begin, sent in one round trip with the BEGIN of the
// attempt's transaction (so not through sqlc).
const beginSQL = `SELECT k.* FROM pgcoord_idempotency_begin($1::text, $2::text, $3::bytea, $4::text, $5::interval, $6::interval) k`

// claim opens the attempt's transaction and claims the key in it.
func (a *Attempt) claim(ctx context.Context, pool *pgxpool.Pool, fingerprint []byte, o BeginOpts) error {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("idempotency: begin %s/%s: %w", a.scope, a.key, err)
	}
	a.conn = conn
	a.holder = base.NewHolderID()
	args := []any{a.scope, a.key, fingerprint, a.holder, dbarg.Interval(o.Retention), nil}
	if o.Wait > 0 {
		args[5] = dbarg.Interval(o.Wait)
	}
	row, found, err := a.sendBegin(ctx, args, o.Atomic)
	if err != nil {
		a.Close(ctx)
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "55P03" { // lock_timeout: Wait passed
			return fmt.Errorf("%w (waited %v)", ErrInFlight, o.Wait)
		}
		return fmt.Errorf("idempotency: begin %s/%s: %w", a.scope, a.key, base.TranslateError(err))
	}
	if !found { // a live attempt holds the key and has not committed its first phase
		a.Close(ctx)
		return ErrInFlight
	}
	if err := a.decide(&row, fingerprint); err != nil || a.replay != nil {
		a.Close(ctx)
		return err
	}
	return nil
}

// sendBegin sends BEGIN and pgcoord_idempotency_begin in one round trip, and returns the
// row, if any. An Atomic attempt also needs a pgx.Tx: txhandle makes one, a round trip more
// on a connection's first Atomic attempt.
func (a *Attempt) sendBegin(ctx context.Context, args []any, atomic bool) (row dbsqlc.PgcoordIdempotencyKey, found bool, err error) {
	b := &pgx.Batch{}
	var br pgx.BatchResults
	if atomic {
		b.Queue(beginSQL, args...)
		if a.tx, br, err = txhandle.Begin(ctx, a.conn.Conn(), b); err != nil {
			return row, false, err
		}
	} else {
		b.Queue("BEGIN")
		b.Queue(beginSQL, args...)
		br = a.conn.SendBatch(ctx, b)
	}
	defer func() { err = errors.Join(err, br.Close()) }()
	if !atomic {
		if _, err = br.Exec(); err != nil {
			return row, false, err
		}
	}
	rows, err := br.Query()
	if err != nil {
		return row, false, err
	}
	row, err = pgx.CollectExactlyOneRow(rows, pgx.RowToStructByPos[dbsqlc.PgcoordIdempotencyKey])
	if errors.Is(err, pgx.ErrNoRows) {
		return row, false, nil
	}
	return row, err == nil, err
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
	switch {
	case o.Retention < time.Millisecond || o.Retention > MaxRetention:
		return o, check.Invalid("retention %v is outside 1ms..%v", o.Retention, MaxRetention)
	case o.Wait < 0 || o.Wait > time.Hour || (o.Wait > 0 && o.Wait < time.Millisecond):
		// The wait is a lock_timeout: milliseconds.
		return o, check.Invalid("wait %v is neither 0 nor within 1ms..1h", o.Wait)
	case o.MaxResponseBytes < 0 || o.MaxResponseBytes > MaxStoredBodyBytes:
		return o, check.Invalid("MaxResponseBytes %d is outside 0..%d", o.MaxResponseBytes, MaxStoredBodyBytes)
	}
	return o, nil
}

var queries dbsqlc.Queries
