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
// An attempt holds its key with a lease on the key's row, by the database clock, renewed
// every third of BeginOpts.Lease (default 30s) while it runs: a dead process's key is
// taken over once its lease lapses, behind PgBouncer in transaction mode too. A non-Atomic
// attempt holds no connection while its handler runs, so handlers may use the same pool
// freely. With Atomic, the handler's writes commit with the stored response; the attempt
// holds a connection for its transaction, and at most half of the pool's MaxConns Atomic
// attempts run at once (ErrBusy, answered 503 with Retry-After, beyond). Only roles with
// grants on pgcoord's tables can hold a key: no other login of the database can stall one. Checkpoint records recovery points for
// handlers that call other services in phases, and DerivedKey gives each call a key for
// that service. GC removes keys past their Retention and leaves tombstones that refuse
// very late retries (422, ErrExpired).
//
// # Guarantees
//
//   - At most one attempt holds a key at a time: of concurrent requests with one key, one
//     executes while its lease is renewed; the others get 409 or (with Wait) its response.
//     At most one attempt's response is stored (and, with Atomic, its writes committed).
//   - A stored response is final: every later repeat with the same fingerprint gets it,
//     byte for byte, until GC removes the key. A client never receives a first response
//     that was not stored.
//   - A repeat with a different fingerprint is refused, never answered with another
//     request's response.
//   - Nothing is half-stored: a failed attempt (5xx, panic, oversize response, crash)
//     stores nothing, nor, in Atomic mode, its writes; the next attempt executes.
//   - A holder that gives up (Close, 5xx, panic) frees its key at once; a dead holder's key
//     is taken over by the first attempt after its lease lapses: at most Lease after its
//     last renewal.
//   - The middleware cannot deadlock its pool: a non-Atomic attempt holds no connection
//     while its handler runs; Atomic attempts hold at most half of the pool's connections.
//   - A login with no grant on pgcoord's tables cannot hold, stall or release a key.
//   - Expiry is judged by the database clock alone.
//   - What the store cannot keep is refused before any SQL runs, with an error wrapping
//     pgcoord.ErrInvalidArgument (or pgcoord.ErrInvalidName).
//   - Concurrent attempts of one process on one pool share statements: their claims,
//     stored responses (up to 64 KiB; larger ones go alone) and releases (non-Atomic) and
//     every attempt's renewals are coalesced, each with its own answer, as the lease calls
//     are (see package leases); a claim made for a caller who gave up while it was in
//     flight is released. An Atomic attempt's claim and response go on its own connection.
//
// # Failure modes
//
//   - Effects outside the database, made before Complete, happen again after a crash: pass
//     the provider DerivedKey, and record recovery points.
//   - A process that dies leaves its keys in flight (repeats get 409) until their leases
//     lapse; one that hangs with its renewals running keeps them until it resumes or dies.
//   - A holder that cannot renew for a whole Lease (database unreachable, pool exhausted)
//     can be taken over while it runs: its Checkpoint and Complete then return ErrLost
//     and store nothing; effects outside the database may happen twice (use DerivedKey).
//   - An Atomic handler holds a connection and an open transaction: keep handlers short.
//     Beyond half of the pool, Atomic requests get 503; a handler that holds two
//     connections of the pool at once can still exhaust it: give it a pool of its own.
//   - A claim commits without waiting for the WAL flush: a server crash in the instant
//     after it can forget it (the key is free again, as if the request had not come), but
//     not once anything committed after it — the handler's writes, the stored response —
//     has been flushed, which flushes the claim too.
//   - GC skips keys whose lease is live, not those of a dead holder.
//   - Responses are buffered, up to MaxResponseBytes: no streaming.
//   - With asynchronous replication, a failover can lose a stored response: the retry
//     executes again.
//   - Only a primary takes writes: on a standby, Begin of a key neither completed nor in
//     flight, Complete,
//     Checkpoint and GC fail with an error wrapping pgcoord.ErrReadOnly; replays work.
package idempotency
