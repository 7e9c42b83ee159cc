package idempotency

import "time"

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
	// DefaultLease is how long an attempt holds its key without a renewal by default
	// (BeginOpts.Lease): a holder that dies is taken over at most this long after its last
	// renewal.
	DefaultLease = 30 * time.Second
	// MinLease and MaxLease bound BeginOpts.Lease.
	MinLease = time.Second
	MaxLease = time.Hour
	// DefaultTombstone is how long GC keeps a tombstone of a deleted key by default: 30 days.
	DefaultTombstone = 30 * 24 * time.Hour
)

// The states of a key (KeyInfo.State).
const (
	StateInFlight  = "in_flight" // an attempt holds it, or its holder's lease lapsed (Stuck)
	StateCompleted = "completed" // its response is stored
)

// ValidateKey checks an idempotency key: 1 to MaxKeyLen printable ASCII characters (0x20
// to 0x7E). Its error wraps both ErrInvalidKey and pgcoord.ErrInvalidName.
func ValidateKey(key string) error {
	switch {
	case key == "":
		return check.InvalidName("%w: key is empty", ErrInvalidKey)
	case len(key) > MaxKeyLen:
		return check.InvalidName("%w: key is %d bytes, more than the maximum of %d", ErrInvalidKey, len(key), MaxKeyLen)
	}
	for i := 0; i < len(key); i++ {
		if key[i] < 0x20 || key[i] > 0x7e {
			return check.InvalidName("%w: key has a byte 0x%02x at %d; keys are printable ASCII", ErrInvalidKey, key[i], i)
		}
	}
	return nil
}
