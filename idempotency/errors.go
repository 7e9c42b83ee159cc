package idempotency

import "errors"

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
	// ErrLost: the attempt no longer holds its key: another attempt took it over after its
	// lease lapsed (it could not be renewed for a whole BeginOpts.Lease), or the attempt's
	// transaction failed.
	ErrLost = errors.New("idempotency: key no longer held by this attempt")
	// ErrBusy: an Atomic Begin found half of its pool's MaxConns held by Atomic attempts
	// already; nothing was claimed. The middleware answers 503 with Retry-After.
	ErrBusy = errors.New("idempotency: too many Atomic attempts hold connections of this pool; retry later")
	// ErrNotFound: Get found no such key.
	ErrNotFound = errors.New("idempotency: no such key")
)
