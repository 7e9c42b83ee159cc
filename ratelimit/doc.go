// Package ratelimit limits the rate of calls per key, across every process that shares a
// PostgreSQL database, with the generic cell rate algorithm (GCRA, as Redis's CL.THROTTLE
// and go-redis's rate package use), judged by the database clock.
//
// A policy is a row: a rate (Rate units per Period) and a Burst. Policies are created and
// changed at runtime (Set, the SQL API's pgcoord_ratelimit_set, `pgcoord ratelimit set`);
// a change applies from the next call. A key's state is one row holding its theoretical
// arrival time; a key at rest (its time in the past) carries no state, and `pgcoord gc`
// deletes its row.
//
//	_, err := ratelimit.Set(ctx, pool, ratelimit.Policy{Name: "api", Rate: 10, Period: time.Second, Burst: 10})
//	d, err := ratelimit.Allow(ctx, pool, 1, []ratelimit.Limit{
//		{Policy: "api", Key: "key:123"},
//		{Policy: "tenant", Key: "t:9"},
//	}, nil)
//	if !d.Allowed { ... 429, Retry-After: d.RetryAfter ... }
//
// Allow takes a db that may be the caller's own transaction: the charge then commits or
// rolls back with the caller's writes. Every call is one round trip (its SQL is
// pgcoord_ratelimit_take's, docs/sql-api.md, which plain SQL callers can use directly).
//
// With a pool, concurrent calls of this process on the same limits and mode (a hot key)
// are coalesced: a call that finds no statement of its limits in flight goes out at once;
// those that arrive meanwhile go out together, in arrival order, as one statement
// (pgcoord_ratelimit_take_each) with one row lock and one commit. Calls in the caller's
// own transaction, or on a single connection, are never merged.
//
// # Guarantees
//
//   - Exactness: over any stretch of time W of the database clock, a key admits at most
//     W × Rate / Period + Burst units, whatever the number of processes and connections
//     calling (the key's row is locked while it is judged and charged). The emission
//     interval Period / Rate is rounded up to a whole microsecond, so the rounding never
//     admits more.
//   - All or nothing: a call that checks several limits charges every one of them or none.
//     A refused call changes no key; a call whose transaction rolls back (or whose
//     connection dies before it commits) leaves no charge behind.
//   - A refusal names the limit that refused (the one whose retry is latest) and when the
//     same call would be admitted (RetryAfter). A refusal that the stored state decides
//     writes and locks nothing.
//   - Coalesced calls are decided as if each came right after the one before, in arrival
//     order; each keeps its own context, and one call's bad cost fails only that call.
//   - A shadow policy never refuses: it counts the calls it would have refused
//     (Policy.ShadowRefused), and charges only those it would have admitted, so its count
//     is what enforcing it would have refused.
//   - No call takes a time argument: time is the database's.
//   - Bad input is refused before any SQL runs, with an error wrapping
//     pgcoord.ErrInvalidArgument or pgcoord.ErrInvalidName; a policy that does not exist is
//     ErrUnknownPolicy.
//
// # Failure modes
//
//   - Calls on one key queue on its row lock: from many processes, or in transactions, one
//     hot key admits one call per round trip of the database's work on it; calls of one
//     process through a pool share that round trip (see docs/benchmarks.md).
//   - A call whose context ends while its statement is in flight returns the context's
//     error, and may have been charged (its units are then spent, never given twice). A
//     coalesced call's error then also wraps a note that its outcome is not known.
//   - Only a primary takes charges: on a standby every call fails with an error wrapping
//     pgcoord.ErrReadOnly.
//   - An unlogged policy (Policy.Unlogged) keeps its keys in an UNLOGGED table: a crash of
//     the server or a failover puts every one of them at rest (a full burst again).
//   - With asynchronous replication, a failover loses the charges of the last moments
//     before it: the new primary can admit up to that window's calls again.
//   - A call inside a long transaction holds its keys' row locks until that transaction
//     ends: other callers of those keys wait for it. Check limits in short transactions, or
//     with the pool.
package ratelimit
