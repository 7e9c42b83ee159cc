// Package idempotency makes "running twice harmless" for HTTP APIs, webhooks and payment
// calls with idempotency keys: the first request with a key executes and its response is
// stored; a repeat gets the stored response replayed, byte for byte, instead of executing
// again. It follows the IETF draft "The Idempotency-Key HTTP Header Field" and Stripe's
// behaviour; docs/idempotency.md has the semantics of each situation, where the two
// differ, the limits and the costs.
//
//	mw, err := idempotency.Middleware(pool, &idempotency.Config{
//		Atomic: true, // the handler writes with idempotency.Tx(r.Context())
//		Scope:  func(r *http.Request) (string, error) { return "user:" + userID(r), nil },
//	})
//	if err != nil { return err }
//	mux.Handle("POST /orders", mw(http.HandlerFunc(createOrder)))
//
// Middleware works with any router. Begin, the store underneath, serves work without HTTP
// (a webhook consumer, a payment job): its Attempt either holds the key until Complete
// stores the response (Close gives the key up) or has a stored response to Replay. Keys
// belong to a scope (scope them per authenticated client); Fingerprint identifies the
// request. A repeat of another request with the key is refused (422, ErrMismatch); one
// while the first is in flight gets 409 (ErrInFlight), or with Wait the first's response.
//
// An attempt holds its key with a transaction-level advisory lock, in a transaction open
// on its own connection while the handler runs: a dead process's key is taken over at
// once, with no timer, behind PgBouncer in transaction mode too. With Atomic, the
// handler's writes commit with the stored response. Checkpoint records recovery points for
// handlers that call other services in phases, and DerivedKey gives each call a key for
// that service. GC removes keys past their Retention and leaves tombstones that refuse
// very late retries (422, ErrExpired).
//
// # Guarantees
//
//   - At most one attempt holds a key at a time: of concurrent requests with one key, one
//     executes; the others get 409 or (with Wait) its response.
//   - A stored response is final: every later repeat with the same fingerprint gets it,
//     byte for byte, until GC removes the key. A client never receives a first response
//     that was not stored.
//   - A repeat with a different fingerprint is refused, never answered with another
//     request's response.
//   - Nothing is half-stored: a failed attempt (5xx, panic, oversize response, crash)
//     stores nothing, nor, in Atomic mode, its writes; the next attempt executes.
//   - A dead holder's key is recovered by the next attempt at once.
//   - Expiry is judged by the database clock alone.
//   - What the store cannot keep is refused before any SQL runs, with an error wrapping
//     pgcoord.ErrInvalidArgument (or pgcoord.ErrInvalidName).
//
// # Failure modes
//
//   - Effects outside the database, made before Complete, happen again after a crash: pass
//     the provider DerivedKey, and record recovery points.
//   - A process that hangs with its connection open keeps its keys held (repeats get 409)
//     until it resumes or its connection is killed.
//   - A repeat may take the key over at the instant of a Checkpoint, which then returns
//     ErrLost: stop the work.
//   - A running handler holds a connection and an open transaction: keep handlers short.
//   - `pgcoord idempotency list --in-flight` shows only attempts that checkpointed.
//   - GC skips keys held by a live attempt, not those of a dead one.
//   - Responses are buffered, up to MaxResponseBytes: no streaming.
//   - With asynchronous replication, a failover can lose a stored response: the retry
//     executes again.
//   - Only a primary takes writes: on a standby, Begin of a key not completed, Complete,
//     Checkpoint and GC fail with an error wrapping pgcoord.ErrReadOnly; replays work.
package idempotency
