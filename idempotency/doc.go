// Package idempotency makes "running twice harmless" for HTTP APIs, webhooks and payment
// calls with idempotency keys: the first request with a key executes and its response is
// stored; a repeat gets the stored response replayed, byte for byte, instead of executing
// again. It follows the IETF draft "The Idempotency-Key HTTP Header Field" and Stripe's
// behaviour.
//
// Two layers:
//
//   - Middleware, net/http middleware (func(http.Handler) http.Handler) for any router.
//   - Begin, the store underneath, usable without HTTP (a webhook consumer, a payment job):
//     Begin(ctx, pool, scope, key, fingerprint, opts) returns a stored response to replay,
//     or an Attempt holding the key until Complete stores the response (or Close gives the
//     key up).
//
// # Semantics
//
// A key belongs to a scope (scope keys per authenticated client: two clients may pick the
// same key). A request's fingerprint is the SHA-256 of its method, path, body and the
// headers named in Config.FingerprintHeaders (Fingerprint).
//
//	situation                                   middleware answer           Begin returns
//	first request with the key                  executes; response stored   Attempt holding the key
//	repeat, same fingerprint, completed         stored response replayed,   Attempt with Replay()
//	                                            + Idempotent-Replayed: true
//	repeat, different fingerprint               422, never the old body     ErrMismatch
//	repeat while the first is in flight         409 + Retry-After, or with  ErrInFlight, or with
//	                                            Config.Wait: waits, replays BeginOpts.Wait: waits
//	repeat after the first failed (5xx, panic,  executes again (from its    Attempt holding the key
//	rollback, crash)                            recovery point, if any)     (Attempts() > 1 if recovered)
//	no key, on a method that requires one       400                         -
//	invalid key (empty, > 255 bytes,            400, nothing stored         ErrInvalidKey
//	non-printable)
//	request body over MaxRequestBytes           413, nothing stored         -
//	response body over MaxResponseBytes, or     500, nothing stored,        ErrTooLarge from Complete
//	stored headers over MaxStoredHeaderBytes    handler's tx rolled back
//	key expired and removed by GC, tombstone    422                         ErrExpired
//	still kept
//	methods not in Config.Methods               passed through              -
//
// The statuses where the IETF draft and Stripe differ, and pgcoord's defaults (each
// configurable in Config):
//
//	situation              IETF draft   Stripe                      pgcoord default
//	missing key            400          none (key optional)         400 (KeyOptional: pass through)
//	different request      422          400 (idempotency_error)     422
//	in flight              409          409                         409 (or wait, Config.Wait)
//	expired key reused     unspecified  executes as a new request   422 while the tombstone lasts
//	5xx response           unspecified  stored and replayed         not stored: the retry executes
//
// pgcoord departs from Stripe on 5xx: a 5xx says the server failed, and with Atomic its
// writes rolled back, so running the retry is what the client wants. A handler whose 5xx
// follows external effects should record a recovery point first (see below) so the retry
// resumes instead of starting over.
//
// # Liveness by lock, not by timer
//
// An attempt holds the key in a transaction that stays open on its own connection while
// its handler runs, holding a transaction-level advisory lock on the key. A repeat that
// cannot take the lock knows the attempt is alive (409, or wait). When the attempt's process
// dies, its connection closes, the server ends its transaction and frees the lock: the next
// repeat takes the lock at once and executes — no expiry to wait for, no timer to tune. The
// lock is a transaction lock, so this works through PgBouncer in transaction mode (the open
// transaction pins the server connection). A long handler holds a connection and a
// transaction open for as long as it runs (which holds back VACUUM's horizon): keep handlers
// short, as HTTP handlers are.
//
// # Atomic mode
//
// With Config.Atomic (BeginOpts.Atomic) the handler writes with Tx(r.Context()), the key's
// own transaction: its writes, the key row and the stored response commit together in one
// COMMIT, or roll back together — a handler that fails after writing leaves neither its
// writes nor a stored response, and the next attempt executes. A repeat arriving meanwhile
// gets 409 or, with Wait, blocks on the key's lock and then replays the committed response.
//
// # Recovery points (Stripe's atomic phases)
//
// A handler that calls external services in phases (charge the card, then send the
// receipt) records a recovery point after each with Attempt.Checkpoint(ctx, name, data):
// it commits the phase (the key row with the point, and in Atomic mode the phase's writes)
// and goes on holding the key. If the process dies later, the next attempt recovers the key
// at once and sees the point in Attempt.RecoveryPoint (Attempts() > 1): it skips the phases
// done and resumes. Pass each external call a key from Attempt.DerivedKey(step), the same in
// every attempt, so a phase that ran but was not checkpointed is not done twice by the
// provider either.
//
// # Retention and tombstones
//
// A key is kept for Retention (default 24 hours) after its first attempt, by the database
// clock; until GC removes it, it still replays (retention is a minimum). GC deletes expired
// keys in batches and leaves a tombstone — scope, key, fingerprint — kept for
// GCOpts.Tombstone (default 30 days), during which the key is refused (ErrExpired, 422)
// rather than silently executed again. `pgcoord idempotency gc` runs it.
//
// # Round trips
//
// A replay costs one round trip (a plain read). A new key costs three: that read, BEGIN
// with the claim, and the stored response with COMMIT; with Atomic the claim is a round
// trip of its own, but the BEGIN and COMMIT are the ones the handler's own transaction
// would have needed, so Atomic mode adds two round trips to the bare handler (the issue's
// budget). `pgcoord bench --only idempotency` measures both beside the bare handler.
//
// # Guarantees
//
//   - At most one attempt holds a key at a time; while it is alive, no other executes.
//     Concurrent requests with one key: one executes, the others get 409 or (with Wait)
//     its response.
//   - A stored response is final: every later repeat with the same fingerprint gets the
//     same status, stored headers and body, byte for byte, until the key is removed by GC.
//     A client never receives a first response that was not stored (the middleware sends
//     it after the COMMIT that stores it).
//   - A repeat with a different fingerprint is refused, whatever the key's state; never
//     answered with another request's response.
//   - Nothing is half-stored: the response is stored in the COMMIT that ends the attempt,
//     with the handler's writes in Atomic mode. A failed attempt (5xx, panic, oversize
//     response, lost connection, crash) stores nothing, and the next attempt executes.
//   - A dead holder's key is recovered by the next attempt at once: its lock died with its
//     connection.
//   - Expiry is judged by the database clock alone (pgcoord_now()): no option lets a caller
//     choose the time a key is created or judged at.
//   - What the store cannot keep is refused before any SQL runs, with an error wrapping
//     pgcoord.ErrInvalidArgument (or pgcoord.ErrInvalidName): a status outside 100..999,
//     a header with a NUL byte, headers over MaxStoredHeaderBytes, a MaxResponseBytes over
//     MaxStoredBodyBytes (16 MiB), recovery data over MaxRecoveryDataBytes (1 MiB), a
//     recovery point that is not a 1 to 255 byte name — the bounds the SQL functions of
//     00005_idempotency.sql enforce for plain SQL callers.
//
// # Failure modes
//
//   - Effects outside the database: a process that dies after calling a payment provider
//     but before Complete leaves a key the next attempt executes again. Pass the provider
//     DerivedKey (the provider then does the charge once) and record recovery points.
//   - The holder's connection lives but the process hangs (GC pause, SIGSTOP): the key
//     stays held, repeats get 409, until the process resumes or its connection is killed
//     (pg_terminate_backend, TCP keepalive, idle_in_transaction_session_timeout).
//   - Checkpoint commits and re-takes the lock in one round trip; a repeat that takes the
//     lock in that instant takes the key over (and resumes from the point just recorded),
//     and Checkpoint returns ErrLost: stop the work.
//   - An attempt's first phase is not committed until it completes or checkpoints, so
//     `pgcoord idempotency list --in-flight` shows only attempts that checkpointed; the
//     others are visible to repeats through their lock only.
//   - GC skips keys held by a live attempt; a key whose retention passes while its holder
//     is dead is deleted (and tombstoned) like any other.
//   - The response is buffered, up to MaxResponseBytes: streaming responses are not
//     supported.
//   - With asynchronous replication, a stored response committed on a primary that dies
//     before the standby received it is lost on failover, and the retry executes again.
//   - Only a primary takes writes: on a standby (or in a read-only transaction) Begin of a
//     key that is not completed, Complete, Checkpoint and GC fail with an error wrapping
//     pgcoord.ErrReadOnly (the middleware answers 500 and logs it); a replay works there.
package idempotency
