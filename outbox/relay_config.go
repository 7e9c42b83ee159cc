package outbox

import (
	"log/slog"
	"slices"
	"time"

	"github.com/pgcoord/pgcoord/internal/base"
	"github.com/pgcoord/pgcoord/pgcoord"
)

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
	// BatchBytes caps the payloads and headers (as JSON text) of one claim, in bytes: the
	// relay holds one claim at a time, so its messages in memory stay below BatchBytes —
	// or one message, since a claim always takes at least one and a message larger than
	// BatchBytes is claimed alone. Default DefaultBatchBytes (16 MiB); 1..MaxBatchBytes.
	BatchBytes int
	// Concurrency is how many keys of a batch are delivered at once (each key's messages
	// one after the other, in order). Default 1; above 1 the Handler must be safe for
	// concurrent use.
	Concurrency int
	// ClaimTTL is how long a claim holds its messages, by the database clock: a batch must
	// be delivered within it. Once it has passed, another relay may claim the messages
	// again, and this relay's outcomes for them are refused (counted in Stats.Fenced).
	// The relay stops delivering a batch a tenth of ClaimTTL before it ends, by its own
	// clock. It is also the relay's lease in its partition group, at most 15s and at
	// least 1s: a relay that stops heartbeating for that long loses its partitions.
	// Default DefaultClaimTTL (30s).
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
	// NoListen makes the relay poll only, without LISTEN. Behind a transaction-mode
	// pooler (PgBouncer), where notifications are not delivered, the relay finds the
	// pooler on its first wait and polls without it; NoListen only saves that one check.
	NoListen bool
	// Claimant names this relay in its claims (Message.ClaimedBy) and in its partition
	// group (its member name, see "Several relays"): give each relay its own. Default: a
	// new identity, pgcoord.NewHolderID.
	Claimant string
	// Logger receives failures, dead messages, refused outcomes and errors. Default
	// slog.Default().
	Logger *slog.Logger
	// Tracer, if set, traces each delivery (see pgcoord.Tracer), as a child of the span
	// context the message's headers carry (the producer's, when it enqueued with a tracer
	// that writes them). Default nil: not traced.
	Tracer pgcoord.Tracer
}

func (c *Config) withDefaults() (Config, error) {
	var v Config
	if c != nil {
		v = *c
	}
	if v.Handler == nil {
		return v, check.Invalid("relay needs a Handler")
	}
	for _, t := range v.Topics {
		if err := check.Name("outbox topic", t); err != nil {
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
		return v, check.Invalid("batch size %d is outside 1..%d", v.BatchSize, MaxBatchSize)
	case v.KeyBatchSize < 1 || v.KeyBatchSize > v.BatchSize:
		return v, check.Invalid("key batch size %d is outside 1..%d (the batch size)", v.KeyBatchSize, v.BatchSize)
	case v.BatchBytes < 1 || v.BatchBytes > MaxBatchBytes:
		return v, check.Invalid("batch bytes %d is outside 1..%d", v.BatchBytes, MaxBatchBytes)
	case v.Concurrency < 1 || v.Concurrency > 10000:
		return v, check.Invalid("concurrency %d is outside 1..10000", v.Concurrency)
	case v.ClaimTTL < 10*time.Millisecond || v.ClaimTTL > 24*time.Hour:
		return v, check.Invalid("claim TTL %v is outside 10ms..24h", v.ClaimTTL)
	case v.MaxAttempts < 1:
		return v, check.Invalid("max attempts %d is below 1", v.MaxAttempts)
	case v.Backoff < 0 || v.MaxBackoff < v.Backoff:
		return v, check.Invalid("backoff %v and max backoff %v: want 0 <= backoff <= max backoff", v.Backoff, v.MaxBackoff)
	case v.PollInterval < 0 || v.PollInterval > time.Hour:
		return v, check.Invalid("poll interval %v is outside 0..1h", v.PollInterval)
	}
	if v.Claimant == "" {
		v.Claimant = base.NewHolderID()
	} else if err := check.Name("outbox claimant", v.Claimant); err != nil {
		return v, err
	}
	if v.Logger == nil {
		v.Logger = slog.Default()
	}
	return v, nil
}
