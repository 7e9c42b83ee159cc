// Package semaphore limits concurrency per key across a cluster — "at most K concurrent
// jobs per tenant" — and shares workers fairly between keys, with Postgres as the only
// moving part. A permit is one of a key's K slots: a lease, judged by the database clock,
// whose fence token is higher than every earlier permit's.
//
//	p, err := semaphore.TryAcquire(ctx, pool, "tenant:42", 3, 30*time.Second, nil)
//	if errors.Is(err, semaphore.ErrFull) { ... work for another tenant: see Next ... }
//	if err != nil { return err }
//	defer semaphore.Release(ctx, pool, p)
//	// ... run the job, renewing p if it may outlive the TTL; its writes carry p.Token ...
//
// Acquire waits in line instead, woken by LISTEN/NOTIFY. Next is fair admission: a permit
// of the key furthest behind its weighted share among those with demand (AddDemand) and
// room (and, with NextOpts.RatePolicy, under its rate: package ratelimit); Done, in the
// transaction that removes the job, marks the job done. SetLimit sets
// a key's limit and weight, Drain revokes its permits, Get, List and Permits show the
// state. Each call is one round trip to a SQL function (docs/sql-api.md). Fair admission,
// the worker loop, and these lists in full: docs/semaphores.md.
//
// With a pool, concurrent admissions (TryAcquire, Acquire's attempts), renewals and
// releases of this process are coalesced as the lease calls are (see package leases): up
// to four statements of each kind in flight on a pool, and the calls that arrive while all
// four are out go together, as one statement and one commit, when one returns. Calls in
// the caller's own transaction, or on a single connection, are never merged.
//
// # Guarantees
//
//   - The limit is exact: at no instant of the database clock are more permits of a key
//     live than its limit (unless it was lowered); each admission counts under the key's
//     row lock.
//   - A dead holder's slot comes back when its permit expires, never before.
//   - Fence tokens strictly increase across keys and primitives and are never reused, not
//     after release, expiry, drain, crash, gc or failover. Only a primary admits: on a
//     standby, admissions, renewals and releases fail with pgcoord.ErrReadOnly.
//   - First come, first served within a key: Acquire waiters in arrival order, and no
//     TryAcquire or Next takes a slot a live waiter is in line for.
//   - Waiting never starves holders: waiters hold no connection of their pool (they share
//     one LISTEN connection).
//   - No job is stranded: a permit of Next reserves a unit of demand that only Done
//     consumes; a permit that ends any other way gives it back, and frees its job.
//   - Renew, Release and Done act on one permit: on a permit no longer held they change
//     nothing and return ErrLost, so a late release never frees someone else's slot.
//   - A permit whose reply was lost is recovered by asking again as the same holder.
//   - Admissions, releases and drains are durable commits; losing an AsyncCommit renewal
//     in a crash only shortens the permit.
//   - Raising a limit wakes the key's waiters at once.
//   - No stranger can stall Next: its calls take turns by the row lock of
//     pgcoord_semaphore_turn, which a login without a grant on it cannot take (there is no
//     advisory lock in this package; integration_test TestSquattingLoginStallsNoPrimitive).
//   - A Metrics' memory is bounded whatever the number of keys (about 5 MiB by default).
//   - Coalescing changes no answer, and a transaction of yours waiting for a key's row
//     that a batch holds is never chosen to die in a deadlock, as for leases. A coalesced
//     TryAcquire or Acquire whose context ends while its batch is in flight returns the
//     context's error at once; a permit the batch then grants it is released, unless the
//     caller chose the holder.
//
// # Failure modes
//
//   - Renew (every TTL/3) or lose the slot: a worker that stops renewing loses its permit
//     at expiry; if it still runs, the key runs more jobs than its limit and the job may
//     run twice, until its next Renew or Done (ErrLost) or Permit.TrustUntil. Fence the
//     job's writes with Permit.Token.
//   - A crashed worker holds its slot (under Next, its job and unit too) until expiry:
//     Release in a defer and keep TTLs short.
//   - Demand is the application's count: AddDemand and Done belong in the transactions
//     that enqueue and remove the jobs, or Next admits for jobs that are not there.
//   - Lowering a limit revokes nothing (KeyStatus.OverLimit meanwhile); Drain revokes,
//     and holders learn it at their next Renew or Done.
//   - The limit passed to TryAcquire, Acquire and AddDemand applies only to a new key.
//   - Do not spin on TryAcquire: only a plainly full key is refused without a write. Wait
//     with Acquire, or work for another key with Next.
//   - Behind a transaction-mode pooler notifications do not arrive: the pool's first wait
//     finds the pooler and Acquire polls. Otherwise waiting holds one connection outside
//     the pool's count.
//   - In the caller's transaction, an admission, AddDemand or Done locks the key's row until
//     it ends, stalling the key's admissions and every Next: make them last in short
//     transactions. Expiry is judged at the transaction's start.
//   - With asynchronous replication, a failover can lose a permit and admit one holder
//     too many: use a synchronous standby (AcquireOpts.SyncCommit, NextOpts.SyncCommit).
//   - Callers that set the same holder identity share a permit: Next with a fixed holder
//     that has a live permit returns it, whatever its key.
package semaphore
