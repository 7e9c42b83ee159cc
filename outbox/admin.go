package outbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgcoord/pgcoord/internal/batch"
	"github.com/pgcoord/pgcoord/internal/dbarg"
	"github.com/pgcoord/pgcoord/internal/dbsqlc"
	"github.com/pgcoord/pgcoord/pgcoord"
)

// TopicStats is the state of one topic's messages, judged by the database clock.
type TopicStats struct {
	Topic string
	// Pending counts the messages not yet delivered nor dead; Due those of them ready to
	// claim now (not delayed, not in backoff, not claimed); InFlight those under a live
	// claim. Due counts every due message, not only the heads of their keys.
	Pending, Due, InFlight int64
	// Dead counts the dead messages (until Retry or Prune).
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
}

// Stats returns one TopicStats per topic that has pending or dead messages, in topic
// order (delivered messages are not counted: they are history).
func Stats(ctx context.Context, db pgcoord.DBTX, opts *StatsOpts) ([]TopicStats, error) {
	if err := pgcoord.CheckDB(db); err != nil {
		return nil, err
	}
	var o StatsOpts
	if opts != nil {
		o = *opts
	}
	var topic *string
	if o.Topic != "" {
		if err := pgcoord.ValidateName("outbox topic", o.Topic); err != nil {
			return nil, err
		}
		topic = &o.Topic
	}
	rows, err := queries.OutboxStats(ctx, db, topic)
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
	if err := pgcoord.CheckDB(db); err != nil {
		return nil, err
	}
	var o ListOpts
	if opts != nil {
		o = *opts
	}
	limit, err := pgcoord.ListLimit(o.Limit)
	if err != nil {
		return nil, err
	}
	if o.PayloadBytes < 0 || o.PayloadBytes > MaxPayload {
		return nil, fmt.Errorf("%w: outbox: payload bytes %d is outside 0..%d", pgcoord.ErrInvalidArgument, o.PayloadBytes, MaxPayload)
	}
	arg := dbsqlc.OutboxListParams{AfterID: o.After, MaxRows: limit, PayloadBytes: int32(o.PayloadBytes)}
	switch o.State {
	case "":
	case Pending, Delivered, Dead:
		s := string(o.State)
		arg.State = &s
	default:
		return nil, fmt.Errorf("%w: outbox: no state %q (want pending, delivered or dead)", pgcoord.ErrInvalidArgument, o.State)
	}
	if o.Topic != "" {
		if err := pgcoord.ValidateName("outbox topic", o.Topic); err != nil {
			return nil, err
		}
		arg.Topic = &o.Topic
	}
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
	if err := pgcoord.CheckDB(db); err != nil {
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
	if err := pgcoord.CheckDB(db); err != nil {
		return err
	}
	n, err := queries.OutboxRetry(ctx, db, id)
	if err != nil {
		return fmt.Errorf("outbox: retry %d: %w", id, pgcoord.TranslateError(err))
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
}

// RetryDead makes every dead message (of RetryDeadOpts.Topic, if set) pending again, due
// now with a fresh count of attempts, in one statement, and returns how many.
func RetryDead(ctx context.Context, db pgcoord.DBTX, opts *RetryDeadOpts) (int64, error) {
	if err := pgcoord.CheckDB(db); err != nil {
		return 0, err
	}
	var o RetryDeadOpts
	if opts != nil {
		o = *opts
	}
	var topic *string
	if o.Topic != "" {
		if err := pgcoord.ValidateName("outbox topic", o.Topic); err != nil {
			return 0, err
		}
		topic = &o.Topic
	}
	var n int64
	var err error
	if o.DryRun {
		n, err = queries.OutboxCountDead(ctx, db, topic)
	} else {
		n, err = queries.OutboxRetryDead(ctx, db, topic)
	}
	if err != nil {
		return 0, fmt.Errorf("outbox: retry dead messages: %w", pgcoord.TranslateError(err))
	}
	return n, nil
}

// Defaults and bounds of PruneOpts.
const (
	DefaultRetention  = 7 * 24 * time.Hour
	DefaultPruneBatch = 1000
	MaxPruneBatch     = 100000
)

// PruneOpts are the options of Prune. A nil *PruneOpts means the defaults.
type PruneOpts struct {
	// OlderThan is the retention: messages delivered (or, with Dead, declared dead)
	// longer ago than this, by the database clock, are deleted. Default DefaultRetention
	// (7 days). Zero-or-negative values other than the default are refused.
	OlderThan time.Duration
	// Dead prunes dead messages past the retention too. Default: dead messages are kept
	// until retried or pruned with Dead set.
	Dead bool
	// Batch is how many messages one DELETE removes at most. Default DefaultPruneBatch
	// (1000); at most MaxPruneBatch.
	Batch int
	// DryRun deletes nothing: Prune returns how many messages it would delete now.
	DryRun bool
	// Progress, if set, is called after each batch with the number deleted so far.
	Progress func(deleted int64)
}

// Prune deletes delivered messages older than the retention (and dead ones with
// PruneOpts.Dead), oldest first, in batches of PruneOpts.Batch, each its own statement,
// until a batch comes up short: with a pool each batch is a short transaction, so pruning
// neither holds locks for long nor bloats the table with one huge delete. Pending
// messages are never deleted. It returns how many it deleted; on error or when ctx ends,
// the number deleted until then with the error. Bad options return an error wrapping
// pgcoord.ErrInvalidArgument before any SQL runs.
func Prune(ctx context.Context, db pgcoord.DBTX, opts *PruneOpts) (deleted int64, err error) {
	if err := pgcoord.CheckDB(db); err != nil {
		return 0, err
	}
	var o PruneOpts
	if opts != nil {
		o = *opts
	}
	if o.OlderThan == 0 {
		o.OlderThan = DefaultRetention
	}
	if o.Batch == 0 {
		o.Batch = DefaultPruneBatch
	}
	if o.OlderThan < 0 {
		return 0, fmt.Errorf("%w: outbox: negative retention %v", pgcoord.ErrInvalidArgument, o.OlderThan)
	}
	if o.Batch < 1 || o.Batch > MaxPruneBatch {
		return 0, fmt.Errorf("%w: outbox: prune batch %d is outside 1..%d", pgcoord.ErrInvalidArgument, o.Batch, MaxPruneBatch)
	}
	cutoff, err := queries.OutboxCutoff(ctx, db, dbarg.Interval(o.OlderThan))
	if err != nil {
		return 0, fmt.Errorf("outbox: prune: %w", err)
	}
	deleted, err = batch.Delete(ctx, o.Batch, o.DryRun, o.Progress,
		func(ctx context.Context) (int64, error) {
			return queries.OutboxCountPrunable(ctx, db, dbsqlc.OutboxCountPrunableParams{Cutoff: cutoff, IncludeDead: o.Dead})
		},
		func(ctx context.Context) (int64, error) {
			return queries.OutboxPrune(ctx, db, dbsqlc.OutboxPruneParams{Cutoff: cutoff, IncludeDead: o.Dead, Batch: int32(o.Batch)})
		})
	if err != nil {
		return deleted, fmt.Errorf("outbox: prune: %w", pgcoord.TranslateError(err))
	}
	return deleted, nil
}
