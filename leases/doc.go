// Package leases grants named, time-limited leases with fencing tokens, judged by the
// database clock.
//
// A lease is a lock with a time limit, so a dead holder cannot block everyone forever. The
// price is that nobody can tell a dead holder from a slow one: a holder paused by GC, swap
// or SIGSTOP past its TTL wakes up still believing it holds the lease, after another holder
// took it. No renewal loop removes that window. What makes a lease safe is the fence token:
// every grant of a name gets a token higher than all before it, the holder sends it with
// every write, and the storage rejects a write whose token is lower than one it has seen
// (package fenced does this for data in the same database, and a token can serve as part
// of an idempotency key for systems outside it).
//
//	lease, err := leases.TryAcquire(ctx, pool, "order:42", 30*time.Second, nil)
//	if errors.Is(err, leases.ErrHeld) { ... someone else is on it ... }
//	defer leases.Release(ctx, pool, lease, nil)
//	// ... every write carries lease.Token ...
//
// Do runs a function under a lease and keeps the lease alive meanwhile; Acquire waits for a
// lease, woken by LISTEN/NOTIFY when it is released.
//
// Every operation is one round trip to a SQL function of pgcoord's schema
// (pgcoord_lease_acquire, _renew, _release, ...), which plain SQL callers can use directly:
// see docs/sql-api.md. No call takes a time argument: expiry is judged by the database
// clock alone.
//
// With a pool, concurrent TryAcquire, Renew and Release calls of this process are
// coalesced (group commit): a call that finds fewer than two of its kind in flight on its
// pool goes out at once, alone; those that arrive while two are out go together, as one
// statement and one commit, when one returns (on this project's 2-core machine, 32 workers
// through one pool granted and released 1.1-1.4x as fast as 32 connections of hand-written
// SQL: docs/benchmarks.md). Calls in the caller's own transaction, or on a single
// connection, are never merged.
//
// # Guarantees
//
//   - At most one holder has an unexpired grant of a name at any instant of the database
//     clock. Concurrent acquirers of a free lease get exactly one winner.
//   - Every grant gets a fence token higher than every token issued before it in the
//     schema (leases, semaphore permits, job runs and outbox claims share one counter), so
//     the tokens of a name strictly increase and are never reused: not after release,
//     expiry, operator expiry, restart, crash recovery, or the garbage collection of the
//     lease's row (pgcoord gc; the fence register keeps refusing the older grants, see
//     package fenced). Nor after a failover: a promoted standby issues tokens above every
//     token of the old primary's timeline, even those of grants it never received (see
//     docs/failover.md). Tokens are not consecutive: compare them, never count them.
//   - Only a primary grants: on a standby, acquires, renewals and releases fail with
//     pgcoord.ErrReadOnly (Get and List work there).
//   - Expiry is judged by the database clock only; no option and no SQL argument lets a
//     caller choose the instant. A holder stops trusting its grant at Lease.TrustUntil,
//     computed from its own monotonic clock as the instant it sent the request plus the
//     TTL the database reported left, minus a safety margin: never later than the database
//     would expire it.
//   - Renew and Release act on one grant (name + holder + token). On a grant that is no
//     longer current they change nothing and return ErrLost; a late release can never free
//     the next holder's lease.
//   - A failed TryAcquire writes nothing and locks nothing (no WAL, no commit to wait for).
//   - A grant whose reply was lost is recovered by retrying as the same holder: TryAcquire
//     and each attempt of Acquire retry once by themselves on a connection failure, and a
//     caller that sets AcquireOpts.Holder gets its existing grant back from any later call.
//   - A waiting Acquire (or Elector candidate) holds no connection: every waiter of a pool
//     shares the pool's one LISTEN connection, and each attempt borrows a connection for
//     one statement. Waiters cannot starve a holder's renewals of connections.
//   - Do tells a lost lease from a cancellation: when the lease was lost while fn ran (taken
//     over, expired by an operator, trust deadline passed), Do's error wraps ErrLost,
//     whatever fn returned; it wraps context.Canceled only if the caller's context was
//     cancelled.
//   - Grants, releases and operator expiries are durable commits; renewals made by Do are
//     asynchronous commits, whose loss in a crash only shortens the lease.
//   - Coalescing changes no answer: a merged call gets the grant, refusal or error it would
//     have got alone, and its own error — a batch that fails in the database (it rolled
//     back) is sent again call by call. A batch takes rows in name order and waits at most
//     100 ms for one (lock_timeout), then is sent again call by call: a transaction of
//     yours that waits for a row a batch holds is never chosen to die in a deadlock.
//   - A coalesced TryAcquire whose context ends while its batch is in flight returns the
//     context's error at once; a grant the batch then makes for it is released, unless the
//     caller chose the holder (AcquireOpts.Holder), who gets it back by asking again.
//
// # Failure modes
//
//   - A paused or partitioned holder keeps running past its lease until it next checks;
//     only fencing at the data stops its writes. Do cancels the function's context when the
//     lease is lost or the trust deadline passes, but cannot interrupt code that does not
//     look at its context.
//   - A holder that crashes without releasing blocks the name until its grant expires.
//     Keep TTLs short and renew (Do does).
//   - Behind a transaction-mode pooler (PgBouncer), notifications do not arrive: the
//     pool's first wait finds the pooler (the server's process id is not the one the
//     connection was given) and Acquire polls, every PollInterval and at the expiry of
//     the current grant, without LISTENing through the pooler.
//   - The first waiter of a pool takes one connection out of the pool for the shared
//     LISTEN, and the pool no longer counts it against MaxConns: the server sees one
//     connection more than MaxConns while anyone waits. It is closed a few seconds after
//     the last waiter of the pool left. If it fails, waiters are woken to try again, and it
//     is replaced.
//   - With asynchronous replication, a grant committed on a primary that fails before the
//     standby receives it is lost: the promoted standby can grant the lease again (with a
//     higher token) while the first holder still trusts it. Where grants must survive a
//     failover, use a synchronous standby, for every commit or for grants only
//     (AcquireOpts.SyncCommit); see docs/failover.md.
//   - Two callers that set the same AcquireOpts.Holder are one holder to pgcoord: they
//     share the grant.
//   - A coalesced call waits for the batch in flight before its own goes out: under load a
//     call's latency is up to two statements, which is what buys the throughput. A
//     connection failure mid-batch fails every call of the batch (a TryAcquire asks once
//     more as its holder, as alone).
package leases
