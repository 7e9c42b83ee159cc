-- Transactional outbox, relay claims and the consumer inbox.
--
-- A message is a row of pgcoord_outbox written in the producer's own transaction: it exists
-- for the relay only if that transaction commits. A message is pending until a relay marks
-- it delivered, or until it failed max_attempts times (dead). The relay works on state, not
-- on id ranges: every committed pending message stays claimable however late its
-- transaction commits, so no message is skipped (outbox/doc.go has the reasoning).
--
-- Order per key: every write path (the pgcoord_outbox_enqueue* functions, and the Go
-- library's statement) takes a transaction-level advisory lock on (topic, key) before the
-- INSERT, so two transactions writing one key are serialized: the
-- second gets its id only after the first committed or rolled back, and ids of one key are
-- in commit order. A relay claims only the oldest pending message of a key (its head) and
-- the pending messages right behind it, so a key is delivered in id order, one relay at a
-- time, while different keys flow in parallel. A failing head parks its key only.
--
-- Fencing: each claim stamps its rows with a token from pgcoord_outbox_claim_token (a
-- sequence: tokens only go up and are never reused) and an expiry by the database clock.
-- Settling (delivered, retry, dead, release) matches the token: a relay paused past its
-- claim, whose rows were claimed again by another relay, changes nothing.

-- +goose Up
CREATE SEQUENCE pgcoord_outbox_claim_token AS bigint NO CYCLE;

CREATE TABLE pgcoord_outbox (
    id               bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- Topic and key (1 to 255 bytes each), payload (at most 1 MiB) and headers (a JSON
    -- object) are checked by the functions that write messages (and by the Go library)
    -- rather than by CHECK constraints, which are evaluated again on every claim and settle
    -- (each an UPDATE of the row): write messages through pgcoord_outbox_enqueue*, not
    -- with INSERT, which would skip the checks, the per-key order lock and the wake-up.
    topic            text        NOT NULL,
    key              text        NOT NULL,
    payload          bytea       NOT NULL,
    -- The payload is a JSON document (validated when written).
    is_json          boolean     NOT NULL DEFAULT false,
    headers          jsonb       NOT NULL DEFAULT '{}',
    state            text        NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'delivered', 'dead')),
    created_at       timestamptz NOT NULL DEFAULT now(),
    -- When the message may be claimed: created_at + delay, or the end of a retry's backoff.
    available_at     timestamptz NOT NULL DEFAULT now(),
    -- Failed deliveries so far.
    attempts         integer     NOT NULL DEFAULT 0,
    -- The latest claim: its token, the claimant, and until when it holds (NULL: unclaimed).
    claim_token      bigint,
    claimed_by       text,
    claim_expires_at timestamptz,
    last_error       text,
    delivered_at     timestamptz,
    dead_at          timestamptz
)
-- Every message is inserted, claimed and settled: a queue's churn. Room on each page lets
-- the claim update stay HOT (no new index entries), and frequent vacuums keep the pending
-- index, which claims walk key by key, free of entries of settled messages.
WITH (fillfactor = 80, autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_threshold = 1000,
      autovacuum_vacuum_insert_scale_factor = 0.01);

-- The hot set: pending messages only, by key then id (the per-key heads, and Stats).
CREATE INDEX pgcoord_outbox_pending ON pgcoord_outbox (topic, key, id) WHERE state = 'pending';
CREATE INDEX pgcoord_outbox_dead ON pgcoord_outbox (topic, id) WHERE state = 'dead';

COMMENT ON TABLE pgcoord_outbox IS 'pgcoord: transactional outbox messages (pending, delivered, dead)';

-- Wake-ups. NOTIFY is not free: PostgreSQL serializes the commits of notifying
-- transactions server-wide (a notifying commit takes a database-wide lock to queue its
-- notifications, as the lease functions' comments note too). So a producer notifies only
-- while some relay is idle, waiting for work: a listening relay that found nothing
-- registers in pgcoord_outbox_idle (until a deadline it keeps extending while it waits)
-- and leaves it when it finds work again; busy relays need no wake-up.
--
-- No wake-up is lost between a producer's check and its commit: the producer takes a
-- shared transaction-level advisory lock before it checks, held until it commits, and a
-- relay registers itself under the same lock in exclusive mode (pgcoord_outbox_idle), so
-- its registration waits until every producer that checked without seeing it has
-- committed — and its next claim, after the registration, sees their messages. A producer
-- that checks after the registration sees it and notifies. (A producer in a REPEATABLE
-- READ or SERIALIZABLE transaction checks with its transaction's snapshot, which may
-- predate a registration: that relay then finds the message at its next poll.)
CREATE TABLE pgcoord_outbox_idle (
    claimant text        PRIMARY KEY,
    until    timestamptz NOT NULL
);

COMMENT ON TABLE pgcoord_outbox_idle IS 'pgcoord: outbox relays waiting for a notification';

-- pgcoord_outbox_wake_flag is the name of the transaction-local setting that says this
-- transaction has checked for idle relays, namespaced by the install schema (two schemas'
-- outboxes in one transaction keep separate flags). Everything in it is immutable, so the
-- planner folds it to a constant: reading the flag costs nothing per statement.
CREATE FUNCTION pgcoord_outbox_wake_flag() RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ SELECT 'pgcoord.outbox_woken_' || to_hex(pgcoord_lock_key('outbox:woken')) $$;

-- pgcoord_outbox_wake is every write path's wake-up: the first call of a transaction
-- takes the shared lock described above, notifies pgcoord_channel('outbox') if a relay
-- waits — one notification per transaction, delivered at commit, none if it rolls back —
-- and sets the flag; later calls return at once. The lock, the flag and the notification
-- are undone together by a rolled-back savepoint. It returns true.
--
-- Writers call it in the statement that inserts, guarded so that only a transaction's
-- first message pays for a function call:
--   WHERE current_setting(pgcoord_outbox_wake_flag(), true) = 'on' OR pgcoord_outbox_wake()
-- and before they take their (topic, key) locks, so that a producer never holds a key's
-- lock while it queues for the wake-up lock behind a registering relay (which waits for
-- the producers, one of which may be waiting for that key). It is not a trigger: an
-- AFTER trigger's bookkeeping cost more than the check itself, on every statement. A row
-- INSERTed by hand therefore wakes no relay; the relays find it at their next poll.
-- +goose StatementBegin
CREATE FUNCTION pgcoord_outbox_wake() RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting(pgcoord_outbox_wake_flag(), true) = 'on' THEN
        RETURN true;
    END IF;
    PERFORM set_config(pgcoord_outbox_wake_flag(), 'on', true);
    -- The lock first, then the check: each statement of this (volatile) function reads a
    -- new snapshot, so the check sees every registration that committed before the lock.
    PERFORM pg_advisory_xact_lock_shared(pgcoord_lock_key('outbox:wakeup'));
    IF EXISTS (SELECT FROM pgcoord_outbox_idle WHERE until > now()) THEN
        PERFORM pg_notify(pgcoord_channel('outbox'), '');
    END IF;
    RETURN true;
END
$$;
-- +goose StatementEnd

-- pgcoord_outbox_idle registers p_claimant, a relay LISTENing on pgcoord_channel('outbox'),
-- as waiting for work until now + p_ttl, after every producer that did not see it waiting
-- has committed. Claim again after it returns, then wait. p_ttl NULL (or a relay that found
-- work) removes the registration.
-- +goose StatementBegin
CREATE FUNCTION pgcoord_outbox_idle(p_claimant text, p_ttl interval) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF p_ttl IS NULL THEN
        DELETE FROM pgcoord_outbox_idle WHERE claimant = p_claimant;
        RETURN;
    END IF;
    PERFORM set_config('synchronous_commit', 'off', true); -- losing it only delays a wake-up
    INSERT INTO pgcoord_outbox_idle (claimant, until) VALUES (p_claimant, clock_timestamp() + p_ttl)
    ON CONFLICT (claimant) DO UPDATE SET until = excluded.until;
    PERFORM pg_advisory_xact_lock(pgcoord_lock_key('outbox:wakeup'));
END
$$;
-- +goose StatementEnd

-- pgcoord_outbox_lock_key is the advisory-lock key of (topic, key), which writers of the
-- key hold until they commit (the topic's length keeps "a:b" + "c" apart from "a" + "b:c").
-- Every part of it is immutable (note the ::text: int || text is only stable), so the
-- planner inlines it into the calling statement instead of calling a function per row.
CREATE FUNCTION pgcoord_outbox_lock_key(p_topic text, p_key text) RETURNS bigint
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    AS $$ SELECT pgcoord_lock_key('outbox:' || octet_length(p_topic)::text || ':' || p_topic || ':' || p_key) $$;

-- pgcoord_outbox_enqueue_bytes writes one message in the caller's transaction and returns
-- it: payload as bytes (p_is_json declares it JSON, checked here), headers a JSON object,
-- p_delay (NULL or >= 0) postpones it by the database clock. It first takes a
-- transaction-level advisory lock on (topic, key), held until the caller's transaction
-- ends: writers of one key are serialized, so the key's ids are in commit order.
-- +goose StatementBegin
CREATE FUNCTION pgcoord_outbox_enqueue_bytes(
    p_topic text, p_key text, p_payload bytea, p_is_json boolean DEFAULT false,
    p_headers jsonb DEFAULT '{}', p_delay interval DEFAULT NULL
) RETURNS SETOF pgcoord_outbox LANGUAGE plpgsql AS $$
BEGIN
    IF p_topic IS NULL OR octet_length(p_topic) NOT BETWEEN 1 AND 255 THEN
        RAISE EXCEPTION 'pgcoord: outbox topic must be 1 to 255 bytes, got %', coalesce(octet_length(p_topic)::text, 'NULL')
            USING ERRCODE = '22023';
    END IF;
    IF p_key IS NULL OR octet_length(p_key) NOT BETWEEN 1 AND 255 THEN
        RAISE EXCEPTION 'pgcoord: outbox key must be 1 to 255 bytes, got %', coalesce(octet_length(p_key)::text, 'NULL')
            USING ERRCODE = '22023';
    END IF;
    IF p_payload IS NULL OR octet_length(p_payload) > 1048576 THEN
        RAISE EXCEPTION 'pgcoord: outbox payload must be at most 1048576 bytes, got %', coalesce(octet_length(p_payload)::text, 'NULL')
            USING ERRCODE = '22023';
    END IF;
    IF p_delay < interval '0' THEN
        RAISE EXCEPTION 'pgcoord: outbox delay must not be negative, got %', p_delay USING ERRCODE = '22023';
    END IF;
    IF coalesce(p_is_json, false) THEN
        PERFORM convert_from(p_payload, 'UTF8')::jsonb; -- raises 22P02 for invalid JSON
    END IF;
    IF jsonb_typeof(coalesce(p_headers, '{}')) <> 'object' THEN
        RAISE EXCEPTION 'pgcoord: outbox headers must be a JSON object, got %', p_headers USING ERRCODE = '22023';
    END IF;
    PERFORM pgcoord_outbox_wake();
    PERFORM pg_advisory_xact_lock(pgcoord_outbox_lock_key(p_topic, p_key));
    RETURN QUERY
    INSERT INTO pgcoord_outbox (topic, key, payload, is_json, headers, available_at)
    VALUES (p_topic, p_key, p_payload, coalesce(p_is_json, false), coalesce(p_headers, '{}'),
            now() + coalesce(p_delay, interval '0'))
    RETURNING *;
END
$$;
-- +goose StatementEnd

-- pgcoord_outbox_enqueue_many writes several messages in one statement (one notification)
-- and returns them in the order given: element i of each array is message i (p_delays may
-- hold NULLs). The (topic, key) locks of pgcoord_outbox_enqueue_bytes are taken first, in
-- (topic, key) order, so two such batches never deadlock on each other; ids follow the
-- arrays' order, so each key keeps the order it was given in.
-- +goose StatementBegin
CREATE FUNCTION pgcoord_outbox_enqueue_many(
    p_topics text[], p_keys text[], p_payloads bytea[], p_is_json boolean[], p_headers jsonb[], p_delays interval[]
) RETURNS SETOF pgcoord_outbox LANGUAGE plpgsql AS $$
DECLARE
    v_n integer := coalesce(cardinality(p_topics), 0);
    v_bad record;
BEGIN
    IF coalesce(cardinality(p_keys), 0) <> v_n OR coalesce(cardinality(p_payloads), 0) <> v_n
       OR coalesce(cardinality(p_is_json), 0) <> v_n OR coalesce(cardinality(p_headers), 0) <> v_n
       OR coalesce(cardinality(p_delays), 0) <> v_n THEN
        RAISE EXCEPTION 'pgcoord: outbox batch arrays differ in length' USING ERRCODE = '22023';
    END IF;
    SELECT * INTO v_bad FROM unnest(p_topics, p_keys, p_payloads, p_delays) AS m(topic, key, payload, delay)
     WHERE m.topic IS NULL OR octet_length(m.topic) NOT BETWEEN 1 AND 255
        OR m.key IS NULL OR octet_length(m.key) NOT BETWEEN 1 AND 255
        OR m.payload IS NULL OR octet_length(m.payload) > 1048576 OR m.delay < interval '0'
     LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'pgcoord: invalid outbox message to %/%: topic and key must be 1 to 255 bytes, the payload at most 1048576 bytes, the delay not negative',
            v_bad.topic, v_bad.key USING ERRCODE = '22023';
    END IF;
    PERFORM convert_from(m.payload, 'UTF8')::jsonb
       FROM unnest(p_payloads, p_is_json) AS m(payload, is_json) WHERE m.is_json;
    IF EXISTS (SELECT FROM unnest(p_headers) AS h(v) WHERE jsonb_typeof(coalesce(h.v, '{}')) <> 'object') THEN
        RAISE EXCEPTION 'pgcoord: outbox headers must be JSON objects' USING ERRCODE = '22023';
    END IF;
    PERFORM pgcoord_outbox_wake();
    PERFORM pg_advisory_xact_lock(pgcoord_outbox_lock_key(k.topic, k.key))
       FROM (SELECT DISTINCT m.topic, m.key FROM unnest(p_topics, p_keys) AS m(topic, key) ORDER BY 1, 2) k;
    RETURN QUERY
    INSERT INTO pgcoord_outbox (topic, key, payload, is_json, headers, available_at)
    SELECT m.topic, m.key, m.payload, coalesce(m.is_json, false), coalesce(m.headers, '{}'),
           now() + coalesce(m.delay, interval '0')
      FROM unnest(p_topics, p_keys, p_payloads, p_is_json, p_headers, p_delays)
           WITH ORDINALITY AS m(topic, key, payload, is_json, headers, delay, n)
     ORDER BY m.n
    RETURNING *;
END
$$;
-- +goose StatementEnd

-- pgcoord_outbox_enqueue is the SQL API for triggers and other languages: it writes one
-- JSON message in the caller's transaction and returns it (see
-- pgcoord_outbox_enqueue_bytes for the key lock and the checks).
-- +goose StatementBegin
CREATE FUNCTION pgcoord_outbox_enqueue(
    p_topic text, p_key text, p_payload jsonb, p_headers jsonb DEFAULT '{}', p_delay interval DEFAULT NULL
) RETURNS SETOF pgcoord_outbox LANGUAGE plpgsql AS $$
BEGIN
    IF p_payload IS NULL THEN
        RAISE EXCEPTION 'pgcoord: outbox payload is NULL' USING ERRCODE = '22004';
    END IF;
    RETURN QUERY SELECT * FROM pgcoord_outbox_enqueue_bytes(
        p_topic, p_key, convert_to(p_payload::text, 'UTF8'), true, p_headers, p_delay);
END
$$;
-- +goose StatementEnd

-- pgcoord_outbox_claim claims a batch for p_claimant until p_now + p_ttl and returns it,
-- every row stamped with one new claim token. It walks the keys with pending messages in
-- (topic, key) order after (p_after_topic, p_after_key) — one index probe per key, so a
-- deep backlog of one key costs one probe, not one per message — and takes the keys whose
-- oldest pending message (the head) is due and not under a live claim, at most p_limit
-- messages in all: from each such key its head and the messages right behind it, at most
-- p_key_limit, stopping at the first one not due. Heads locked by a concurrent claim are
-- skipped (FOR UPDATE SKIP LOCKED). p_topics, if not NULL, restricts the claim to those
-- topics. The caller resumes after the last key it got, and from the start once a claim
-- returns fewer than p_limit messages: keys are served round robin.
-- +goose StatementBegin
CREATE FUNCTION pgcoord_outbox_claim(
    p_claimant text, p_limit integer, p_key_limit integer, p_ttl interval,
    p_topics text[] DEFAULT NULL, p_after_topic text DEFAULT '', p_after_key text DEFAULT '',
    p_now timestamptz DEFAULT NULL
) RETURNS SETOF pgcoord_outbox LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := coalesce(p_now, now());
    v_token bigint;
BEGIN
    IF p_limit IS NULL OR p_limit < 1 OR p_key_limit IS NULL OR p_key_limit < 1 THEN
        RAISE EXCEPTION 'pgcoord: outbox claim limits must be at least 1, got % and %', p_limit, p_key_limit
            USING ERRCODE = '22023';
    END IF;
    IF p_ttl IS NULL OR p_ttl <= interval '0' THEN
        RAISE EXCEPTION 'pgcoord: outbox claim ttl must be positive, got %', p_ttl USING ERRCODE = '22023';
    END IF;
    -- Above every token of an earlier timeline (see pgcoord_token_floor): a promoted
    -- standby's sequence may hand out again values the old primary had issued.
    v_token := pgcoord_token_floor() + nextval('pgcoord_outbox_claim_token');
    RETURN QUERY
    WITH RECURSIVE heads (topic, key, id, ready, total) AS (
        SELECT coalesce(p_after_topic, ''), coalesce(p_after_key, ''), 0::bigint, false, 0::bigint
        UNION ALL
        -- The next key's head, whether it is ready, and how many messages it would give;
        -- the walk stops once the ready keys give p_limit.
        SELECT n.topic, n.key, n.id, x.ready,
               h.total + CASE WHEN x.ready THEN
                   (SELECT count(*) FROM (SELECT FROM pgcoord_outbox p
                                           WHERE p.state = 'pending' AND p.topic = n.topic AND p.key = n.key
                                           ORDER BY p.id LIMIT p_key_limit) c)
               ELSE 0 END
          FROM heads h
         CROSS JOIN LATERAL (
            SELECT o.topic, o.key, o.id, o.available_at, o.claim_expires_at
              FROM pgcoord_outbox o
             WHERE o.state = 'pending' AND (o.topic, o.key) > (h.topic, h.key)
             ORDER BY o.topic, o.key, o.id LIMIT 1) n
         CROSS JOIN LATERAL (
            SELECT n.available_at <= v_now
                   AND (n.claim_expires_at IS NULL OR n.claim_expires_at <= v_now)
                   AND (p_topics IS NULL OR n.topic = ANY (p_topics)) AS ready) x
         WHERE h.total < p_limit
    ),
    locked AS (
        -- Each ready head by primary key (a plan that scans the pending rows instead costs
        -- O(pending) per claim), locked unless a concurrent claim holds it.
        SELECT o.id, o.topic, o.key
          FROM heads h
         CROSS JOIN LATERAL (
            SELECT o.id, o.topic, o.key FROM pgcoord_outbox o
             WHERE o.id = h.id AND o.state = 'pending' AND o.available_at <= v_now
               AND (o.claim_expires_at IS NULL OR o.claim_expires_at <= v_now)
               FOR UPDATE SKIP LOCKED) o
         WHERE h.ready
    ),
    picked AS (
        SELECT m.id FROM locked l CROSS JOIN LATERAL (
            SELECT s.id FROM (
                SELECT o.id, bool_and(o.available_at <= v_now AND (o.claim_expires_at IS NULL OR o.claim_expires_at <= v_now))
                                OVER (ORDER BY o.id) AS ok
                  FROM pgcoord_outbox o
                 WHERE o.state = 'pending' AND o.topic = l.topic AND o.key = l.key AND o.id >= l.id
                 ORDER BY o.id LIMIT p_key_limit) s
             WHERE s.ok) m
         ORDER BY l.id, m.id
         LIMIT p_limit
    )
    UPDATE pgcoord_outbox o
       SET claim_token = v_token, claimed_by = p_claimant, claim_expires_at = v_now + p_ttl
      FROM picked
     WHERE o.id = picked.id AND o.state = 'pending'
    RETURNING o.*;
END
$$;
-- +goose StatementEnd

-- pgcoord_outbox_settle records the outcome of one claim (p_token) in one statement:
-- p_delivered are marked delivered; p_failed (with p_errors, one per id) count a failed
-- attempt and go dead at p_max_attempts, else are due again after an exponential backoff
-- (p_backoff * 2^(attempts-1), at most p_max_backoff, times a random 0.8..1.2), by the
-- database clock; p_released are let go untried. Only rows still pending under p_token,
-- and not yet settled, change: a claim taken over by another relay, or settled before,
-- changes nothing. Returns how many rows it changed.
-- +goose StatementBegin
CREATE FUNCTION pgcoord_outbox_settle(
    p_token bigint, p_delivered bigint[], p_failed bigint[], p_errors text[], p_released bigint[],
    p_max_attempts integer, p_backoff interval, p_max_backoff interval, p_now timestamptz DEFAULT NULL
) RETURNS integer LANGUAGE plpgsql
-- The rows are found by primary key. Without this the planner, which estimates the claim
-- token to match about one row, scans the whole table instead (100x slower at 100k rows).
SET enable_seqscan = off
AS $$
DECLARE
    v_now timestamptz := coalesce(p_now, now());
    v_n integer;
BEGIN
    WITH outcome AS (
        SELECT d.id, 'd' AS kind, NULL::text AS err FROM unnest(p_delivered) AS d(id)
        UNION ALL
        SELECT f.id, 'f', f.err FROM unnest(p_failed, p_errors) AS f(id, err)
        UNION ALL
        SELECT r.id, 'r', NULL FROM unnest(p_released) AS r(id)
    )
    UPDATE pgcoord_outbox o
       SET state = CASE
                WHEN x.kind = 'd' THEN 'delivered'
                WHEN x.kind = 'f' AND o.attempts + 1 >= p_max_attempts THEN 'dead'
                ELSE 'pending' END,
           delivered_at = CASE WHEN x.kind = 'd' THEN v_now END,
           dead_at = CASE WHEN x.kind = 'f' AND o.attempts + 1 >= p_max_attempts THEN v_now END,
           attempts = o.attempts + (x.kind = 'f')::int,
           last_error = CASE WHEN x.kind = 'f' THEN left(x.err, 2000) ELSE o.last_error END,
           available_at = CASE WHEN x.kind = 'f' THEN
                v_now + least(p_max_backoff, p_backoff * power(2, least(o.attempts, 40))) * (0.8 + 0.4 * random())
                ELSE o.available_at END,
           claim_expires_at = NULL
      FROM outcome x
     WHERE o.id = x.id AND o.claim_token = p_token AND o.claim_expires_at IS NOT NULL AND o.state = 'pending';
    GET DIAGNOSTICS v_n = ROW_COUNT;
    RETURN v_n;
END
$$;
-- +goose StatementEnd

-- The consumer side: one row per (consumer, message) applied, written in the consumer's
-- transaction together with the message's effect.
CREATE TABLE pgcoord_outbox_inbox (
    consumer   text        NOT NULL CHECK (octet_length(consumer) BETWEEN 1 AND 255),
    message_id bigint      NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, message_id)
);

CREATE INDEX pgcoord_outbox_inbox_applied ON pgcoord_outbox_inbox (applied_at);

COMMENT ON TABLE pgcoord_outbox_inbox IS 'pgcoord: messages each consumer has applied (exactly-once effects)';

-- +goose Down
DROP TABLE pgcoord_outbox_inbox;
DROP FUNCTION pgcoord_outbox_settle(bigint, bigint[], bigint[], text[], bigint[], integer, interval, interval, timestamptz);
DROP FUNCTION pgcoord_outbox_claim(text, integer, integer, interval, text[], text, text, timestamptz);
DROP FUNCTION pgcoord_outbox_enqueue(text, text, jsonb, jsonb, interval);
DROP FUNCTION pgcoord_outbox_enqueue_many(text[], text[], bytea[], boolean[], jsonb[], interval[]);
DROP FUNCTION pgcoord_outbox_enqueue_bytes(text, text, bytea, boolean, jsonb, interval);
DROP FUNCTION pgcoord_outbox_idle(text, interval);
DROP TABLE pgcoord_outbox;
DROP FUNCTION pgcoord_outbox_lock_key(text, text);
DROP FUNCTION pgcoord_outbox_wake();
DROP FUNCTION pgcoord_outbox_wake_flag();
DROP TABLE pgcoord_outbox_idle;
DROP SEQUENCE pgcoord_outbox_claim_token;
