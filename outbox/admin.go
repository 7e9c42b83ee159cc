package outbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgcoord/pgcoord/internal/base"
	"github.com/pgcoord/pgcoord/internal/batch"
	"github.com/pgcoord/pgcoord/internal/dbarg"
	"github.com/pgcoord/pgcoord/internal/dbsqlc"
	"github.com/pgcoord/pgcoord/pgcoord"
)

// check makes this package's argument errors ("outbox: cause").
var check = base.Check("outbox")

// TopicStats is the state of one topic's messages, judged by the database clock.
type TopicStats struct {
	Topic string
	// Pending counts the messages not yet delivered nor dead; Due those of them ready to
	// claim now (not delayed, not in backoff, not claimed); InFlight those under a live
	// claim. Due counts every due message, not only the heads of their keys.
	Pending, Due, InFlight int64
	// Dead counts the dead messages (until Retry, or GC with GCOpts.Dead).
	Dead int64
	// OldestPending is when the oldest pending message was written (zero if none), and
	// MaxAttempts the most failed attempts of a pending message: a stuck key shows here.
	OldestPending time.Time
	MaxAttempts   int
	// DBNow is the database clock when the stats were read.
	DBNow time.Time
}

// OldestPendingAge is how long the oldest pending message has waited (0 if none).
func (s TopicStats) OldestPendingAge() time.Duration {
	if s.OldestPending.IsZero() {
		return 0
	}
	return max(s.DBNow.Sub(s.OldestPending), 0)
}

// StatsOpts are the options of Stats. A nil *StatsOpts means the defaults.
type StatsOpts struct {
	// Topic restricts the stats to one topic. Default: every topic with pending or dead
	// messages.
	Topic string
	// TopicPrefix, if set, restricts the stats to the topics that start with it, character
	// for character ('%' and '_' are plain characters). At most 255 bytes, as a topic.
	TopicPrefix string
}

// Stats returns one TopicStats per topic that has pending or dead messages, in topic
// order (delivered messages are not counted: they are history).
func Stats(ctx context.Context, db pgcoord.DBTX, opts *StatsOpts) ([]TopicStats, error) {
	if err := check.DB(db); err != nil {
		return nil, err
	}
	var o StatsOpts
	if opts != nil {
		o = *opts
	}
	var topic *string
	if o.Topic != "" {
		if err := check.Name("outbox topic", o.Topic); err != nil {
			return nil, err
		}
		topic = &o.Topic
	}
	if err := checkTopicPrefix(o.TopicPrefix); err != nil {
		return nil, err
	}
	rows, err := queries.OutboxStats(ctx, db, dbsqlc.OutboxStatsParams{OnlyTopic: topic, TopicPrefix: o.TopicPrefix})
	if err != nil {
		return nil, fmt.Errorf("outbox: stats: %w", err)
	}
	out := make([]TopicStats, 0, len(rows))
	for _, r := range rows {
		s := TopicStats{
			Topic: r.Topic, Pending: r.Pending, Due: r.Due, InFlight: r.InFlight, Dead: r.Dead,
			MaxAttempts: int(r.MaxAttempts), DBNow: r.DbNow,
		}
		if r.Pending > 0 {
			s.OldestPending = r.OldestPending
		}
		out = append(out, s)
	}
	return out, nil
}

// ListOpts are the options of List. A nil *ListOpts lists the first page of all messages.
type ListOpts struct {
	// State lists only messages in this state. Default: every state.
	State State
	// Topic lists only this topic's messages. Default: every topic.
	Topic string
	// TopicPrefix, if set, lists only the messages whose topic starts with it, character
	// for character ('%' and '_' are plain characters). At most 255 bytes, as a topic.
	TopicPrefix string
	// After lists messages with ids above it, for paging: pass the last ID of the
	// previous page.
	After int64
	// Limit is the page size: default pgcoord.DefaultListLimit, at most
	// pgcoord.MaxListLimit.
	Limit int
	// PayloadBytes is how much of each payload List reads: the first PayloadBytes bytes
	// (0..MaxPayload). Default 0: none, and Message.Payload is empty; Message.PayloadSize
	// has each payload's length either way. A page holds at most Limit × PayloadBytes
	// bytes of payloads; read a whole message with Get.
	PayloadBytes int
}

// List returns messages in id order, one page at a time, with at most
// ListOpts.PayloadBytes of each payload (none by default): a page of operator views
// never pulls megabytes of payloads it does not show.
func List(ctx context.Context, db pgcoord.DBTX, opts *ListOpts) ([]Message, error) {
	if err := check.DB(db); err != nil {
		return nil, err
	}
	var o ListOpts
	if opts != nil {
		o = *opts
	}
	limit, err := check.ListLimit(o.Limit)
	if err != nil {
		return nil, err
	}
	if o.PayloadBytes < 0 || o.PayloadBytes > MaxPayload {
		return nil, check.Invalid("payload bytes %d is outside 0..%d", o.PayloadBytes, MaxPayload)
	}
	arg := dbsqlc.OutboxListParams{AfterID: o.After, MaxRows: limit, PayloadBytes: int32(o.PayloadBytes)}
	switch o.State {
	case "":
	case Pending, Delivered, Dead:
		s := string(o.State)
		arg.State = &s
	default:
		return nil, check.Invalid("no state %q (want pending, delivered or dead)", o.State)
	}
	if o.Topic != "" {
		if err := check.Name("outbox topic", o.Topic); err != nil {
			return nil, err
		}
		arg.Topic = &o.Topic
	}
	if err := checkTopicPrefix(o.TopicPrefix); err != nil {
		return nil, err
	}
	arg.TopicPrefix = o.TopicPrefix
	rows, err := queries.OutboxList(ctx, db, arg)
	if err != nil {
		return nil, fmt.Errorf("outbox: list: %w", err)
	}
	out := make([]Message, 0, len(rows))
	for _, r := range rows {
		m := messageFrom(dbsqlc.PgcoordOutbox{
			ID: r.ID, Topic: r.Topic, Key: r.Key, Payload: r.PayloadHead, IsJson: r.IsJson, Headers: r.Headers,
			State: r.State, CreatedAt: r.CreatedAt, AvailableAt: r.AvailableAt, Attempts: r.Attempts,
			ClaimToken: r.ClaimToken, ClaimedBy: r.ClaimedBy, ClaimExpiresAt: r.ClaimExpiresAt,
			LastError: r.LastError, DeliveredAt: r.DeliveredAt, DeadAt: r.DeadAt,
		})
		m.PayloadSize = int(r.PayloadSize)
		out = append(out, m)
	}
	return out, nil
}

// Get returns the message with this id, payload included (at most MaxPayload bytes), or
// ErrNotFound.
func Get(ctx context.Context, db pgcoord.DBTX, id int64) (Message, error) {
	if err := check.DB(db); err != nil {
		return Message{}, err
	}
	r, err := queries.OutboxGet(ctx, db, id)
	if errors.Is(err, pgx.ErrNoRows) {
		return Message{}, fmt.Errorf("%w: id %d", ErrNotFound, id)
	}
	if err != nil {
		return Message{}, fmt.Errorf("outbox: get %d: %w", id, err)
	}
	return messageFrom(r), nil
}

// Retry makes message id deliverable now: a dead message becomes pending again with a
// fresh count of attempts, and a pending one waiting out a backoff or a delay becomes due.
// A dead message made pending is again the oldest pending message of its key, so it goes
// before the key's messages still pending (those written after it). It returns ErrNotFound
// if no pending or dead message has this id (a delivered one, or none).
func Retry(ctx context.Context, db pgcoord.DBTX, id int64) error {
	if err := check.DB(db); err != nil {
		return err
	}
	n, err := queries.OutboxRetry(ctx, db, id)
	if err != nil {
		return fmt.Errorf("outbox: retry %d: %w", id, base.TranslateError(err))
	}
	if n == 0 {
		return fmt.Errorf("%w: no pending or dead message with id %d", ErrNotFound, id)
	}
	return nil
}

// RetryDeadOpts are the options of RetryDead. A nil *RetryDeadOpts means the defaults.
type RetryDeadOpts struct {
	// Topic retries only this topic's dead messages. Default: every topic.
	Topic string
	// DryRun changes nothing: RetryDead returns how many dead messages it would retry.
	DryRun bool
	// Batch is how many messages one statement retries at most. Default DefaultGCBatch
	// (1000); at most MaxGCBatch.
	Batch int
	// Progress, if set, is called after each batch with the number retried so far (with
	// DryRun, once with the count).
	Progress func(retried int64)
}

// RetryDead makes every dead message (of RetryDeadOpts.Topic, if set) pending again, due
// now with a fresh count of attempts, in batches of RetryDeadOpts.Batch, each its own
// statement, until a batch comes up short, and returns how many. With a pool each batch is
// a short transaction; pass a transaction to retry them all at once or none. On error or
// when ctx ends it returns the number retried until then with the error.
func RetryDead(ctx context.Context, db pgcoord.DBTX, opts *RetryDeadOpts) (int64, error) {
	if err := check.DB(db); err != nil {
		return 0, err
	}
	var o RetryDeadOpts
	if opts != nil {
		o = *opts
	}
	var topic *string
	if o.Topic != "" {
		if err := check.Name("outbox topic", o.Topic); err != nil {
			return 0, err
		}
		topic = &o.Topic
	}
	if o.Batch == 0 {
		o.Batch = DefaultGCBatch
	}
	if o.Batch < 1 || o.Batch > MaxGCBatch {
		return 0, check.Invalid("retry batch %d is outside 1..%d", o.Batch, MaxGCBatch)
	}
	n, err := batch.Delete(ctx, o.Batch, o.DryRun, o.Progress,
		func(ctx context.Context) (int64, error) { return queries.OutboxCountDead(ctx, db, topic) },
		func(ctx context.Context) (int64, error) {
			return queries.OutboxRetryDead(ctx, db, dbsqlc.OutboxRetryDeadParams{Topic: topic, MaxRows: int32(o.Batch)})
		})
	if err != nil {
		return n, fmt.Errorf("outbox: retry dead messages: %w", base.TranslateError(err))
	}
	return n, nil
}

// Defaults and bounds of GCOpts.
const (
	DefaultRetention = 7 * 24 * time.Hour
	DefaultGCBatch   = 1000
	MaxGCBatch       = 100000
)

// GCOpts are the options of GC. A nil *GCOpts means the defaults.
type GCOpts struct {
	// OlderThan is the retention: messages delivered (or, with Dead, declared dead) longer
	// ago than this, by the database clock, are deleted. Default DefaultRetention (7 days);
	// a negative value is refused.
	OlderThan time.Duration
	// Dead deletes dead messages past the retention too. Default: dead messages are kept
	// until retried, or deleted by a GC with Dead set.
	Dead bool
	// Batch is how many messages one statement deletes at most. Default DefaultGCBatch
	// (1000); at most MaxGCBatch.
	Batch int
	// DryRun deletes nothing: GC returns how many messages it would delete now.
	DryRun bool
	// Progress, if set, is called after each batch with the number deleted so far (with
	// DryRun, once with the count).
	Progress func(deleted int64)
}

// GC deletes delivered messages older than the retention (and dead ones with
// GCOpts.Dead), oldest first, in batches of GCOpts.Batch, each its own statement, until a
// batch comes up short: with a pool each batch is a short transaction, so GC neither holds
// locks for long nor bloats the table with one huge delete. Pending messages are never
// deleted. It returns how many it deleted; on error or when ctx ends, the number deleted
// until then with the error. Bad options return an error wrapping
// pgcoord.ErrInvalidArgument before any SQL runs.
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
		return 0, fmt.Errorf("outbox: GC: %w", err)
	}
	deleted, err = batch.Delete(ctx, o.Batch, o.DryRun, o.Progress,
		func(ctx context.Context) (int64, error) {
			return queries.OutboxCountPrunable(ctx, db, dbsqlc.OutboxCountPrunableParams{Cutoff: cutoff, IncludeDead: o.Dead})
		},
		func(ctx context.Context) (int64, error) {
			return queries.OutboxPrune(ctx, db, dbsqlc.OutboxPruneParams{Cutoff: cutoff, IncludeDead: o.Dead, Batch: int32(o.Batch)})
		})
	if err != nil {
		return deleted, fmt.Errorf("outbox: GC: %w", base.TranslateError(err))
	}
	return deleted, nil
}

// checkTopicPrefix checks a TopicPrefix option: empty (every topic) or a valid topic.
func checkTopicPrefix(p string) error {
	if p == "" {
		return nil
	}
	return check.Name("prefix of an outbox topic", p)
}
