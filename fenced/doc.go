// Package fenced rejects writes from holders whose lease was taken over: the storage side
// of fencing tokens.
//
// A lease (package leases) cannot by itself stop a holder that was paused past its TTL and
// woke up still believing it holds the lease. The data can: every write carries the fence
// token of the grant it was made under, and the data refuses a token lower than one it
// knows to be newer. This package offers these ways to do that for data in the same
// PostgreSQL database:
//
//   - CheckLease: verify inside the write's transaction that the grant is still current,
//     and hold it until the transaction ends — mutual exclusion for writes in this
//     database. The path that is safe in every interleaving: use it when a write must
//     happen once (a charge, an email recorded as sent).
//   - Check: a fence register (pgcoord_fences) consulted inside the write's transaction —
//     any resource name, any writes. Write does the check and one write in a single round
//     trip. Name the resource like the lease ("order:42"), and the register also knows
//     the lease's newest grant before its holder has written anything.
//   - Exec: the conditional update on your own table (UPDATE ... WHERE fence_token <= $n),
//     with "no row affected" turned into ErrStale.
//   - InstallGuard: a trigger on your table that refuses stale writes whatever code path
//     sends them: UPDATEs that lower its fence column, and, given a resource column (see
//     GuardOpts), every INSERT and UPDATE whose token the register of its resource refuses.
//
// For systems outside the database, send the token along (or derive an idempotency key
// from the work, not from the token) and have the other side keep what it has seen.
//
// # Guarantees
//
//   - Check, Write and the guard with a resource column refuse a token lower than the
//     newest grant of the lease named like the resource — even before that grant's holder
//     wrote — or lower than the highest token recorded for the resource. They record the
//     token and keep the register row locked until the caller's transaction ends, so
//     concurrent writers of one resource are ordered, and the tokens accepted for a
//     resource in committed transactions never decrease.
//   - A register collected by pgcoord gc (not written for longer than the retention), or a
//     lease row collected with it, leaves its token in the retired floor: a resource with
//     no register accepts only a token at least as high as the floor, unless the token is
//     the newest grant of the lease named like the resource. So garbage collection never
//     lets an old token through again.
//   - The guard trigger refuses, with SQLSTATE PGC01, an UPDATE that lowers the fence
//     column or sets it to NULL; with a resource column, also any INSERT or UPDATE whose
//     row carries no token, no resource, or a token the resource's register refuses.
//     Check, Write and Exec callers see it as ErrStale.
//   - After CheckLease succeeds, no other holder can be granted the lease, and neither a
//     release nor an operator expiry can complete, until the caller's transaction ends:
//     the transaction's writes are made while the grant is current by the database clock.
//
// What each path protects:
//
//   - Check, Write, Exec and the guard order OVERWRITES: a stale write can never replace
//     a newer holder's, and with the resource named like the lease a stale write is
//     refused as soon as the lease was granted again, before the newer holder writes. They
//     do not make an effect happen once. A holder whose check was accepted — it checked
//     before the takeover, or, for a resource not named like its lease, before the newer
//     holder's first write — still completes its write, and the newer holder's write is
//     accepted after it. For a non-idempotent effect (a charge, an email) that is twice.
//     In this database, the newer holder sees the first effect only if it reads the state
//     after its own Check, in the same transaction; an effect outside the database is
//     never protected by a register.
//   - CheckLease is safe in every interleaving for writes in the same database: no
//     takeover completes while the checking transaction is open, so a newer holder starts
//     after the older one's writes committed (or rolled back), and reads them. A write that
//     must happen once belongs in a transaction that starts with CheckLease and checks the
//     state it changes (UPDATE ... WHERE status = 'pending', a unique key).
//   - Nothing here stops a call to another system: give it an idempotency key derived
//     from the work (the order), so that two holders send the same key.
//
// # Failure modes
//
//   - Fencing fails silently if any write path skips it. The guard trigger catches a stale
//     token written by any path; without a resource column it judges UPDATEs only (an
//     INSERT by a stale holder passes), and it never catches an UPDATE that leaves the
//     fence column as it is. Give the guard a resource column to cover INSERTs.
//   - Exec trusts the caller's SQL to contain the fence comparison.
//   - The retired floor can refuse a current holder in one case: a grant older than the gc
//     retention writing for the first time (or the first time since its register was
//     collected) to a resource that is not named like its lease. Keep the retention longer
//     than any lease is held, or name resources like their leases.
//   - CheckLease makes a takeover wait for the checking transaction: keep those
//     transactions short, or the lease's next holder waits (and VACUUM is held back).
//   - Check and Write lock the register row until the transaction ends: a long transaction
//     makes every other writer of the resource wait.
//   - Everything here needs the write to happen in the same database as the register or
//     table; a write to another system is protected only by passing a key along.
//   - Only a primary takes writes: on a standby (or in a read-only transaction) Check,
//     Write, Exec, CheckLease, InstallGuard and RemoveGuard fail with an error wrapping
//     pgcoord.ErrReadOnly.
package fenced
