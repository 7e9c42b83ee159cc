package dedupe

import (
	"context"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgcoord/pgcoord/internal/base"
	"github.com/pgcoord/pgcoord/internal/batch"
	"github.com/pgcoord/pgcoord/internal/dbarg"
	"github.com/pgcoord/pgcoord/internal/dbsqlc"
	"github.com/pgcoord/pgcoord/pgcoord"
)

// check makes this package's argument errors ("dedupe: cause").
var check = base.Check("dedupe")

// MaxKeyLen is the longest claim key, in bytes. A scope is a name: at most
// pgcoord.MaxNameLen bytes.
const MaxKeyLen = 1024

// MaxRetention is the longest Retention a claim accepts. Claims meant to be kept longer
// should be kept forever (Retention 0).
const MaxRetention = 100 * 365 * 24 * time.Hour

// UniqueViolation is the SQLSTATE of a unique violation (unique_violation).
const UniqueViolation = "23505"

// ErrTxAborted is returned by InsertOnce when its INSERT hit a unique violation inside a
// transaction: the row was already there, but PostgreSQL aborted the transaction, so every
// later statement in it fails and its COMMIT rolls back. Roll back and retry the work, or
// write the INSERT with ON CONFLICT DO NOTHING, which never aborts. The driver's
// *pgconn.PgError stays reachable with errors.As, and IsUniqueViolation reports true.
var ErrTxAborted = errors.New("dedupe: unique violation aborted the transaction")

// ClaimOpts are the options of Claim. A nil *ClaimOpts means the defaults.
type ClaimOpts struct {
	// Retention is how long the claim is kept at least: it expires Retention after the
	// claim (by the database clock) and GC removes it after that. Until GC removes it, an
	// expired claim still counts: a later Claim of the key returns false. Zero (the
	// default) keeps the claim forever. At least a microsecond (the database's precision)
	// and at most MaxRetention.
	Retention time.Duration
}

// Claim claims (scope, key) inside the caller's transaction tx: it returns true the first
// time the pair is claimed, and false for every later attempt. The claim becomes
// permanent only when tx commits: if tx rolls back, it leaves nothing behind and the next
// Claim of the pair returns true again. Do the work the claim protects in the same tx
// (insert the email_sends row, mark the webhook processed, ...), so that the claim and the
// effect commit or vanish together. One round trip; the claim's time, and the start of
// its Retention, is the database clock (the transaction's start).
//
// A concurrent Claim of the same pair in another transaction blocks until the first
// transaction ends (the pair is a primary key), then returns false if the first one
// committed and true if it rolled back. Under REPEATABLE READ or SERIALIZABLE, the blocked
// Claim fails instead with SQLSTATE 40001 (serialization_failure) when the first one
// committed after its snapshot was taken: roll back and retry the whole transaction, whose
// Claim then returns false. See the package documentation.
//
// Bad input — an empty scope or key, a scope longer than pgcoord.MaxNameLen or a key
// longer than MaxKeyLen bytes, either not valid UTF-8 or holding a NUL byte — returns an
// error wrapping pgcoord.ErrInvalidName; a nil tx, a negative Retention, one above
// MaxRetention or a positive one below a microsecond an error wrapping
// pgcoord.ErrInvalidArgument, before any SQL runs.
// On a standby it returns an error wrapping pgcoord.ErrReadOnly.
func Claim(ctx context.Context, tx pgx.Tx, scope, key string, opts *ClaimOpts) (bool, error) {
	if err := validate(scope, key); err != nil {
		return false, err
	}
	if err := check.DB(tx); err != nil {
		return false, check.Invalid("nil transaction")
	}
	var o ClaimOpts
	if opts != nil {
		o = *opts
	}
	if o.Retention < 0 || o.Retention > MaxRetention || (o.Retention > 0 && o.Retention < time.Microsecond) {
		return false, check.Invalid("retention %v is neither 0 (forever) nor within %v..%v", o.Retention, time.Microsecond, MaxRetention)
	}
	arg := dbsqlc.DedupeClaimParams{Scope: scope, Key: key}
	if o.Retention > 0 {
		arg.Retention = dbarg.Interval(o.Retention)
	}
	n, err := queries.DedupeClaim(ctx, tx, arg)
	if err != nil {
		return false, fmt.Errorf("dedupe: claim %s/%s: %w", scope, key, base.TranslateError(err))
	}
	return n == 1, nil
}

// validate checks a claim's scope and key.
func validate(scope, key string) error {
	if err := check.Name("dedupe scope", scope); err != nil {
		return err
	}
	switch {
	case key == "":
		return check.InvalidName("dedupe key is empty")
	case len(key) > MaxKeyLen:
		return check.InvalidName("dedupe key is %d bytes, more than the maximum of %d", len(key), MaxKeyLen)
	case !utf8.ValidString(key):
		return check.InvalidName("dedupe key is not valid UTF-8")
	}
	for i := 0; i < len(key); i++ {
		if key[i] == 0 {
			return check.InvalidName("dedupe key contains a NUL byte")
		}
	}
	return nil
}

// Defaults and bounds of GCOpts.
const (
	DefaultGCBatch = 1000
	MaxGCBatch     = 100000
)

// GCOpts are the options of GC. A nil *GCOpts means the defaults.
type GCOpts struct {
	// Batch is how many claims one statement deletes at most. Default DefaultGCBatch
	// (1000); at most MaxGCBatch.
	Batch int
	// DryRun deletes nothing: GC returns how many claims it would delete now.
	DryRun bool
	// Progress, if set, is called after each batch with the number deleted so far (with
	// DryRun, once with the count).
	Progress func(deleted int64)
}

// GC deletes expired claims (those whose Retention has passed, by the database clock) and
// returns how many it deleted. It deletes in batches of GCOpts.Batch, each its own
// statement, until a batch deletes fewer than Batch rows: with a pool (or a connection
// outside a transaction) each batch is a short transaction of its own, so GC neither holds
// locks for long nor leaves a huge transaction's worth of dead rows at once. Passing a
// pgx.Tx makes the whole GC one transaction. Claims kept forever (Retention 0) are never
// deleted. It stops at the first error or when ctx is done, and returns the number deleted
// until then with the error. Concurrent GCs are safe: each claim is deleted once, and a GC
// whose batch came up short because another GC took rows stops, leaving the rest to it.
//
// A nil db, or a Batch outside 1..MaxGCBatch, returns an error wrapping
// pgcoord.ErrInvalidArgument before any SQL runs.
func GC(ctx context.Context, db pgcoord.DBTX, opts *GCOpts) (deleted int64, err error) {
	if err := check.DB(db); err != nil {
		return 0, err
	}
	var o GCOpts
	if opts != nil {
		o = *opts
	}
	if o.Batch == 0 {
		o.Batch = DefaultGCBatch
	}
	if o.Batch < 1 || o.Batch > MaxGCBatch {
		return 0, check.Invalid("GC batch %d is outside 1..%d", o.Batch, MaxGCBatch)
	}
	deleted, err = batch.Delete(ctx, o.Batch, o.DryRun, o.Progress,
		func(ctx context.Context) (int64, error) { return queries.DedupeCountExpired(ctx, db) },
		func(ctx context.Context) (int64, error) { return queries.DedupeGC(ctx, db, int32(o.Batch)) })
	if err != nil {
		return deleted, fmt.Errorf("dedupe: GC: %w", base.TranslateError(err))
	}
	return deleted, nil
}

// IsUniqueViolation reports whether err is, or wraps, a PostgreSQL unique violation
// (SQLSTATE 23505): an INSERT or UPDATE found the row it would create already there.
func IsUniqueViolation(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == UniqueViolation
}

// InsertOnce runs sql, an INSERT into the caller's own table guarded by a UNIQUE
// constraint (email_sends(user_id, campaign_id), payments(order_id), ...), with args, and
// reports whether it inserted a row. It returns false, nil when the row was already there,
// which it learns in one of two ways:
//
//   - The INSERT has ON CONFLICT DO NOTHING and affected no row. This works everywhere,
//     in autocommit and inside a transaction, and is the form to use in transactions.
//   - The INSERT has no ON CONFLICT clause and failed with a unique violation (23505).
//     That is only harmless when db runs it as its own statement (a pool, or a connection
//     outside a transaction): inside a transaction PostgreSQL aborts the transaction, and
//     InsertOnce returns an error wrapping ErrTxAborted instead of false, so the caller
//     cannot carry on in a transaction that will roll back. It detects this for a pgx.Tx,
//     a *pgx.Conn and a *pgxpool.Conn.
//
// Either way a second INSERT of the same row never creates a duplicate, concurrent ones
// included: the constraint decides. A statement that is not an INSERT returns an error
// wrapping pgcoord.ErrInvalidArgument after it ran. A nil db or an empty sql returns an
// error wrapping pgcoord.ErrInvalidArgument before any SQL runs. Other errors are
// returned wrapped, the *pgconn.PgError reachable with errors.As.
// On a standby it returns an error wrapping pgcoord.ErrReadOnly.
func InsertOnce(ctx context.Context, db pgcoord.DBTX, sql string, args ...any) (inserted bool, err error) {
	if err := check.DB(db); err != nil {
		return false, err
	}
	if sql == "" {
		return false, check.Invalid("InsertOnce: empty SQL")
	}
	tag, err := db.Exec(ctx, sql, args...)
	if err != nil {
		if !IsUniqueViolation(err) {
			return false, fmt.Errorf("dedupe: insert once: %w", base.TranslateError(err))
		}
		if inFailedTx(db) {
			return false, fmt.Errorf("%w (use INSERT ... ON CONFLICT DO NOTHING inside transactions): %w", ErrTxAborted, err)
		}
		return false, nil
	}
	if !tag.Insert() {
		return false, check.Invalid("InsertOnce ran a %s statement; it is for INSERTs", commandName(tag))
	}
	return tag.RowsAffected() > 0, nil
}

// inFailedTx reports whether db's session is in a transaction that an error aborted. A
// pgx.Tx is one by definition once a statement failed in it.
func inFailedTx(db pgcoord.DBTX) bool {
	switch c := db.(type) {
	case pgx.Tx:
		return true
	case interface{ Conn() *pgx.Conn }: // *pgxpool.Conn
		return c.Conn().PgConn().TxStatus() == 'E'
	case interface{ PgConn() *pgconn.PgConn }: // *pgx.Conn
		return c.PgConn().TxStatus() == 'E'
	}
	return false
}

// commandName is the command of a tag ("UPDATE" of "UPDATE 3").
func commandName(tag pgconn.CommandTag) string {
	s := tag.String()
	for i := 0; i < len(s); i++ {
		if s[i] == ' ' {
			return s[:i]
		}
	}
	if s == "" {
		return "empty"
	}
	return s
}

var queries dbsqlc.Queries
