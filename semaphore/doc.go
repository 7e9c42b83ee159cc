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
// and runs one job of that tenant, which Done marks as done (see Fair admission below).
// SetLimit changes a key's limit and weight at run time; Drain revokes its permits; Get,
// List and Permits show the state to operators (`pgcoord semaphores ...`).
//
// Every operation is one round trip to a SQL function of pgcoord's schema
// (pgcoord_semaphore_acquire, _renew, _release, _next, _done, ...), which plain SQL callers
// can use directly: see docs/sql-api.md.
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
//   - Fence tokens strictly increase and are never reused: every permit's token is higher
//     than every earlier permit's, of its key and of every other (they come from one
//     counter of pgcoord's schema, shared with leases and the other primitives), after
//     release, expiry, drain, restart, crash recovery, garbage collection of idle keys
//     (pgcoord gc), and failover (docs/failover.md). Only a primary admits: on a standby,
//     admissions, renewals and releases fail with pgcoord.ErrReadOnly.
//   - First come, first served within a key: Acquire callers are admitted in the order
//     they joined the line, and a TryAcquire or Next never takes a slot while a live
//     waiter is in line for it. A waiter that stops asking (a dead process) loses its
//     place after twice its PollInterval plus a second.
//   - Waiting never starves a holder: a waiting Acquire holds no connection of its pool.
//     All the waiters of a pool share one LISTEN connection, which the pool's notifier
//     takes out of the pool once, and each attempt borrows a connection only for its round
//     trips: however many wait, they never hold the connections the holders' renewals
//     need.
//   - No job is stranded by a worker that dies. A permit of Next reserves one unit of its
//     key's demand; only Done, in the transaction that removes the job from the
//     application's queue, consumes it. A permit that ends any other way — released,
//     expired because its worker died at any point, drained — gives its unit back, and the
//     job taken under it (marked with its token: see The worker) is free to be taken again
//     under a later permit.
//   - Renew, Release and Done act on one permit (key + holder + token). On a permit that is
//     no longer held they change nothing and return ErrLost: releasing twice, or after
//     Done, is harmless, and a late release never frees a slot someone else holds.
//   - A permit whose reply was lost is recovered by asking again as the same holder:
//     TryAcquire and Next retry once by themselves on a connection failure, Acquire asks
//     once more, and a caller that sets AcquireOpts.Holder (NextOpts.Holder) gets its
//     permit back from any later call.
//   - Admissions, releases and drains are durable commits (Done commits with the caller's
//     transaction); renewals with AsyncCommit are asynchronous, and losing one in a crash
//     only shortens the permit.
//   - Raising a limit wakes the key's waiters at once (SetLimit notifies). A release
//     notifies only while someone waits: NOTIFY serializes committing transactions
//     server-wide, so an uncontended release must not send one.
//   - The memory of Metrics (DefaultMetrics included) is bounded whatever the number of
//     keys: about 5 MiB at the default (see Metrics).
//
// # Fair admission
//
// A worker that cannot get a slot for its tenant must not wait idle for it: it leaves the
// job queued and works for another tenant. Next does that choice in the database, with
// start-time fair queuing over keys:
//
//   - Each key has a demand — the number of its units of work (jobs) not yet done: queued,
//     or in hand under a permit of Next — and a virtual time V. Producers report demand
//     with AddDemand(+n) in the transaction that enqueues the n jobs (and AddDemand(-n)
//     when they cancel queued ones), so the count commits with the jobs. It is a count,
//     not the queue: the jobs stay in the application's own table.
//   - Next admits the caller to the key that has a unit of demand no live permit of Next
//     has reserved, room — fewer live permits, plus live Acquire waiters, than its limit —
//     and the smallest V (ties by key). The permit reserves that unit, and the key's V
//     advances by 1/weight. The worker then takes one job of that key and, when it is
//     done, calls Done (see The worker below).
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
// # The worker
//
// After Next, the worker takes one job of Permit.Key from its queue, marking it with
// Permit.Token, runs it, and then removes the job and calls Done in one transaction, so
// the job and its unit of demand go together; a deferred Release covers every other
// ending. A job whose mark names a permit that is no longer live (the SQL function
// pgcoord_semaphore_held is false) is free again, and so is its unit: a worker that dies
// after Next, after taking the job, while running it, or before its Done commits strands
// nothing — the job runs again, under a permit with a higher token, once the dead worker's
// permit expires. Jobs run at least once, not exactly once: make their effects
// idempotent, or fence them with the token. With a jobs table (id, tenant, payload,
// permit_token bigint):
//
//	p, err := semaphore.Next(ctx, pool, 30*time.Second, nil)
//	if errors.Is(err, semaphore.ErrNoWork) { ... pause, or wait for news of new jobs ... }
//	if err != nil { return err }
//	defer semaphore.Release(ctx, pool, p) // gives the unit back, unless Done consumed it
//	// Take one job of p.Key that is not in hand: never taken, or taken under a permit
//	// that is no longer live (its worker died or gave up).
//	err = pool.QueryRow(ctx, `UPDATE jobs SET permit_token = $2 WHERE id = (
//		SELECT id FROM jobs WHERE tenant = $1
//		   AND (permit_token IS NULL OR NOT pgcoord_semaphore_held(tenant, permit_token))
//		 ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED)
//		RETURNING id, payload`, p.Key, p.Token).Scan(&id, &payload)
//	if errors.Is(err, pgx.ErrNoRows) { return nil } // the count ran ahead of the queue
//	// ... run the job: renew p if it may outlive the TTL, fence its writes with p.Token ...
//	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
//		tag, err := tx.Exec(ctx, `DELETE FROM jobs WHERE id = $1 AND permit_token = $2`, id, p.Token)
//		if err == nil && tag.RowsAffected() == 0 {
//			err = semaphore.ErrLost // taken again under a later permit: ours expired
//		}
//		if err != nil {
//			return err
//		}
//		return semaphore.Done(ctx, tx, p) // ErrLost: roll back; the job stays queued
//	})
//
// A job that fails and should be retried later needs nothing more than the Release: its
// mark goes stale with the permit, and its unit goes back. examples/tenant-pool is this
// worker as a program, with renewals and shutdown.
//
// # Failure modes
//
//   - Heartbeat or lose the slot. A job that may run longer than the TTL must Renew its
//     permit well before expiry (every third of the TTL; AsyncCommit is enough). A worker
//     that stops renewing — crashed, paused by GC or SIGSTOP, partitioned — loses its
//     permit at expiry, and the next admission gives the slot to someone else (and, for
//     a permit of Next, its job to another worker). If that worker is in fact still
//     running, the key has more jobs running than its limit — and its job may run twice —
//     and nothing in the semaphore can stop it: it learns of the loss only at its next
//     Renew or its Done (ErrLost) or when Permit.TrustUntil passes. Fence the job's writes
//     with Permit.Token (package fenced): a job redone under a later permit of the key has
//     a higher token, and the stale worker's writes are refused.
//   - A worker that crashes holds its slot — and its job and unit of demand, for a permit
//     of Next — until its permit expires. Release in a defer and keep TTLs short.
//   - Demand is a count the application keeps: it equals the jobs not yet done only if
//     every enqueue or cancellation reports its AddDemand in the same transaction, and
//     every job is removed together with Done. Demand above the jobs (a job removed
//     without Done, say by hand) makes Next admit workers that find no job: they release
//     the permit, which gives the unit back, so the key keeps being chosen (at its fair
//     turn) until AddDemand(-n) corrects it. Demand below the jobs leaves jobs waiting
//     until their units are reported.
//   - Lowering the limit revokes nothing: permits already held stay valid until released
//     or expired, so Held can exceed Limit for a while (KeyStatus.OverLimit); new
//     admissions wait until fewer than the new limit are live. Drain revokes permits, and
//     their holders learn it at their next renewal or Done.
//   - The limit given to TryAcquire, Acquire and AddDemand applies only when the call
//     creates the key; afterwards the stored limit (SetLimit) decides.
//   - A TryAcquire on a key that is plainly full is refused from plain reads: it writes
//     nothing and waits for nothing. Every other attempt locks the key's row and commits,
//     and so does every round of a waiting Acquire. Do not spin on TryAcquire: wait with
//     Acquire, or work for another key with Next.
//   - Behind a transaction-mode pooler (PgBouncer), notifications do not arrive: set
//     AcquireOpts.NoListen, and Acquire polls (every PollInterval, and at the earliest
//     permit expiry). Otherwise the pool's notifier holds one connection, outside the
//     pool's count, while any Acquire (or other pgcoord waiter) of the process waits on
//     that pool, and for about ten seconds after.
//   - Called inside the caller's transaction (db a pgx.Tx), an admission, AddDemand or
//     Done keeps the key's row locked until that transaction ends: other admissions of
//     the key wait for it — Next included, and since Next calls take turns, every Next of
//     the schema waits while one waits for that row. Keep such transactions short, and
//     make AddDemand and Done their last statements. Expiry is judged at the
//     transaction's start, so a permit granted late in a long transaction is shorter than
//     its TTL.
//   - With asynchronous replication, a permit committed on a primary that fails before
//     the standby receives it is lost: the promoted standby can admit one more holder
//     (with a higher token) than the limit while the first still works. Use a synchronous
//     standby, for every commit or for admissions only (AcquireOpts.SyncCommit,
//     NextOpts.SyncCommit); see docs/failover.md.
//   - Two callers that set the same holder identity are one holder: they share a permit.
//     Next with a fixed NextOpts.Holder that already holds a live permit returns that
//     permit, whatever key it is of, and reserves no other unit.
package semaphore
