-- Outbox operations go through the SQL API functions of 00006_outbox.sql where a relay in
-- another language would need the same logic (enqueue, claim, settle); the operator's
-- reads and repairs are plain statements.

-- name: OutboxEnqueue :one
-- Enqueue's statement: the enqueue protocol (pgcoord_outbox_lock, a PL/pgSQL call since
-- migration 00010: the wake-up check and the key's row lock) and the INSERT in one plain
-- statement; pgcoord_outbox_insert would cost the hottest path a second PL/pgSQL call per
-- message. The inserted row is projected from the
-- subquery l's one row, so its id is drawn after the lock (the planner keeps a volatile
-- output of a subquery, used or not; unlike a function scan or a CTE, a subquery does not
-- materialize its row). NULL headers and delay stand for the columns' defaults.
INSERT INTO pgcoord_outbox (topic, key, payload, is_json, headers, available_at)
SELECT @topic::text, @key::text, @payload::bytea, @is_json::boolean, coalesce(sqlc.narg('headers')::jsonb, '{}'),
       pgcoord_now() + coalesce(sqlc.narg('delay')::interval, interval '0')
  FROM (SELECT pgcoord_outbox_lock(@topic::text, @key::text)) l
RETURNING id, created_at, available_at;

-- name: OutboxEnqueueMany :many
-- EnqueueBatch's statement: pgcoord_outbox_insert, reading back only the columns it sets.
SELECT i.id, i.created_at, i.available_at
  FROM pgcoord_outbox_insert(@topics::text[], @keys::text[], @payloads::bytea[], @is_json::boolean[],
                             @headers::jsonb[], @delays::interval[]) i;

-- name: OutboxClaim :many
SELECT o.* FROM pgcoord_outbox_claim(@claimant::text, @max_rows::int, @key_limit::int, @max_bytes::bigint,
                                     @ttl::interval, sqlc.narg('topics')::text[], @after_topic::text,
                                     @after_key::text, @group_name::text, @partitions::int[]) o;

-- name: OutboxSettle :one
SELECT s.delivered::int AS delivered, s.failed::int AS failed, s.dead::int AS dead, s.released::int AS released
FROM pgcoord_outbox_settle(@token::bigint, @delivered::bigint[], @failed::bigint[], @errors::text[],
                           @released::bigint[], @max_attempts::int, @backoff::interval,
                           @max_backoff::interval) s;

-- name: OutboxIdle :one
SELECT pgcoord_outbox_idle(@claimant::text, sqlc.narg('ttl')::interval)::boolean AS tight;

-- name: OutboxChannel :one
SELECT pgcoord_channel('outbox')::text AS channel;

-- name: OutboxStats :many
-- Per topic. oldest_pending is 'epoch' when the topic has no pending message.
WITH p AS (
    SELECT o.topic, count(*) AS pending,
           count(*) FILTER (WHERE o.available_at <= pgcoord_now()
                              AND (o.claim_expires_at IS NULL OR o.claim_expires_at <= pgcoord_now())) AS due,
           count(*) FILTER (WHERE o.claim_expires_at > pgcoord_now()) AS in_flight,
           min(o.created_at) AS oldest_pending,
           max(o.attempts) AS max_attempts
      FROM pgcoord_outbox o WHERE o.state = 'pending' GROUP BY o.topic
), d AS (
    SELECT o.topic, count(*) AS dead FROM pgcoord_outbox o WHERE o.state = 'dead' GROUP BY o.topic
)
SELECT coalesce(p.topic, d.topic)::text AS topic,
       coalesce(p.pending, 0)::bigint AS pending,
       coalesce(p.due, 0)::bigint AS due,
       coalesce(p.in_flight, 0)::bigint AS in_flight,
       coalesce(d.dead, 0)::bigint AS dead,
       coalesce(p.oldest_pending, 'epoch')::timestamptz AS oldest_pending,
       coalesce(p.max_attempts, 0)::int AS max_attempts,
       pgcoord_now()::timestamptz AS db_now
FROM p FULL JOIN d ON d.topic = p.topic
WHERE (sqlc.narg('only_topic')::text IS NULL OR coalesce(p.topic, d.topic) = sqlc.narg('only_topic')::text)
  AND starts_with(coalesce(p.topic, d.topic), @topic_prefix::text)
ORDER BY 1;

-- name: OutboxList :many
-- A page of messages with each payload's size and only its first payload_bytes bytes
-- (none for 0): substring reads a slice of a TOASTed payload, octet_length its stored size.
SELECT o.id, o.topic, o.key, o.is_json, o.headers, o.state, o.created_at, o.available_at, o.attempts,
       o.claim_token, o.claimed_by, o.claim_expires_at, o.last_error, o.delivered_at, o.dead_at,
       octet_length(o.payload)::int AS payload_size,
       (CASE WHEN @payload_bytes::int > 0 THEN substring(o.payload FROM 1 FOR @payload_bytes::int)
             ELSE ''::bytea END)::bytea AS payload_head
FROM pgcoord_outbox o
WHERE (sqlc.narg('state')::text IS NULL OR o.state = sqlc.narg('state')::text)
  AND (sqlc.narg('topic')::text IS NULL OR o.topic = sqlc.narg('topic')::text)
  AND starts_with(o.topic, @topic_prefix::text)
  AND o.id > @after_id::bigint
ORDER BY o.id
LIMIT @max_rows::int;

-- name: OutboxGet :one
SELECT o.* FROM pgcoord_outbox o WHERE o.id = @id::bigint;

-- name: OutboxRetry :execrows
-- A dead message becomes pending again with a fresh count of attempts; a pending one in
-- backoff becomes due now. A claimed message keeps its claim.
UPDATE pgcoord_outbox
   SET state = 'pending', dead_at = NULL,
       attempts = CASE WHEN state = 'dead' THEN 0 ELSE attempts END,
       available_at = least(available_at, pgcoord_now())
 WHERE id = @id::bigint AND state IN ('pending', 'dead');

-- name: OutboxRetryDead :execrows
-- At most max_rows dead messages (of topic, if set), found through the partial index of
-- dead messages, which a retried message leaves. The ids are read once (an IN subquery with
-- LIMIT may be run again per row and pick other rows, updating more than max_rows).
UPDATE pgcoord_outbox
   SET state = 'pending', dead_at = NULL, attempts = 0, available_at = pgcoord_now()
 WHERE id = ANY (ARRAY(
         SELECT d.id FROM pgcoord_outbox d
          WHERE d.state = 'dead' AND (sqlc.narg('topic')::text IS NULL OR d.topic = sqlc.narg('topic')::text)
          LIMIT @max_rows::int))
   AND state = 'dead';

-- name: OutboxCountDead :one
SELECT count(*) FROM pgcoord_outbox
WHERE state = 'dead' AND (sqlc.narg('topic')::text IS NULL OR topic = sqlc.narg('topic')::text);

-- name: OutboxPrune :execrows
-- Delivered (and, with include_dead, dead) messages finished before cutoff, at most batch.
DELETE FROM pgcoord_outbox
WHERE id = ANY (ARRAY(
    SELECT o.id FROM pgcoord_outbox o
     WHERE (o.state = 'delivered' AND o.delivered_at < @cutoff::timestamptz)
        OR (@include_dead::boolean AND o.state = 'dead' AND o.dead_at < @cutoff::timestamptz)
     ORDER BY o.id
     LIMIT @batch::int))
  AND state IN ('delivered', 'dead');

-- name: OutboxCountPrunable :one
SELECT count(*) FROM pgcoord_outbox o
WHERE (o.state = 'delivered' AND o.delivered_at < @cutoff::timestamptz)
   OR (@include_dead::boolean AND o.state = 'dead' AND o.dead_at < @cutoff::timestamptz);

-- name: OutboxCutoff :one
-- The database clock minus an age: the cutoff of Prune and inbox GC.
SELECT (pgcoord_now() - @age::interval)::timestamptz AS cutoff;

-- name: InboxClaim :execrows
INSERT INTO pgcoord_outbox_inbox (consumer, message_id, applied_at)
VALUES (@consumer::text, @message_id::bigint, pgcoord_now())
ON CONFLICT (consumer, message_id) DO NOTHING;

-- name: InboxGC :execrows
DELETE FROM pgcoord_outbox_inbox
WHERE ctid = ANY (ARRAY(
    SELECT i.ctid FROM pgcoord_outbox_inbox i WHERE i.applied_at < @cutoff::timestamptz LIMIT @batch::int))
  AND applied_at < @cutoff::timestamptz;

-- name: InboxCountExpired :one
SELECT count(*) FROM pgcoord_outbox_inbox WHERE applied_at < @cutoff::timestamptz;
