// Package outbox is a transactional outbox: write a message in the same transaction as the
// business change, deliver it at least once, and (with package inbox) apply it exactly once
// downstream.
//
//	tx, _ := pool.Begin(ctx)
//	defer tx.Rollback(ctx)
//	// ... the business change, with tx ...
//	_, err := outbox.Enqueue(ctx, tx, outbox.Message{Topic: "orders", Key: orderID, Payload: body, JSON: true})
//	if err != nil { return err }
//	return tx.Commit(ctx) // the message exists if and only if the change committed
//
// A Relay (NewRelay, Run) delivers the messages through a Handler — a broker, a webhook
// (package sink), or the application's own code — and several relays share the work.
// Stats, List, DeliveryRate, Retry, RetryDead and GC serve operators (`pgcoord outbox
// ...`, `pgcoord ui`). Triggers and other languages write messages with the SQL function
// pgcoord_outbox_enqueue.
//
// # How the relay works
//
// A message is pending until delivered or dead. A claim (one call) walks the keys that
// have pending messages, in the relay's partitions (see Several relays) from where its
// previous claim stopped, and for each key whose oldest pending message — its head — is due and not
// under a live claim, locks that head (FOR UPDATE SKIP LOCKED, so relays never wait for each
// other) and claims it with up to KeyBatchSize messages right behind it. Every row of the
// claim is stamped with a new claim token from a sequence and an expiry, ClaimTTL ahead by
// the database clock. A claim stops before its payloads exceed BatchBytes (but always takes
// one message). The relay delivers each key's messages in id order, stopping at the key's
// first failure, then records every outcome of the batch in one statement: delivered,
// failed (retried after an exponential backoff with jitter computed by the database clock,
// or dead after MaxAttempts), or released untried. A relay with nothing to do registers as
// idle and waits for a notification (see Wake-ups); PollInterval is the fallback.
//
// # Several relays
//
// Every key falls in one of 1024 buckets, a hash of its topic and key. The relays of one
// topic set share the buckets through a partition group (package partition), GroupName:
// a relay joins it at its first claim (creating it with RelayPartitions partitions if it
// does not exist) and leaves it when Run returns or at Leave, and partition p of the
// group's M covers the buckets p*1024/M up to (p+1)*1024/M. A claim walks only the buckets
// of the partitions the group has granted to its relay, and the database checks the grants
// as it claims (holding them until the claim commits). So a relay's range is its
// partitions, strictly: concurrent claims of different relays walk disjoint keys, and none
// counts heads another relay is about to lock or walks past keys it holds. The group's
// plan balances the partitions over the live relays and moves only what must move when one
// joins or leaves; a partition moves only after its relay settled the batch under way (or
// after its lease), and a relay that dies keeps its partitions until its lease expires
// (ClaimTTL, at most 15s). The partitions only steer the walk: what a claim may take is decided by the
// head's lock and state, as with one relay, so no guarantee below depends on them.
// Operators see and move the partitions with `pgcoord partitions` (drain a relay before a
// deploy: `pgcoord partitions drain GROUP CLAIMANT`, GROUP being GroupName(Topics)).
//
// # Wake-ups
//
// While any relay is idle, every transaction that enqueues sends one notification,
// delivered at commit, which wakes it. Busy relays need no wake-up, and a notification
// serializes commits server-wide, so producers send none then. The check rides the
// statement that inserts the transaction's first message: the producer locks the table
// pgcoord_outbox_wakeup in ROW EXCLUSIVE mode (held until it commits), then looks for idle
// relays. Relays wait on the
// pool's one LISTEN connection, shared by every waiter of the process, so a waiting relay
// holds no connection.
//
// A relay registers as idle in a short transaction that only tries to lock the same table in
// EXCLUSIVE mode (NOWAIT) and never waits for it: producers never queue behind a registering relay,
// however long one producer's transaction stays open. The registration is tight if it got
// the lock — no producer was between its check and its commit, so every producer not yet
// committed checks after the registration and notifies — and loose otherwise. After either
// kind the relay claims once more (which sees every message committed before the
// registration). After a tight one it then waits for a notification, or PollInterval.
// After a loose one, a producer that checked before the registration may commit without
// notifying, so the relay waits only a short while (5ms, doubling with each loose
// registration until one is tight, at most PollInterval), claims and registers again. So a
// committed message waits for an idle listening relay at most about PollInterval (plus a
// claim), and usually a few milliseconds; with one long producer transaction open, idle
// relays poll every PollInterval until it ends, while the other producers' messages wake
// them as usual. A producer in a REPEATABLE READ or SERIALIZABLE transaction checks with
// its snapshot, which may predate a registration; its message is then found by the
// relay's next poll.
//
// # Guarantees
//
//   - Atomic with the business change: a message is visible to relays only once the
//     producer's transaction commits, and a rollback leaves nothing.
//   - At least once: every committed message is handed to a Handler until one returns nil
//     (then it is delivered) or it has failed MaxAttempts times (then it is dead, listed,
//     and can be retried). A relay that crashes or stalls loses its claim when ClaimTTL
//     passes, and the messages are claimed again.
//   - No message is skipped by a late commit (see below).
//   - Per-key order: the messages of one (topic, key) are delivered in the order their
//     transactions committed, and never two at once: message n+1 is first handed to a
//     Handler only after message n was delivered or went dead (see below). Different keys
//     are delivered in parallel, by several relays and by Concurrency within a relay.
//   - A failing message parks its own key only: while it waits out its backoff, the key's
//     later messages wait too, and every other key flows.
//   - Fenced outcomes: a relay records outcomes only for rows that still carry its claim
//     token. A relay paused past its claim (a GC pause, SIGSTOP) whose messages another
//     relay has claimed since can neither mark them delivered, nor count a failure, nor
//     release them; it learns that its outcomes were refused (RelayStats.Fenced).
//   - The database clock decides delays, backoffs, claim expiry and retention; no option
//     lets a caller choose the time.
//   - No stranger can stall it: Enqueue and the relay take no advisory lock, only row and
//     table locks of pgcoord's tables, which a login without a grant on them cannot take
//     (integration_test TestSquattingLoginStallsNoPrimitive).
//   - Bounded memory: a relay holds one claim at a time, whose payloads and headers add up
//     to at most BatchBytes (or one larger message); List reads no payload unless asked
//     (ListOpts.PayloadBytes), and then at most that much of each.
//   - No producer waits for a relay: an idle relay's registration never waits for a
//     producer's lock, so one long producer transaction does not hold up the others.
//   - GC deletes only delivered (and, if asked, dead) messages past their retention,
//     never pending ones, in batches.
//
// # Why no message is skipped by a late commit
//
// Identity ids are drawn when a row is inserted, not when its transaction commits, so a
// transaction can commit message 7 after message 9 was committed and delivered. A relay
// that remembered "delivered everything up to id 9" would skip message 7 forever. This
// relay remembers nothing of the kind: claiming is by state. A message is claimable
// whenever it is pending and due, whatever ids were delivered before it; a message
// becomes pending once, at its commit, and leaves that state only through a recorded
// outcome (delivered or dead) of a relay that had claimed it. So a late-committing
// message is found by the first claim whose snapshot sees it — the relay's cursor only
// orders the walk over keys and wraps around whenever a claim comes back short — and the
// commit's notification wakes a relay to take that claim.
//
// # Why per-key order holds
//
// "The oldest pending message of a key" must mean the first committed, but ids follow
// insertion. Enqueue therefore locks the row of (topic, key) in pgcoord_outbox_keys
// (creating it if missing) before it inserts, held until the producer's transaction ends. A second transaction
// writing the same key waits in Enqueue until the first has committed (or rolled back)
// before it draws its id, and PostgreSQL makes the first transaction visible to every new
// snapshot before it releases its locks. Hence, within one key: ids increase with commit
// order, and any snapshot that sees message n+1 also sees message n. A claim takes a key
// only through its head — the smallest pending id the claim's snapshot sees, which by the
// above has no older pending message — locked and re-checked on the latest row version,
// and only if no live claim covers it; the messages it takes behind the head are the
// next ones in id order. All rows of one claim share one expiry and are settled by one
// statement, so a key has at most one live claim at a time, and a relay hands a key's
// messages to its Handler one after the other, stopping at the first failure. The next
// claim of the key starts again at its head, which is the failed message (now in backoff)
// or the first message not yet delivered.
//
// The cost is that writers of one key are serialized until commit (measured in
// docs/outbox.md and `pgcoord bench outbox.enqueue`). Writers of different keys are not.
//
// # Failure modes
//
//   - A producer in a REPEATABLE READ or SERIALIZABLE transaction gets a serialization
//     failure (SQLSTATE 40001; retry the transaction) when another transaction created
//     its key's order row (pgcoord_outbox_keys) after its snapshot.
//     The rows of keys with no pending message are collected by pgcoord gc (kind
//     outbox_keys); an Enqueue of such a key waits for that gc transaction's commit.
//   - Duplicates: a relay that delivered a message but died (or was paused past ClaimTTL)
//     before recording it causes a redelivery, possibly after later messages of the key
//     were delivered by another relay. Make consumers idempotent on Message.ID: the
//     inbox (package inbox) applies each message once, in order of first application.
//   - A batch not delivered within ClaimTTL: the relay stops handing out that batch a
//     tenth of ClaimTTL before it ends (by its own clock) and releases the rest; a Handler
//     call still running then is cancelled through its context. Keep ClaimTTL well above
//     KeyBatchSize times the slowest delivery.
//   - Deadlocks between producers: Enqueue locks its key until commit, so a transaction
//     enqueuing to keys x then y and another enqueuing to y then x can deadlock
//     (SQLSTATE 40P01; PostgreSQL aborts one). Enqueue a transaction's keys in a
//     consistent order (sorted), as with any row locks.
//   - Lock table: each distinct key a transaction enqueues to holds one slot of the
//     server's lock table until commit (max_locks_per_transaction × max_connections in
//     all). Enqueue tens of thousands of distinct keys in one transaction only after
//     raising it.
//   - A delayed message, or one in backoff, holds back the later messages of its key.
//     Give messages that need no mutual order distinct keys.
//   - A poison message that crashes the relay process (rather than returning an error)
//     is redelivered after every ClaimTTL without counting attempts; find it with
//     `pgcoord outbox list` (its ClaimedBy changes) and fix or delete it by hand.
//   - Retry of a dead message puts it back at the head of its key, before the key's
//     messages that were delivered or written since: consumers see it out of order.
//   - Behind a transaction-mode pooler (PgBouncer) notifications are not delivered: a
//     relay finds the pooler on its first wait and polls every PollInterval. Listening relays share the pool's one
//     LISTEN connection (taken out of the pool while any waiter of the process listens),
//     and hold no connection while they wait.
//   - While a producer transaction that enqueued stays open, registrations are loose:
//     idle relays claim (and register) about every PollInterval until it ends, a few
//     statements per relay per interval.
//   - Keys are walked one index probe at a time: a claim costs one probe per key with
//     pending messages that it passes over (parked, claimed by other relays, or of other
//     topics when Topics is set), not one per message. Many parked keys slow every claim
//     that does not fill its batch first: beside 10,000 keys each holding one delayed
//     message, a lone relay delivered 0.15-0.16 of what it delivers beside none. Keep many
//     delayed messages out of the outbox until they are due.
//   - A relay takes only its partitions' keys: a skewed backlog is not spread (a relay
//     whose partitions are full delivers alone while the others idle), and the keys of a
//     relay that died wait until its lease (ClaimTTL, at most 15s) expires. A relay that joins claims
//     nothing until partitions are granted to it, after their holders settled their
//     batches under way. Relays with different Topics are in different groups and walk the
//     same keys. A Relay driven by RunBatch stays in its group, heartbeating, until Leave
//     or until it has made no batch for its lease: reuse one Relay rather than create one
//     per RunBatch, and call Leave when done.
//   - Upgrading from a version before partition groups: after migration 00020 an old
//     relay's claims name no group, so it walks every key until it runs this version,
//     colliding with the new relays only on locked heads.
//   - With asynchronous replication, an enqueue or an outcome committed on a primary that
//     fails before the standby has it is lost on failover: a message may vanish with its
//     business change, or be delivered again.
//   - Only a primary takes writes: on a standby (or in a read-only transaction) Enqueue,
//     EnqueueBatch, a relay's claims and outcomes, Retry, RetryDead and GC fail with an
//     error wrapping pgcoord.ErrReadOnly (Run logs it and retries); so do inbox.Claim and
//     inbox.GC.
package outbox
