// Package inbox turns the outbox's at-least-once delivery into exactly-once effects on the
// consumer's side: a consumer records each message it applies, in the same transaction as
// the message's effect, and a redelivered message finds its record and is skipped.
//
//	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
//		first, err := inbox.Claim(ctx, tx, "billing", msg.ID)
//		if err != nil || !first {
//			return err // !first: applied before; acknowledge and move on
//		}
//		// ... apply msg with tx: the effect commits together with the record ...
//		return nil
//	})
//
// The consumer's database needs pgcoord's migrations (the pgcoord_outbox_inbox table); it
// may be the producer's database or another one.
//
// # Guarantees
//
//   - Among transactions that Claim one (consumer, message id), at most one commits with
//     Claim having returned true: concurrent deliveries included (the pair is a primary
//     key, so the second Claim waits for the first transaction and then returns false if
//     it committed, true if it rolled back).
//   - The record exists if and only if the consumer's transaction committed: a consumer
//     that fails or crashes before COMMIT leaves nothing, and the redelivery applies the
//     message.
//   - GC deletes only records older than its retention, by the database clock.
//
// # Retention
//
// A record protects against redeliveries only while it exists. Keep records longer than
// any redelivery can arrive: the relay redelivers a message only while it is pending
// (at most MaxAttempts retries with their backoffs, plus a claim TTL after a crashed or
// stalled relay), and an operator's outbox retry can bring a dead message back much later.
// The default retention of GC, DefaultRetention (30 days), covers the outbox's default
// retention (7 days, outbox.GC) with room for such retries; never collect the inbox faster
// than the outbox collects delivered messages.
//
// # Failure modes
//
//   - Message ids are unique per pgcoord schema of the producer. A consumer that reads
//     several outboxes (several databases) must use one consumer name per source, or the
//     ids collide.
//   - A Claim outside the transaction that applies the effect (another transaction, or
//     autocommit) gives no guarantee: a crash between the two loses or repeats the effect.
//   - Effects outside the consumer's database (an email, a payment) are not covered: pass
//     the message id on as that system's idempotency key.
//   - Under REPEATABLE READ or SERIALIZABLE, a Claim that waited for a concurrent claimer
//     that committed fails with SQLSTATE 40001: roll back and retry; the retry's Claim
//     returns false.
package inbox

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgcoord/pgcoord/internal/base"
	"github.com/pgcoord/pgcoord/internal/batch"
	"github.com/pgcoord/pgcoord/internal/dbarg"
	"github.com/pgcoord/pgcoord/internal/dbsqlc"
	"github.com/pgcoord/pgcoord/pgcoord"
)

// check makes this package's argument errors ("inbox: cause").
var check = base.Check("inbox")

// Claim records, inside the consumer's transaction tx, that consumer applies message
// messageID, and reports whether this is the first time: true means apply the message in
// tx; false means a committed transaction already did, so skip it. The record commits or
// vanishes with tx. One round trip.
//
// A consumer name (1 to 255 bytes of UTF-8, no NUL) that is invalid returns an error
// wrapping pgcoord.ErrInvalidName, a nil tx or a message id below 1 an error wrapping
// pgcoord.ErrInvalidArgument, before any SQL runs.
// On a standby it returns an error wrapping pgcoord.ErrReadOnly.
func Claim(ctx context.Context, tx pgx.Tx, consumer string, messageID int64) (bool, error) {
	if err := check.Name("inbox consumer", consumer); err != nil {
		return false, err
	}
	if messageID < 1 {
		return false, check.Invalid("message id %d is not an outbox id", messageID)
	}
	if check.DB(tx) != nil {
		return false, check.Invalid("nil transaction")
	}
	n, err := queries.InboxClaim(ctx, tx, dbsqlc.InboxClaimParams{Consumer: consumer, MessageID: messageID})
	if err != nil {
		return false, fmt.Errorf("inbox: claim %s/%d: %w", consumer, messageID, base.TranslateError(err))
	}
	return n == 1, nil
}

// Defaults and bounds of GCOpts.
const (
	DefaultRetention = 30 * 24 * time.Hour
	DefaultGCBatch   = 1000
	MaxGCBatch       = 100000
)

// GCOpts are the options of GC. A nil *GCOpts means the defaults.
type GCOpts struct {
	// OlderThan is the retention: records applied longer ago than this, by the database
	// clock, are deleted. Default DefaultRetention (30 days); a negative value is refused.
	OlderThan time.Duration
	// Batch is how many records one statement deletes at most. Default DefaultGCBatch
	// (1000); at most MaxGCBatch.
	Batch int
	// DryRun deletes nothing: GC returns how many records it would delete now.
	DryRun bool
	// Progress, if set, is called after each batch with the number deleted so far (with
	// DryRun, once with the count).
	Progress func(deleted int64)
}

// GC deletes inbox records older than the retention, in batches, each its own statement
// (a short transaction with a pool), until a batch comes up short, and returns how many it
// deleted; on error or when ctx ends, the number deleted until then with the error. Bad
// options return an error wrapping pgcoord.ErrInvalidArgument before any SQL runs.
func GC(ctx context.Context, db pgcoord.DBTX, opts *GCOpts) (deleted int64, err error) {
	if err := check.DB(db); err != nil {
		return 0, err
	}
	var o GCOpts
	if opts != nil {
		o = *opts
	}
	if o.OlderThan == 0 {
		o.OlderThan = DefaultRetention
	}
	if o.Batch == 0 {
		o.Batch = DefaultGCBatch
	}
	if o.OlderThan < 0 {
		return 0, check.Invalid("negative retention %v", o.OlderThan)
	}
	if o.Batch < 1 || o.Batch > MaxGCBatch {
		return 0, check.Invalid("GC batch %d is outside 1..%d", o.Batch, MaxGCBatch)
	}
	cutoff, err := queries.OutboxCutoff(ctx, db, dbarg.Interval(o.OlderThan))
	if err != nil {
		return 0, fmt.Errorf("inbox: GC: %w", err)
	}
	deleted, err = batch.Delete(ctx, o.Batch, o.DryRun, o.Progress,
		func(ctx context.Context) (int64, error) {
			return queries.InboxCountExpired(ctx, db, cutoff)
		},
		func(ctx context.Context) (int64, error) {
			return queries.InboxGC(ctx, db, dbsqlc.InboxGCParams{Cutoff: cutoff, Batch: int32(o.Batch)})
		})
	if err != nil {
		return deleted, fmt.Errorf("inbox: GC: %w", base.TranslateError(err))
	}
	return deleted, nil
}

var queries dbsqlc.Queries
