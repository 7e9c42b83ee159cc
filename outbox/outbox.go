package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/pgcoord/pgcoord/internal/base"
	"github.com/pgcoord/pgcoord/internal/dbarg"
	"github.com/pgcoord/pgcoord/internal/dbsqlc"
)

// Errors returned by this package. Bad input wraps pgcoord.ErrInvalidName (topics, keys)
// or pgcoord.ErrInvalidArgument (everything else) as well, and is reported before any SQL
// runs. Driver errors are wrapped, so a *pgconn.PgError stays reachable with errors.As.
var (
	// ErrPayloadTooLarge means a payload is longer than MaxPayload bytes.
	ErrPayloadTooLarge = errors.New("outbox: payload too large")
	// ErrInvalidJSON means a message declared JSON (Message.JSON) whose payload is not a
	// valid JSON document.
	ErrInvalidJSON = errors.New("outbox: payload is not valid JSON")
	// ErrNotFound means no message of that id exists (or none in a state the call acts on).
	ErrNotFound = errors.New("outbox: no such message")
	// ErrRelayRunning is returned by Relay.Run when that Relay is already running.
	ErrRelayRunning = errors.New("outbox: relay is already running")
)

// Limits of a message, checked before any SQL runs (and by the database).
const (
	// MaxPayload is the largest payload, in bytes (1 MiB). Put bigger documents in a table
	// or an object store and send their address.
	MaxPayload = 1 << 20
	// MaxHeaders is the largest encoded size of a message's headers, in bytes.
	MaxHeaders = 64 << 10
	// MaxDelay is the longest Delay of a message.
	MaxDelay = 365 * 24 * time.Hour
)

// State is where a message is in its life.
type State string

// The states of a message.
const (
	// Pending messages wait for a relay: due, in backoff after a failure, delayed, or
	// claimed by a relay right now.
	Pending State = "pending"
	// Delivered messages were handed to a Handler that returned nil. GC deletes them after
	// their retention.
	Delivered State = "delivered"
	// Dead messages failed Config.MaxAttempts times. They no longer hold back their key;
	// Retry makes them pending again.
	Dead State = "dead"
)

// Message is one outbox message: what a producer passes to Enqueue (Topic, Key, Payload,
// JSON, Headers, Delay) and what a Handler, List and Get return (all fields but Delay).
type Message struct {
	// ID identifies the message, assigned by Enqueue; within a key, ids are in commit
	// order. Use it as the idempotency key downstream (inbox.Claim, the webhook sink's
	// Idempotency-Key header). IDs are unique per pgcoord schema, not across databases.
	ID int64
	// Topic names the stream (a name: 1 to 255 bytes of UTF-8, no NUL), e.g. "orders".
	Topic string
	// Key is the ordering key (an aggregate or tenant id; a name like Topic): messages of
	// one topic and key are delivered one at a time, in commit order. Give independent
	// messages distinct keys (their own id, say) so they flow in parallel.
	Key string
	// Payload is the body, at most MaxPayload bytes; it may be empty. List reads only as
	// much of it as ListOpts.PayloadBytes asks (none by default); PayloadSize tells how
	// long it is.
	Payload []byte
	// PayloadSize is the payload's length in bytes, set by Enqueue and on messages read
	// back: len(Payload), except on List pages, which read at most ListOpts.PayloadBytes
	// of each payload.
	PayloadSize int
	// JSON declares the payload a JSON document: Enqueue refuses invalid JSON, and sinks
	// pass it on as JSON.
	JSON bool
	// Headers are free-form string pairs carried with the message (trace ids, content
	// types, ...), at most MaxHeaders bytes as JSON. Names for which ReservedHeader is
	// true (Authorization, Cookie, Host, Proxy-*, ...) are refused.
	Headers map[string]string
	// Delay postpones the message's first delivery by this long, by the database clock
	// (0..MaxDelay). A delayed message also holds back the later messages of its key, and
	// until it is due its key costs the relays' claims a probe each (thousands of keys
	// parked so slow every claim: see the package doc's failure modes).
	// Enqueue only; read messages report AvailableAt instead.
	Delay time.Duration

	// State, Attempts and the times below are set on messages read back (Enqueue sets
	// State, CreatedAt and AvailableAt).
	State State
	// Attempts counts the failed deliveries so far.
	Attempts int
	// LastError is the error of the latest failed delivery ("" if none).
	LastError string
	// CreatedAt is when the message was written (the start of the producer's
	// transaction, by the database clock).
	CreatedAt time.Time
	// AvailableAt is when the message may next be delivered: CreatedAt + Delay, or the end
	// of the backoff after a failure.
	AvailableAt time.Time
	// DeliveredAt and DeadAt are when it was delivered or declared dead (zero if not).
	DeliveredAt, DeadAt time.Time
	// ClaimedBy names the relay of its latest claim ("" if never claimed), and
	// ClaimExpiresAt is when that claim ends (zero once settled or released).
	ClaimedBy      string
	ClaimExpiresAt time.Time
	// ClaimToken is the token of its latest claim: higher for every later claim.
	ClaimToken int64
}

// Enqueue writes msg to the outbox inside the caller's transaction tx, in one round trip,
// and returns it with ID, State, CreatedAt, AvailableAt and PayloadSize set. The message exists for the
// relays only if tx commits: a rollback leaves nothing, and no relay is woken (the
// notification is sent at commit).
//
// Enqueue holds a transaction-level advisory lock on (Topic, Key) until tx ends, so
// concurrent transactions writing the same key are serialized — the second waits for the
// first to commit or roll back — which puts the key's ids in commit order. Keep such
// transactions short; a transaction enqueuing to keys x then y while another enqueues to y
// then x can deadlock (PostgreSQL aborts one with SQLSTATE 40P01), as with any row lock.
// Each distinct key takes one lock slot of the server's lock table until commit: enqueue
// thousands of distinct keys in one transaction only with max_locks_per_transaction
// raised accordingly.
//
// Bad input returns an error before any SQL runs: an invalid Topic or Key
// (pgcoord.ErrInvalidName), a payload over MaxPayload (ErrPayloadTooLarge), a JSON message
// whose payload is not valid JSON (ErrInvalidJSON), headers over MaxHeaders or with a
// reserved name (ReservedHeader), a Delay outside 0..MaxDelay or a nil tx
// (pgcoord.ErrInvalidArgument).
// On a standby it returns an error wrapping pgcoord.ErrReadOnly.
func Enqueue(ctx context.Context, tx pgx.Tx, msg Message) (Message, error) {
	headers, err := validateMessage(msg)
	if err != nil {
		return Message{}, err
	}
	if check.DB(tx) != nil {
		return Message{}, check.Invalid("nil transaction")
	}
	arg := dbsqlc.OutboxEnqueueParams{
		Topic: msg.Topic, Key: msg.Key, Payload: msg.Payload, IsJson: msg.JSON, Headers: headers,
	}
	if arg.Payload == nil {
		arg.Payload = []byte{}
	}
	if msg.Delay > 0 {
		arg.Delay = dbarg.Interval(msg.Delay)
	}
	row, err := queries.OutboxEnqueue(ctx, tx, arg)
	if err != nil {
		return Message{}, fmt.Errorf("outbox: enqueue to %s/%s: %w", msg.Topic, msg.Key, base.TranslateError(err))
	}
	msg.ID, msg.State, msg.CreatedAt, msg.AvailableAt = row.ID, Pending, row.CreatedAt, row.AvailableAt
	msg.Delay, msg.PayloadSize = 0, len(msg.Payload)
	return msg, nil
}

// MaxBatch is the most messages one EnqueueBatch call writes.
const MaxBatch = 10000

// EnqueueBatch writes msgs to the outbox inside the caller's transaction tx, in one round
// trip and one statement (one notification at commit), and returns them as Enqueue does,
// in the order given. Messages of one key get ids in the order given, and so are delivered
// in that order. The (topic, key) locks Enqueue takes are taken in (topic, key) order, so
// concurrent EnqueueBatch calls never deadlock on each other.
//
// Every message is checked as Enqueue checks it, before any SQL runs; so is the count
// (1..MaxBatch). On a standby it returns an error wrapping pgcoord.ErrReadOnly.
func EnqueueBatch(ctx context.Context, tx pgx.Tx, msgs []Message) ([]Message, error) {
	if len(msgs) == 0 || len(msgs) > MaxBatch {
		return nil, check.Invalid("batch of %d messages is outside 1..%d", len(msgs), MaxBatch)
	}
	arg := dbsqlc.OutboxEnqueueManyParams{
		Topics: make([]string, len(msgs)), Keys: make([]string, len(msgs)), Payloads: make([][]byte, len(msgs)),
		IsJson: make([]bool, len(msgs)), Headers: make([]json.RawMessage, len(msgs)), Delays: make([]pgtype.Interval, len(msgs)),
	}
	for i, m := range msgs {
		headers, err := validateMessage(m)
		if err != nil {
			return nil, fmt.Errorf("message %d: %w", i, err)
		}
		arg.Topics[i], arg.Keys[i], arg.IsJson[i], arg.Headers[i] = m.Topic, m.Key, m.JSON, headers
		arg.Payloads[i] = m.Payload
		if m.Payload == nil {
			arg.Payloads[i] = []byte{}
		}
		if m.Delay > 0 {
			arg.Delays[i] = dbarg.Interval(m.Delay)
		}
	}
	if check.DB(tx) != nil {
		return nil, check.Invalid("nil transaction")
	}
	rows, err := queries.OutboxEnqueueMany(ctx, tx, arg)
	if err != nil {
		return nil, fmt.Errorf("outbox: enqueue %d messages: %w", len(msgs), base.TranslateError(err))
	}
	if len(rows) != len(msgs) {
		return nil, fmt.Errorf("outbox: enqueue %d messages: %d written", len(msgs), len(rows))
	}
	out := make([]Message, len(msgs))
	for i, m := range msgs {
		m.ID, m.State, m.CreatedAt, m.AvailableAt, m.Delay = rows[i].ID, Pending, rows[i].CreatedAt, rows[i].AvailableAt, 0
		m.PayloadSize = len(m.Payload)
		out[i] = m
	}
	return out, nil
}

// validateMessage checks msg and returns its headers encoded as JSON, nil if it has none.
func validateMessage(msg Message) ([]byte, error) {
	if err := check.Name("outbox topic", msg.Topic); err != nil {
		return nil, err
	}
	if err := check.Name("outbox key", msg.Key); err != nil {
		return nil, err
	}
	if len(msg.Payload) > MaxPayload {
		return nil, check.Invalid("%w: %d bytes, more than the maximum of %d", ErrPayloadTooLarge, len(msg.Payload), MaxPayload)
	}
	if msg.JSON && !json.Valid(msg.Payload) {
		return nil, check.Invalid("%w (message to %s/%s)", ErrInvalidJSON, msg.Topic, msg.Key)
	}
	if msg.Delay < 0 || msg.Delay > MaxDelay {
		return nil, check.Invalid("delay %v is outside 0..%v", msg.Delay, MaxDelay)
	}
	if len(msg.Headers) == 0 {
		return nil, nil // the column's default, '{}', without sending it
	}
	for name := range msg.Headers {
		if name == "" {
			return nil, check.Invalid("empty header name")
		}
		if ReservedHeader(name) {
			return nil, check.Invalid("header %q is reserved: a message may not set credentials, framing or the sink's own headers (see ReservedHeader)", name)
		}
	}
	headers, err := json.Marshal(msg.Headers)
	if err != nil { // invalid UTF-8 is replaced, not refused: only a defect gets here
		return nil, check.Invalid("headers: %v", err)
	}
	if len(headers) > MaxHeaders {
		return nil, check.Invalid("headers are %d bytes as JSON, more than the maximum of %d", len(headers), MaxHeaders)
	}
	return headers, nil
}

// messageFrom converts a row of pgcoord_outbox.
func messageFrom(r dbsqlc.PgcoordOutbox) Message {
	m := Message{
		ID: r.ID, Topic: r.Topic, Key: r.Key, Payload: r.Payload, JSON: r.IsJson,
		State: State(r.State), Attempts: int(r.Attempts), LastError: dbarg.Deref(r.LastError),
		CreatedAt: r.CreatedAt, AvailableAt: r.AvailableAt,
		DeliveredAt: dbarg.Deref(r.DeliveredAt), DeadAt: dbarg.Deref(r.DeadAt),
		ClaimedBy: dbarg.Deref(r.ClaimedBy), ClaimExpiresAt: dbarg.Deref(r.ClaimExpiresAt),
		ClaimToken: dbarg.Deref(r.ClaimToken),
	}
	m.Headers = decodeHeaders(r.Headers)
	if m.Payload == nil {
		m.Payload = []byte{}
	}
	m.PayloadSize = len(m.Payload)
	return m
}

// decodeHeaders reads the headers column: a JSON object whose string values are taken as
// they are, and other values (written through the SQL API) as their JSON text.
func decodeHeaders(b []byte) map[string]string {
	if len(b) <= 2 { // "{}"
		return nil
	}
	var raw map[string]json.RawMessage
	if json.Unmarshal(b, &raw) != nil {
		return nil
	}
	h := make(map[string]string, len(raw))
	for k, v := range raw {
		var s string
		if json.Unmarshal(v, &s) != nil {
			s = string(v)
		}
		h[k] = s
	}
	return h
}

var queries dbsqlc.Queries
