// Package fenced rejects writes from holders whose lease was taken over: the storage side
// of fencing tokens.
//
// A lease (package leases) cannot by itself stop a holder that was paused past its TTL and
// woke up still believing it holds the lease. The data can: every write carries the fence
// token of the grant it was made under, and the data refuses a token lower than one it has
// already seen. This package offers four ways to do that for data in the same PostgreSQL
// database, from the most general to the strongest:
//
//   - Check: a fence register (pgcoord_fences) consulted inside the write's transaction —
//     any resource name, any writes. Write does the check and one write in a single round
//     trip.
//   - Exec: the conditional update on your own table (UPDATE ... WHERE fence_token <= $n),
//     with "no row affected" turned into ErrStale.
//   - InstallGuard: a trigger on your table that refuses any UPDATE lowering its fence
//     column, whatever code path sends it.
//   - CheckLease: verify inside the transaction that the grant is still current and hold
//     it until the transaction ends — real mutual exclusion for writes in this database.
//
// For systems outside the database, send the token along (or derive an idempotency key
// from it) and have the other side keep the highest token it has seen.
//
// # Guarantees
//
//   - Check accepts a token equal to or higher than the highest recorded for the resource,
//     records it, and keeps the register row locked until the caller's transaction ends; a
//     lower token gets ErrStale. Tokens accepted for one resource in committed
//     transactions never decrease.
//   - The guard trigger refuses, with SQLSTATE PGC01, an UPDATE that lowers the fence
//     column or sets it to NULL; Exec and Check callers see it as ErrStale.
//   - After CheckLease succeeds, no other holder can be granted the lease (and neither a
//     release nor an operator expiry can complete) until the caller's transaction ends.
//
// # Failure modes
//
//   - Fencing fails silently if any write path skips it. The guard trigger catches a
//     stale token written by any path, but not an UPDATE that does not touch the fence
//     column at all.
//   - Exec trusts the caller's SQL to contain the fence comparison.
//   - CheckLease makes a takeover wait for the checking transaction: keep those
//     transactions short, or the lease's next holder waits (and VACUUM is held back).
//   - Everything here needs the write to happen in the same database as the register or
//     table; a write to another system is protected only by passing the token along.
//   - Only a primary takes writes: on a standby (or in a read-only transaction) Check,
//     Write, Exec, CheckLease, InstallGuard and RemoveGuard fail with an error wrapping
//     pgcoord.ErrReadOnly.
package fenced
