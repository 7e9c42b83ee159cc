// Package semaphore limits concurrency per key across a cluster — "at most K concurrent
// jobs per tenant" — and shares workers fairly between keys, with Postgres as the only
// moving part.
//
// A key (a tenant) has a limit K. A permit is one of its K slots: a lease held by one
// holder until it is released or expires, by the database clock, with a fence token
// higher than every earlier permit of the key.
//
//	p, err := semaphore.TryAcquire(ctx, pool, "tenant:42", 3, 30*time.Second, nil)
//	if errors.Is(err, semaphore.ErrFull) { ... work for another tenant: see Next ... }
//	if err != nil { return err }
//	defer semaphore.Release(ctx, pool, p)
//	// ... run the job, renewing p every 10s if it may run longer than the TTL;
//	// every write carries p.Token ...
//
// Acquire waits in line for a permit instead, woken by LISTEN/NOTIFY. Next is fair
// admission across keys: a worker asks for "a permit of whichever tenant should go next"
// and runs one job of that tenant (see Fair admission below). SetLimit changes a key's
// limit and weight at run time; Drain revokes its permits; Get, List and Permits show the
// state to operators (`pgcoord semaphores ...`).
//
// Every operation is one round trip to a SQL function of pgcoord's schema
// (pgcoord_semaphore_acquire, _renew, _release, _next, ...), which plain SQL callers can
// use directly: see docs/sql-api.md.
//
// # Guarantees
//
//   - The limit is exact under any concurrency: at no instant of the database clock are
//     more than the key's limit of permits live (except after the limit was lowered: see
//     Failure modes). Every admission — TryAcquire, Acquire, Next — locks the key's row,
//     reclaims the key's expired permits, counts the live ones and the live waiters ahead
//     of it, and inserts a permit only below the limit, in one transaction.
//   - A permit that is neither renewed nor released (its worker died) stops counting at its
//     ExpiresAt, by the database clock, and is deleted by the key's next admission: the
//     slot comes back after the TTL, never before. A waiting Acquire tries again at the
//     earliest expiry of the key's permits.
//   - Fence tokens of a key strictly increase with each permit and are never reused: not
//     after release, expiry, drain, restart or crash recovery (the key's row, which holds
//     the counter, cannot be deleted), nor after a failover (docs/failover.md). Only a
//     primary admits: on a standby, admissions, renewals and releases fail with
//     pgcoord.ErrReadOnly.
//   - First come, first served within a key: Acquire callers are admitted in the order
//     they joined the line, and a TryAcquire or Next never takes a slot while a live
//     waiter is in line for it. A waiter that stops asking (a dead process) loses its
//     place after twice its PollInterval.
//   - Renew and Release act on one permit (key + holder + token). On a permit that is no
//     longer held they change nothing and return ErrLost: releasing twice is harmless, and
//     a late release never frees a slot someone else holds.
//   - A permit whose reply was lost is recovered by asking again as the same holder:
//     TryAcquire retries once by itself on a connection failure, Acquire asks once more on
//     another connection, and a caller that sets AcquireOpts.Holder gets its permit back
//     from any later call.
//   - Admissions, releases and drains are durable commits; renewals with AsyncCommit are
//     asynchronous, and losing one in a crash only shortens the permit.
//   - Raising a limit wakes the key's waiters at once (SetLimit notifies). A release
//     notifies only while someone waits: NOTIFY serializes committing transactions
//     server-wide, so an uncontended release must not send one.
//
// # Fair admission
//
// A worker that cannot get a slot for its tenant must not wait idle for it: it leaves the
// job queued and works for another tenant. Next does that choice in the database, with
// start-time fair queuing over keys:
//
//   - Each key has a demand — the number of its jobs waiting — and a virtual time V.
//     Producers report demand with AddDemand(+n) in the transaction that enqueues the n
//     jobs (and AddDemand(-n) when they cancel some), so the count commits with the jobs.
//     It is a count, not the queue: after Next returns a permit for a key, the worker
//     takes one job of that key from the application's own queue (SELECT ... FOR UPDATE
//     SKIP LOCKED LIMIT 1), runs it, and releases the permit.
//   - Next admits the caller to the key that has demand and room — fewer live permits,
//     plus live Acquire waiters, than its limit — and the smallest V (ties by key). The
//     admission consumes one unit of demand and advances the key's V by 1/weight.
//   - So while several keys have work, admissions interleave in proportion to their
//     weights: every admission puts the served key behind the others by 1/weight, and
//     the key furthest behind goes next. With weights 3 and 1, both backlogged, the first
//     is admitted three times for each admission of the second; at any moment each key's
//     admissions divided by its weight differ between keys by about one.
//   - The size of a backlog never enters the choice. A tenant that enqueued 1,000,000
//     jobs and one that enqueued 10, with equal weights, alternate: the small tenant's 10
//     jobs are admitted within its first 10 turns — about 20 admissions in all, plus one
//     per worker running concurrently — however many the big one has queued. The big
//     backlog only decides what happens when nobody else has work: then the big tenant
//     gets every free worker, up to its limit. No capacity idles while any key has demand
//     and room.
//   - A key that returns after an idle spell (its demand goes from 0 to more) starts at
//     the system's virtual time — the V of the key served last — and a new key starts
//     there too. Idling earns no credit (otherwise a tenant back from a week off would
//     monopolize the workers until its V caught up) and costs no place either: it is
//     served at once and shares fairly from then on. Keys held back by their limit lag
//     behind the system's V; they do not pull a returning key back to their level.
//   - The per-key limit still holds: a key at its limit is skipped (its V does not
//     advance) and the worker goes to the next key in V order. A key's Acquire waiters
//     come before Next.
//   - Concurrency: Next calls of one schema take turns (a transaction-level advisory
//     lock held until the admission commits), so admissions follow the fair order exactly.
//     Letting a concurrent caller skip the key being served and take the next one would
//     hand the lower-priority key the turn: measured, weights 3:1 came out 1.2:1. The
//     price is that Next admits at most one permit per commit of the database; each
//     admission stands for a unit of work, which is normally far longer.
//   - Big jobs should be split into chunks, each its own unit of demand and its own
//     permit, so a tenant's huge import holds its slots for minutes, not hours.
//
// # Failure modes
//
//   - Heartbeat or lose the slot. A job that may run longer than the TTL must Renew its
//     permit well before expiry (every third of the TTL; AsyncCommit is enough). A worker
//     that stops renewing — crashed, paused by GC or SIGSTOP, partitioned — loses its
//     permit at expiry, and the next admission gives the slot to someone else. If that
//     worker is in fact still running, the key has more jobs running than its limit, and
//     nothing in the semaphore can stop it: it learns of the loss only at its next Renew
//     (ErrLost) or when Permit.TrustUntil passes. Fence the job's writes with
//     Permit.Token (package fenced): a job redone under a later permit of the key has a
//     higher token, and the stale worker's writes are refused.
//   - A worker that crashes holds its slot until its permit expires. Release in a defer
//     and keep TTLs short.
//   - Lowering the limit revokes nothing: permits already held stay valid until released
//     or expired, so Held can exceed Limit for a while (KeyStatus.OverLimit); new
//     admissions wait until fewer than the new limit are live. Drain revokes permits, and
//     their holders learn it at their next renewal.
//   - The limit given to TryAcquire, Acquire and AddDemand applies only when the call
//     creates the key; afterwards the stored limit (SetLimit) decides.
//   - A TryAcquire on a key that is plainly full is refused from plain reads: it writes
//     nothing and waits for nothing. Every other attempt locks the key's row and commits,
//     and so does every round of a waiting Acquire. Do not spin on TryAcquire: wait with
//     Acquire, or work for another key with Next.
//   - Behind a transaction-mode pooler (PgBouncer), notifications do not arrive: set
//     AcquireOpts.NoListen, and Acquire polls (every PollInterval, and at the earliest
//     permit expiry). A waiting Acquire holds one connection of the pool until it returns.
//   - Called inside the caller's transaction (db a pgx.Tx), an admission or AddDemand
//     keeps the key's row locked until that transaction ends: other admissions of the key
//     wait for it (Next skips the key). Keep such transactions short. Expiry is judged at
//     the transaction's start (now()), so a permit granted late in a long transaction is
//     shorter than its TTL.
//   - With asynchronous replication, a permit committed on a primary that fails before
//     the standby receives it is lost: the promoted standby can admit one more holder
//     (with a higher token) than the limit while the first still works. Use a synchronous
//     standby, for every commit or for admissions only (AcquireOpts.SyncCommit,
//     NextOpts.SyncCommit); see docs/failover.md.
//   - Two callers that set the same holder identity are one holder: they share a permit.
//     Next with a fixed NextOpts.Holder that already holds a permit of the chosen key
//     returns that permit and still consumes a unit of demand.
package semaphore
