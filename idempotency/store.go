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

	"github.com/pgcoord/pgcoord/internal/dbarg"
	"github.com/pgcoord/pgcoord/internal/dbsqlc"
	"github.com/pgcoord/pgcoord/pgcoord"
)

// Limits and defaults.
const (
	// MaxKeyLen is the longest idempotency key, in bytes. A key is 1 to MaxKeyLen printable
	// ASCII characters (0x20 to 0x7E). A scope is a pgcoord name: 1 to pgcoord.MaxNameLen
	// bytes of UTF-8 without NUL.
	MaxKeyLen = 255
	// MaxFingerprintLen is the longest fingerprint Begin accepts, in bytes (a SHA-512 fits).
	MaxFingerprintLen = 64
	// DefaultRetention is how long a key is kept by default: 24 hours, as Stripe does.
	DefaultRetention = 24 * time.Hour
	// MaxRetention bounds Retention and Tombstone.
	MaxRetention = 100 * 365 * 24 * time.Hour
	// DefaultMaxResponseBytes is the default limit on a stored response body: 1 MiB.
	DefaultMaxResponseBytes = 1 << 20
	// MaxStoredBodyBytes bounds BeginOpts.MaxResponseBytes: the largest body the store
	// keeps, 16 MiB.
	MaxStoredBodyBytes = 16 << 20
	// MaxStoredHeaderBytes is the most a response's stored headers may take, in bytes of
	// JSON text as PostgreSQL prints them (octet_length(headers::text) of the key's row,
	// about the size of the names and values plus 10 bytes a header).
	MaxStoredHeaderBytes = 64 << 10
	// MaxRecoveryDataBytes is the most data a recovery point may carry: 1 MiB.
	MaxRecoveryDataBytes = 1 << 20
	// DefaultTombstone is how long GC keeps a tombstone of a deleted key by default: 30 days.
	DefaultTombstone = 30 * 24 * time.Hour
)

// The states of a key (KeyInfo.State).
const (
	StateInFlight  = "in_flight" // an attempt holds it, or its holder died (Stuck)
	StateCompleted = "completed" // its response is stored
)

// Errors returned by Begin and the middleware's decisions. They map to HTTP statuses as the
// package documentation's table says.
var (
	// ErrInFlight: another attempt with the key is running (or, with BeginOpts.Wait, still
	// running when the wait ended).
	ErrInFlight = errors.New("idempotency: a request with this key is in flight")
	// ErrMismatch: the key was used for a request with a different fingerprint.
	ErrMismatch = errors.New("idempotency: key reused for a different request")
	// ErrExpired: the key's retention passed and GC removed it; its tombstone refuses it.
	ErrExpired = errors.New("idempotency: key has expired and cannot be used again")
	// ErrKeyRequired: the middleware got no key on a route that requires one.
	ErrKeyRequired = errors.New("idempotency: key required")
	// ErrInvalidKey: the key is empty, longer than MaxKeyLen or not printable ASCII. It is
	// returned wrapped together with pgcoord.ErrInvalidName.
	ErrInvalidKey = errors.New("idempotency: invalid key")
	// ErrTooLarge: a response body over the limit; nothing was stored and the attempt was
	// rolled back, so a retry executes again.
	ErrTooLarge = errors.New("idempotency: response too large to store")
	// ErrLost: the attempt no longer holds its key: another attempt took it over (possible
	// only in the instant of a Checkpoint), or the attempt's transaction failed.
	ErrLost = errors.New("idempotency: key no longer held by this attempt")
	// ErrNotFound: Get found no such key.
	ErrNotFound = errors.New("idempotency: no such key")
)

// Response is a stored response: what a replay sends back, byte for byte.
type Response struct {
	Status int
	// Header holds the stored headers only (the middleware's Config.StoreHeaders).
	Header http.Header
	Body   []byte
}

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
	// writes then commit with the stored response, or not at all. It costs one round trip
	// more than a non-atomic Begin (pgx hands out a pgx.Tx only for a BEGIN of its own).
	Atomic bool
	// MaxResponseBytes is the largest body Complete stores. Default
	// DefaultMaxResponseBytes; at most MaxStoredBodyBytes.
	MaxResponseBytes int
}

// Attempt is the outcome of Begin: a stored response to replay (Replay is not nil), or an
// attempt that holds the key until Complete or Close. An Attempt is not safe for concurrent
// use.
type Attempt struct {
	scope, key, holder string
	replay             *Response
	attempts           int
	point              string
	data               []byte
	conn               *pgxpool.Conn // nil once finished
	tx                 pgx.Tx        // Atomic only
	maxBody            int
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
// (a lookup, BEGIN with the claim, and the COMMIT with the stored response), four with
// Atomic.
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
	a.holder = pgcoord.NewHolderID()
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
		return fmt.Errorf("idempotency: begin %s/%s: %w", a.scope, a.key, pgcoord.TranslateError(err))
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

// sendBegin sends BEGIN and pgcoord_idempotency_begin, in one round trip unless atomic
// (pgx hands out a pgx.Tx only for a BEGIN of its own), and returns the row, if any.
func (a *Attempt) sendBegin(ctx context.Context, args []any, atomic bool) (row dbsqlc.PgcoordIdempotencyKey, found bool, err error) {
	var rows pgx.Rows
	if atomic {
		if a.tx, err = a.conn.Begin(ctx); err != nil {
			return row, false, err
		}
		rows, err = a.tx.Query(ctx, beginSQL, args...)
	} else {
		b := &pgx.Batch{}
		b.Queue("BEGIN")
		b.Queue(beginSQL, args...)
		br := a.conn.SendBatch(ctx, b)
		defer func() { err = errors.Join(err, br.Close()) }()
		if _, err = br.Exec(); err != nil {
			return row, false, err
		}
		rows, err = br.Query()
	}
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

// Replay returns the stored response when Begin found the key completed, or nil when the
// attempt holds the key.
func (a *Attempt) Replay() *Response { return a.replay }

// Scope returns the attempt's scope.
func (a *Attempt) Scope() string { return a.scope }

// Key returns the attempt's idempotency key.
func (a *Attempt) Key() string { return a.key }

// Attempts returns how many attempts have held the key, this one included: 1 for the
// first, more when this one recovers the key from attempts that died after committing a
// recovery point. 0 for a replay.
func (a *Attempt) Attempts() int { return a.attempts }

// RecoveryPoint returns the last recovery point recorded with Checkpoint, by this attempt
// or by a dead one it recovers, and its data; "" when none was recorded.
func (a *Attempt) RecoveryPoint() (point string, data []byte) { return a.point, a.data }

// DerivedKey returns the key to pass to another system's own idempotency key for step of
// this attempt: DerivedKey(a.Scope(), a.Key(), step). Every attempt of the key, recovered
// ones included, derives the same one.
func (a *Attempt) DerivedKey(step string) string { return DerivedKey(a.scope, a.key, step) }

// Tx returns the attempt's transaction when Begin was called with Atomic, else nil. Write
// the work the key protects with it: it commits together with the stored response in
// Complete, or rolls back in Close. Commit and Rollback of the returned Tx return an error
// and do nothing (the attempt ends it); Begin on it makes a savepoint as usual. Checkpoint
// commits what was written so far and continues in a new transaction behind the same Tx.
func (a *Attempt) Tx() pgx.Tx {
	if a.tx == nil || a.conn == nil {
		return nil
	}
	return attemptTx{a.tx}
}

// attemptTx is the attempt's transaction handed to the work: the attempt commits it.
type attemptTx struct{ pgx.Tx }

var errTxOwned = errors.New("idempotency: the attempt's transaction is committed by Complete and rolled back by Close")

// Commit refuses: Complete commits.
func (attemptTx) Commit(context.Context) error { return errTxOwned }

// Rollback refuses: Close rolls back.
func (attemptTx) Rollback(context.Context) error { return errTxOwned }

// completeSQL and the others below are sent in one round trip with COMMIT (and BEGIN).
const (
	completeSQL   = `SELECT 1 FROM pgcoord_idempotency_complete($1::text, $2::text, $3::text, $4::int, $5::jsonb, $6::bytea)`
	checkpointSQL = `SELECT 1 FROM pgcoord_idempotency_checkpoint($1::text, $2::text, $3::text, $4::text, $5::bytea)`
	relockSQL     = `SELECT pgcoord_idempotency_relock($1::text, $2::text, $3::text)`
)

// Complete stores resp as the key's response and commits the attempt's transaction — with
// the writes made through Tx, in Atomic mode — in one round trip. Afterwards every repeat
// with the same fingerprint replays resp until the key expires. Only resp.Header is
// stored.
//
// What the store cannot keep is refused before any SQL runs, and the attempt is rolled
// back: nothing is stored, and the next attempt executes. A resp.Status outside 100..999
// (net/http's range) or a header name or value with a NUL byte returns an error wrapping
// pgcoord.ErrInvalidArgument; a body over BeginOpts.MaxResponseBytes returns ErrTooLarge;
// headers over MaxStoredHeaderBytes return an error wrapping both. A failed store returns
// an error (ErrLost if the key was taken over), also with the transaction rolled back.
func (a *Attempt) Complete(ctx context.Context, resp Response) error {
	if a.conn == nil {
		return fmt.Errorf("%w: idempotency: Complete of an attempt that does not hold its key", pgcoord.ErrInvalidArgument)
	}
	if resp.Status < 100 || resp.Status > 999 {
		a.Close(ctx)
		return fmt.Errorf("%w: idempotency: status %d is not an HTTP status (100 to 999)", pgcoord.ErrInvalidArgument, resp.Status)
	}
	if len(resp.Body) > a.maxBody {
		a.Close(ctx)
		return fmt.Errorf("%w: %d bytes, more than the limit of %d", ErrTooLarge, len(resp.Body), a.maxBody)
	}
	header := resp.Header
	if header == nil {
		header = http.Header{}
	}
	if err := checkHeaders(header); err != nil {
		a.Close(ctx)
		return err
	}
	headers, err := json.Marshal(header)
	if err != nil {
		a.Close(ctx)
		return fmt.Errorf("idempotency: encode headers: %w", err)
	}
	body := resp.Body
	if body == nil {
		body = []byte{}
	}
	// json.RawMessage, not []byte: in the exec and simple_protocol query modes pgx would send
	// []byte as bytea, which the server refuses as jsonb.
	err = a.commit(ctx, completeSQL, []any{a.scope, a.key, a.holder, resp.Status, json.RawMessage(headers), body}, false)
	if err != nil {
		return fmt.Errorf("idempotency: complete %s/%s: %w", a.scope, a.key, pgcoord.TranslateError(err))
	}
	return nil
}

// Checkpoint records a recovery point — a name, and data the work needs to resume from it —
// and commits the attempt's transaction (with the writes made through Tx so far), then
// goes on holding the key in a new transaction, in one round trip. If this process dies
// later, the attempt that recovers the key sees point and data in RecoveryPoint, and the
// phases before it committed. It returns ErrLost if another attempt took the key over in
// the instant between the two transactions (that attempt resumes from point): stop the
// work. An error ends the attempt (Close is then a no-op), except for bad input: a point
// that is not a valid name (1 to pgcoord.MaxNameLen bytes of UTF-8 without NUL; an error
// wrapping both pgcoord.ErrInvalidArgument and pgcoord.ErrInvalidName) or data over
// MaxRecoveryDataBytes (wrapping pgcoord.ErrInvalidArgument) is refused before any SQL
// runs, and the attempt goes on holding its key, its transaction untouched.
func (a *Attempt) Checkpoint(ctx context.Context, point string, data []byte) error {
	if a.conn == nil {
		return fmt.Errorf("%w: idempotency: Checkpoint of an attempt that does not hold its key", pgcoord.ErrInvalidArgument)
	}
	if err := pgcoord.ValidateName("recovery point", point); err != nil {
		return fmt.Errorf("%w: idempotency: checkpoint: %w", pgcoord.ErrInvalidArgument, err)
	}
	if len(data) > MaxRecoveryDataBytes {
		return fmt.Errorf("%w: idempotency: checkpoint %q: %d bytes of recovery data, more than the maximum of %d",
			pgcoord.ErrInvalidArgument, point, len(data), MaxRecoveryDataBytes)
	}
	if err := a.commit(ctx, checkpointSQL, []any{a.scope, a.key, a.holder, point, data}, true); err != nil {
		return fmt.Errorf("idempotency: checkpoint %s/%s at %q: %w", a.scope, a.key, point, pgcoord.TranslateError(err))
	}
	a.point, a.data = point, data
	return nil
}

// commit sends sql then COMMIT in one round trip and, with again, BEGIN and the relock
// too. Unless it goes on holding the key, the attempt is over afterwards.
func (a *Attempt) commit(ctx context.Context, sql string, args []any, again bool) (err error) {
	b := &pgx.Batch{}
	b.Queue(sql, args...)
	b.Queue("COMMIT")
	if again {
		b.Queue("BEGIN")
		b.Queue(relockSQL, a.scope, a.key, a.holder)
	}
	br := a.conn.SendBatch(ctx, b)
	_, err = br.Exec()
	tag, cerr := br.Exec()
	err = errors.Join(err, cerr)
	if err == nil && tag.String() != "COMMIT" {
		err = ErrLost // the transaction had failed: COMMIT rolled it back
	}
	var held bool
	if err == nil && again {
		if _, err = br.Exec(); err == nil {
			err = br.QueryRow().Scan(&held)
		}
		if err == nil && !held {
			err = ErrLost
		}
	}
	err = errors.Join(err, br.Close())
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "55000" {
		err = fmt.Errorf("%w: %w", ErrLost, err)
	}
	if err != nil || !again {
		a.finish(ctx, err == nil)
	}
	return err
}

// Close gives the key up if the attempt still holds it: its transaction rolls back (with
// the writes made through Tx), so the next attempt executes — from the last committed
// recovery point, if any. It is a no-op after Complete, after an error that ended the
// attempt, and for a replay; always defer it.
func (a *Attempt) Close(ctx context.Context) {
	a.finish(ctx, false)
}

// finish returns the attempt's connection to the pool, rolled back unless committed.
func (a *Attempt) finish(ctx context.Context, committed bool) {
	if a.conn == nil {
		return
	}
	conn := a.conn
	a.conn = nil
	if !committed && conn.Conn().PgConn().TxStatus() != 'I' {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_, _ = conn.Exec(rctx, "ROLLBACK") // on failure the pool destroys the connection
	}
	conn.Release()
}

// checkBegin validates Begin's input and fills in the defaults.
func checkBegin(pool *pgxpool.Pool, scope, key string, fingerprint []byte, opts *BeginOpts) (BeginOpts, error) {
	if err := pgcoord.ValidateName("idempotency scope", scope); err != nil {
		return BeginOpts{}, err
	}
	if err := ValidateKey(key); err != nil {
		return BeginOpts{}, err
	}
	if pool == nil {
		return BeginOpts{}, fmt.Errorf("%w: idempotency: nil pool", pgcoord.ErrInvalidArgument)
	}
	if len(fingerprint) == 0 || len(fingerprint) > MaxFingerprintLen {
		return BeginOpts{}, fmt.Errorf("%w: idempotency: fingerprint is %d bytes, want 1 to %d", pgcoord.ErrInvalidArgument, len(fingerprint), MaxFingerprintLen)
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
		return o, fmt.Errorf("%w: idempotency: retention %v is outside 1ms..%v", pgcoord.ErrInvalidArgument, o.Retention, MaxRetention)
	case o.Wait < 0 || o.Wait > time.Hour || (o.Wait > 0 && o.Wait < time.Millisecond):
		// The wait is a lock_timeout: milliseconds.
		return o, fmt.Errorf("%w: idempotency: wait %v is neither 0 nor within 1ms..1h", pgcoord.ErrInvalidArgument, o.Wait)
	case o.MaxResponseBytes < 0 || o.MaxResponseBytes > MaxStoredBodyBytes:
		return o, fmt.Errorf("%w: idempotency: MaxResponseBytes %d is outside 0..%d", pgcoord.ErrInvalidArgument, o.MaxResponseBytes, MaxStoredBodyBytes)
	}
	return o, nil
}

// ValidateKey checks an idempotency key: 1 to MaxKeyLen printable ASCII characters (0x20
// to 0x7E). Its error wraps both ErrInvalidKey and pgcoord.ErrInvalidName.
func ValidateKey(key string) error {
	switch {
	case key == "":
		return fmt.Errorf("%w: %w: key is empty", ErrInvalidKey, pgcoord.ErrInvalidName)
	case len(key) > MaxKeyLen:
		return fmt.Errorf("%w: %w: key is %d bytes, more than the maximum of %d", ErrInvalidKey, pgcoord.ErrInvalidName, len(key), MaxKeyLen)
	}
	for i := 0; i < len(key); i++ {
		if key[i] < 0x20 || key[i] > 0x7e {
			return fmt.Errorf("%w: %w: key has a byte 0x%02x at %d; keys are printable ASCII", ErrInvalidKey, pgcoord.ErrInvalidName, key[i], i)
		}
	}
	return nil
}

var queries dbsqlc.Queries
