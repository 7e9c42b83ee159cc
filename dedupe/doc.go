// Package dedupe makes "runs twice" harmless: an effect guarded by it happens once, however
// many times the code that causes it runs — retried jobs, redelivered messages, webhooks
// sent again, a cron that fired on three replicas.
//
// Exactly-once execution cannot be had with timeouts and retries; exactly-once effect can,
// when the effect is recorded in the database under a key that the database refuses to
// record twice. This package offers that in four forms:
//
//   - Claim: a claim of (scope, key) in pgcoord's dedupe table, inside the caller's
//     transaction, made with INSERT ... ON CONFLICT DO NOTHING. True the first time, false
//     ever after. The claim commits or vanishes with the caller's work.
//   - InsertOnce: an INSERT into your own table with a UNIQUE constraint, the smallest
//     unit of work of a job (email_sends(user_id, campaign_id)): false when the row was
//     already there. Send the email only when it returns true.
//   - Transition: a state machine step on your own row that happens only from the
//     expected state (pending -> paid), and tells the one caller that made it.
//   - IsUniqueViolation, for your own statements: a second insert failing with 23505
//     means "already done".
//
// A webhook handler, for example:
//
//	tx, err := pool.Begin(ctx)
//	if err != nil { return err }
//	defer tx.Rollback(ctx)
//	first, err := dedupe.Claim(ctx, tx, "stripe-webhook", event.ID, &dedupe.ClaimOpts{Retention: 30 * 24 * time.Hour})
//	if err != nil || !first { return err } // !first: already handled
//	// ... apply the event with tx ...
//	return tx.Commit(ctx)
//
// GC removes claims whose Retention has passed (`pgcoord dedupe gc` runs it).
//
// # Guarantees
//
//   - A (scope, key) is claimed by at most one committed transaction, ever (until GC
//     removes an expired claim): concurrent claimers included. Among claimers whose
//     transactions all commit, exactly one Claim returned true.
//   - A claim is never half-made: it exists if and only if the claiming transaction
//     committed. A rolled-back (or crashed) claimer leaves nothing; the next Claim returns
//     true, so the work is retried, not lost.
//   - A claim whose Retention has passed still counts until GC removes it: Retention is a
//     minimum. GC never removes a claim kept forever (Retention 0) or one not yet expired
//     by the database clock.
//   - Of concurrent Transition calls moving one row from the same state, exactly one
//     returns true. InsertOnce never creates a duplicate row: the table's constraint
//     decides.
//   - Claim's expiry and GC's judgement of it use the database clock alone
//     (pgcoord_now(): the start of the claiming, or collecting, transaction), never the
//     worker's; no option lets a caller choose the time.
//
// # Isolation levels
//
// These primitives rely on how PostgreSQL resolves a write that waits for another
// transaction's write of the same row (or unique key):
//
//   - READ COMMITTED, PostgreSQL's default, is the one to use. A Claim (or InsertOnce
//     with ON CONFLICT DO NOTHING) of a key that another transaction has claimed but not yet
//     committed blocks until that transaction ends, then sees its outcome: false if it
//     committed, true if it rolled back. A Transition blocked the same way re-checks its
//     WHERE clause against the committed row and returns false when the state moved on.
//     No error, no retry needed.
//   - REPEATABLE READ and SERIALIZABLE: when the other transaction committed after this
//     one took its snapshot, the waiting Claim, INSERT or UPDATE fails with SQLSTATE 40001
//     (serialization_failure), "could not serialize access due to concurrent update". The
//     caller must roll back and retry the whole transaction (that is the contract of those
//     levels); the retry's Claim returns false. The claim is still never duplicated, and
//     the effect still happens once. Retry on 40001 with errors.As(err, &pgErr) &&
//     pgErr.Code == "40001".
//
// # Failure modes
//
//   - The guarantee covers effects recorded in this database, in the claiming transaction.
//     An effect outside it (a payment provider, an email) made before the claim commits can
//     happen again if the transaction then rolls back or the process dies before COMMIT:
//     pass a stable key (the order id, the claim key) to the other system's own
//     idempotency key, or record the effect's intent in the transaction and perform it
//     afterwards (an outbox).
//   - A Claim holds the key's lock until the transaction ends: keep claiming transactions
//     short, or concurrent claimers of the same key wait for them.
//   - InsertOnce without ON CONFLICT inside a transaction: the unique violation aborts the
//     transaction; InsertOnce returns ErrTxAborted and the work must be retried in a new
//     transaction. Use ON CONFLICT DO NOTHING inside transactions.
//   - A claim removed by GC can be claimed again: choose Retention longer than any
//     redelivery or retry can arrive (a message queue's maximum retention, a provider's
//     webhook retry window), or keep claims forever.
//   - An expired claim that GC has not yet removed still blocks its key; GC that never runs
//     lets the table grow.
//   - Transition's UPDATE goes through the table's triggers and constraints like any
//     other; an id column that is not unique makes it change several rows (ErrNotUnique).
//   - With asynchronous replication, a claim committed on a primary that dies before the
//     standby received it is lost on failover, and the work can run again.
//   - Only a primary takes writes: on a standby (or in a read-only transaction) Claim, GC,
//     InsertOnce and Transition fail with an error wrapping pgcoord.ErrReadOnly.
package dedupe
