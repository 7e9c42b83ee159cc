-- Transactional outbox, relay claims and the consumer inbox.
--
-- A message is a row of pgcoord_outbox written in the producer's own transaction: it exists
-- for the relay only if that transaction commits. A message is pending until a relay marks
-- it delivered, or until it failed max_attempts times (dead). The relay works on state, not
-- on id ranges: every committed pending message stays claimable however late its
-- transaction commits, so no message is skipped (outbox/doc.go has the reasoning).
--
-- Order per key: every write path (the pgcoord_outbox_enqueue* functions, and the Go
-- library's statements) takes a transaction-level advisory lock on (topic, key) before the
-- INSERT (pgcoord_outbox_lock), so two transactions writing one key are serialized: the
-- second gets its id only after the first committed or rolled back, and ids of one key are
-- in commit order. A relay claims only the oldest pending message of a key (its head) and
-- the pending messages right behind it, so a key is delivered in id order, one relay at a
-- time, while different keys flow in parallel. A failing head parks its key only.
--
-- Several relays: each key falls in one of 1024 buckets (a hash of topic and key), and the
-- live relays of one topic set split the buckets into equal ranges, one each
-- (pgcoord_outbox_relays, renewed by their claims). A claim walks its own range first, so
-- concurrent claims walk disjoint keys instead of counting heads another claim is about
-- to lock; it walks the ranges of relays that took nothing for a second only when its
-- own has nothing ready. The ranges only steer the walk: what a claim may take is
-- decided, as with one relay, by the head's lock and state, so a range held by a relay
-- that died is taken by the others once theirs run dry, and no guarantee depends on the
-- ranges being right.
--
-- Fencing: each claim stamps its rows with a token from pgcoord_next_token() (tokens only go
-- up and are never reused) and an expiry by the database clock.
-- Settling (delivered, retry, dead, release) matches the token: a relay paused past its
-- claim, whose rows were claimed again by another relay, changes nothing.

-- +goose Up
-- pgcoord_outbox_lock_key is the advisory-lock key of (topic, key), which writers of the
-- key hold until they commit (the topic's length keeps "a:b" + "c" apart from "a" + "b:c").
-- Every part of it is immutable (note the ::text: int || text is only stable), so the
-- planner inlines it into the calling statement instead of calling a function per row.
CREATE FUNCTION pgcoord_outbox_lock_key(p_topic text, p_key text) RETURNS bigint
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    AS $$ SELECT pgcoord_lock_key('outbox:' || octet_length(p_topic)::text || ':' || p_topic || ':' || p_key) $$;

-- pgcoord_outbox_bucket is the bucket of (topic, key), 0 to 1023: bits of its lock key.
CREATE FUNCTION pgcoord_outbox_bucket(p_topic text, p_key text) RETURNS integer
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    AS $$ SELECT (pgcoord_outbox_lock_key(p_topic, p_key) & 1023)::integer $$;

CREATE TABLE pgcoord_outbox (
    id               bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- Topic and key (1 to 255 bytes each), payload (at most 1 MiB) and headers (a JSON
    -- object) are checked by the functions that write messages (and by the Go library)
    -- rather than by CHECK constraints, which are evaluated again on every claim and settle
    -- (each an UPDATE of the row): write messages through pgcoord_outbox_enqueue*, not
    -- with INSERT, which would skip the checks, the per-key order lock and the wake-up.
    topic            text        NOT NULL,
    key              text        NOT NULL,
    -- The key's bucket, 0 to 1023: relays split the buckets between them (see above).
    bucket           integer     GENERATED ALWAYS AS (pgcoord_outbox_bucket(topic, key)) STORED,
    payload          bytea       NOT NULL,
    -- The payload is a JSON document (validated when written).
    is_json          boolean     NOT NULL DEFAULT false,
    headers          jsonb       NOT NULL DEFAULT '{}',
    state            text        NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'delivered', 'dead')),
    created_at       timestamptz NOT NULL DEFAULT pgcoord_now(),
    -- When the message may be claimed: created_at + delay, or the end of a retry's backoff.
    available_at     timestamptz NOT NULL DEFAULT pgcoord_now(),
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

-- The hot set: pending messages only, by bucket, key then id (the per-key heads, walked
-- one bucket range at a time, and Stats). A lookup of one key names its bucket too.
CREATE INDEX pgcoord_outbox_pending ON pgcoord_outbox (bucket, topic, key, id) WHERE state = 'pending';
CREATE INDEX pgcoord_outbox_dead ON pgcoord_outbox (topic, id) WHERE state = 'dead';

COMMENT ON TABLE pgcoord_outbox IS 'pgcoord: transactional outbox messages (pending, delivered, dead)';

-- Wake-ups. NOTIFY is not free: PostgreSQL serializes the commits of notifying
-- transactions server-wide (a notifying commit takes a database-wide lock to queue its
-- notifications, as the lease functions' comments note too). So a producer notifies only
-- while some relay is idle, waiting for work: a listening relay that found nothing
-- registers in pgcoord_outbox_idle (until a deadline it keeps extending while it waits)
-- and leaves it when it finds work again; busy relays need no wake-up.
--
-- A producer takes a shared transaction-level advisory lock before it checks, held until
-- it commits. A relay registers itself and then TRIES the same lock in exclusive mode
-- (pgcoord_outbox_idle), without waiting for it: a registration never makes a producer
-- queue, however long a producer's transaction stays open. If the relay gets the lock, no
-- producer was between its check and its commit, so none can miss the registration: every
-- later producer checks after it commits and notifies, and the relay's next claim, after
-- the registration, sees every message committed before it. If the lock is taken, some
-- producer may have checked before the registration and not committed yet; the relay
-- claims again and registers again soon (within its poll interval), so such a message
-- waits at most until then. (A producer in a REPEATABLE READ or SERIALIZABLE transaction
-- checks with its transaction's snapshot, which may predate a registration: that relay
-- then finds the message at its next poll.)
CREATE TABLE pgcoord_outbox_idle (
    claimant text        PRIMARY KEY,
    until    timestamptz NOT NULL
);

COMMENT ON TABLE pgcoord_outbox_idle IS 'pgcoord: outbox relays waiting for a notification';

-- The relays that claim, by topic set (NULL: every topic), each until its latest claim
-- expires (every claim renews it) or until it leaves, with when it last took messages: the
-- live relays of one topic set, in claimant order, own equal ranges of the buckets.
CREATE TABLE pgcoord_outbox_relays (
    claimant   text        PRIMARY KEY,
    topics     text[],
    claimed_at timestamptz NOT NULL,
    until      timestamptz NOT NULL
);

COMMENT ON TABLE pgcoord_outbox_relays IS 'pgcoord: outbox relays sharing the keys by bucket ranges';

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
-- Writers call it through pgcoord_outbox_lock, in the statement that inserts, before they
-- take their (topic, key) locks. It is not a trigger: an AFTER trigger's bookkeeping cost
-- more than the check itself, on every statement. A row INSERTed by hand therefore wakes
-- no relay; the relays find it at their next poll.
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
    IF EXISTS (SELECT FROM pgcoord_outbox_idle WHERE until > pgcoord_clock()) THEN
        PERFORM pg_notify(pgcoord_channel('outbox'), '');
    END IF;
    RETURN true;
END
$$;
-- +goose StatementEnd

-- pgcoord_outbox_idle registers p_claimant (1 to 255 bytes), a relay LISTENing on
-- pgcoord_channel('outbox'), as waiting for work until now + p_ttl (positive, at most 24
-- hours), and returns whether the registration is tight: true if no producer can have
-- checked for waiting relays before it and still be uncommitted. It never waits. Claim again
-- after it returns; then, if it returned false, register again soon rather than waiting a
-- whole poll interval. p_ttl NULL (a relay that found work) removes the registration and
-- returns true.
-- +goose StatementBegin
CREATE FUNCTION pgcoord_outbox_idle(p_claimant text, p_ttl interval) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    IF NOT pgcoord_name_ok(p_claimant) THEN
        PERFORM pgcoord_refuse_name('outbox claimant', p_claimant);
    END IF;
    IF p_ttl IS NOT NULL AND NOT pgcoord_ttl_ok(p_ttl) THEN
        PERFORM pgcoord_refuse('idle ttl', 'positive, at most 24 hours and without months, or NULL', p_ttl::text);
    END IF;
    IF p_ttl IS NULL THEN
        DELETE FROM pgcoord_outbox_idle WHERE claimant = p_claimant;
        RETURN true;
    END IF;
    PERFORM set_config('synchronous_commit', 'off', true); -- losing it only delays a wake-up
    INSERT INTO pgcoord_outbox_idle (claimant, until) VALUES (p_claimant, pgcoord_clock() + p_ttl)
    ON CONFLICT (claimant) DO UPDATE SET until = excluded.until;
    RETURN pg_try_advisory_xact_lock(pgcoord_lock_key('outbox:wakeup'));
END
$$;
-- +goose StatementEnd

-- pgcoord_outbox_lock is the enqueue protocol: every write path calls it for a message's
-- (topic, key) in the statement that inserts, before the message's id is drawn. It makes
-- the wake-up check (pgcoord_outbox_wake, a function call for the transaction's first
-- message only) first, so that a producer holds no key's lock during the instant it may
-- wait for a registering relay's commit, then takes the transaction-level advisory lock on
-- (topic, key), held until the caller's transaction ends: writers of one key are
-- serialized, so the key's ids are in commit order. It returns true. It is one expression
-- (CASE orders the two steps), so the planner inlines it into the calling statement: no
-- function call.
CREATE FUNCTION pgcoord_outbox_lock(p_topic text, p_key text) RETURNS boolean
    LANGUAGE sql
    AS $$ SELECT CASE WHEN current_setting(pgcoord_outbox_wake_flag(), true) = 'on' OR pgcoord_outbox_wake()
                      THEN pg_advisory_xact_lock(pgcoord_outbox_lock_key(p_topic, p_key)) IS NOT NULL END $$;

-- pgcoord_outbox_insert writes messages in the caller's transaction and returns them in
-- the order given: element i of each array is message i; NULL is_json, headers and delays
-- stand for false, '{}' and no delay. It takes every lock of pgcoord_outbox_lock first, in
-- (topic, key) order, so two batches never deadlock on each other; ids follow the arrays'
-- order, so each key keeps the order it was given in. It checks nothing:
-- pgcoord_outbox_enqueue_many calls it after its checks, and the Go library's EnqueueBatch
-- after its own.
-- +goose StatementBegin
CREATE FUNCTION pgcoord_outbox_insert(
    p_topics text[], p_keys text[], p_payloads bytea[], p_is_json boolean[], p_headers jsonb[], p_delays interval[]
) RETURNS SETOF pgcoord_outbox LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pgcoord_outbox_wake(); -- an empty batch too
    PERFORM pgcoord_outbox_lock(k.topic, k.key)
       FROM (SELECT DISTINCT m.topic, m.key FROM unnest(p_topics, p_keys) AS m(topic, key) ORDER BY 1, 2) k;
    RETURN QUERY
    INSERT INTO pgcoord_outbox (topic, key, payload, is_json, headers, available_at)
    SELECT m.topic, m.key, m.payload, coalesce(m.is_json, false), coalesce(m.headers, '{}'),
           pgcoord_now() + coalesce(m.delay, interval '0')
      FROM unnest(p_topics, p_keys, p_payloads, p_is_json, p_headers, p_delays)
           WITH ORDINALITY AS m(topic, key, payload, is_json, headers, delay, n)
     ORDER BY m.n
    RETURNING *;
END
$$;
-- +goose StatementEnd

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
    IF NOT pgcoord_name_ok(p_topic) THEN
        PERFORM pgcoord_refuse_name('outbox topic', p_topic);
    END IF;
    IF NOT pgcoord_name_ok(p_key) THEN
        PERFORM pgcoord_refuse_name('outbox key', p_key);
    END IF;
    IF p_payload IS NULL OR octet_length(p_payload) > 1048576 THEN
        PERFORM pgcoord_refuse('outbox payload', 'at most 1048576 bytes', octet_length(p_payload) || ' bytes');
    END IF;
    IF p_delay < interval '0' THEN
        RAISE EXCEPTION 'pgcoord: outbox delay must not be negative, got %', p_delay USING ERRCODE = '22023';
    END IF;
    IF coalesce(p_is_json, false) THEN
        PERFORM convert_from(p_payload, 'UTF8')::jsonb; -- raises 22P02 for invalid JSON
    END IF;
    IF jsonb_typeof(coalesce(p_headers, '{}')) <> 'object' OR pg_column_size(p_headers) > 65536 THEN
        PERFORM pgcoord_refuse('outbox headers', 'a JSON object of at most 65536 bytes, or NULL',
                               jsonb_typeof(p_headers) || ' of ' || pg_column_size(p_headers) || ' bytes');
    END IF;
    PERFORM pgcoord_outbox_lock(p_topic, p_key);
    RETURN QUERY
    INSERT INTO pgcoord_outbox (topic, key, payload, is_json, headers, available_at)
    VALUES (p_topic, p_key, p_payload, coalesce(p_is_json, false), coalesce(p_headers, '{}'),
            pgcoord_now() + coalesce(p_delay, interval '0'))
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
    IF p_topics IS NULL OR p_keys IS NULL OR p_payloads IS NULL OR p_is_json IS NULL OR p_headers IS NULL
       OR p_delays IS NULL THEN
        PERFORM pgcoord_refuse(CASE WHEN p_topics IS NULL THEN 'p_topics' WHEN p_keys IS NULL THEN 'p_keys'
                                    WHEN p_payloads IS NULL THEN 'p_payloads' WHEN p_is_json IS NULL THEN 'p_is_json'
                                    WHEN p_headers IS NULL THEN 'p_headers' ELSE 'p_delays' END,
                               'an array with one element per message', NULL);
    END IF;
    IF cardinality(p_keys) <> v_n OR cardinality(p_payloads) <> v_n OR cardinality(p_is_json) <> v_n
       OR cardinality(p_headers) <> v_n OR cardinality(p_delays) <> v_n THEN
        RAISE EXCEPTION 'pgcoord: outbox batch arrays must have the same length, got % topics, % keys, % payloads, % is_json, % headers, % delays',
            v_n, cardinality(p_keys), cardinality(p_payloads), cardinality(p_is_json), cardinality(p_headers),
            cardinality(p_delays) USING ERRCODE = '22023';
    END IF;
    SELECT m.n, CASE
             WHEN NOT pgcoord_name_ok(m.topic) THEN 'topic must be 1 to 255 bytes, got ' || coalesce(octet_length(m.topic) || ' bytes', 'NULL')
             WHEN NOT pgcoord_name_ok(m.key) THEN 'key must be 1 to 255 bytes, got ' || coalesce(octet_length(m.key) || ' bytes', 'NULL')
             WHEN m.payload IS NULL OR octet_length(m.payload) > 1048576
             THEN 'payload must be at most 1048576 bytes, got ' || coalesce(octet_length(m.payload) || ' bytes', 'NULL')
             ELSE 'delay must not be negative, got ' || m.delay END AS why
      INTO v_bad FROM unnest(p_topics, p_keys, p_payloads, p_delays) WITH ORDINALITY AS m(topic, key, payload, delay, n)
     WHERE NOT pgcoord_name_ok(m.topic) OR NOT pgcoord_name_ok(m.key)
        OR m.payload IS NULL OR octet_length(m.payload) > 1048576 OR m.delay < interval '0'
     ORDER BY m.n LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'pgcoord: outbox message % of the batch: %', v_bad.n, v_bad.why USING ERRCODE = '22023';
    END IF;
    PERFORM convert_from(m.payload, 'UTF8')::jsonb
       FROM unnest(p_payloads, p_is_json) AS m(payload, is_json) WHERE m.is_json;
    IF EXISTS (SELECT FROM unnest(p_headers) AS h(v)
                WHERE jsonb_typeof(coalesce(h.v, '{}')) <> 'object' OR pg_column_size(h.v) > 65536) THEN
        RAISE EXCEPTION 'pgcoord: outbox headers must be JSON objects of at most 65536 bytes, or NULL' USING ERRCODE = '22023';
    END IF;
    RETURN QUERY SELECT * FROM pgcoord_outbox_insert(p_topics, p_keys, p_payloads, p_is_json, p_headers, p_delays);
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

-- pgcoord_outbox_claim claims a batch for p_claimant until now + p_ttl and returns it in
-- claim order (key by key, each key's messages by id), every row stamped with one new claim
-- token. It walks the keys with pending messages — one index probe per key, so a deep
-- backlog of one key costs one probe, not one per message — and takes the keys whose
-- oldest pending message (the head) is due and not under a live claim, at most p_limit
-- messages in all: from each such key its head and the messages right behind it, at most
-- p_key_limit, stopping at the first one not due. Heads locked by a concurrent claim are
-- skipped (FOR UPDATE SKIP LOCKED). The batch's payloads add up to at most p_max_bytes,
-- except that a claim always takes at least one message: a larger one is claimed alone.
-- p_topics, if not NULL, restricts the claim to those topics.
--
-- Which keys it walks: the claim makes p_claimant a member of the relays of its topic set
-- until now + p_ttl (pgcoord_outbox_relays; DELETE its row there to leave at once). The
-- live members, in claimant order, split the 1024 buckets into equal ranges, and the claim
-- walks its own range in (bucket, topic, key) order, from after (p_after_topic,
-- p_after_key) if that key is in the range (else from the range's start) round to it.
-- Only if that finds nothing ready does it walk the other ranges, the next relay's first,
-- and of those only the ranges of relays that took no message in the last second (dead,
-- idle or slow). So concurrent relays walk disjoint keys. What the limits cut off is a
-- suffix in claim order, so the caller resumes after the last key it got, and from ''
-- once a claim was cut by neither limit: keys are served round robin.
--
-- Bad arguments raise 22004 or 22023: a claimant not of 1 to 255 bytes, limits outside 1
-- to 10,000 (p_key_limit at most p_limit), p_max_bytes below 1, a TTL outside (0, 24
-- hours], an invalid topic.
-- +goose StatementBegin
CREATE FUNCTION pgcoord_outbox_claim(
    p_claimant text, p_limit integer, p_key_limit integer, p_max_bytes bigint, p_ttl interval,
    p_topics text[] DEFAULT NULL, p_after_topic text DEFAULT '', p_after_key text DEFAULT ''
) RETURNS SETOF pgcoord_outbox LANGUAGE plpgsql
-- The batch's rows are found by primary key (see pgcoord_outbox_settle), the keys through
-- the pending index: a table scan is never the way, even on a table not analyzed yet.
-- The few relays' rows have no index to use, so their scan then costs "disabled" (1e10),
-- which without jit = off would JIT-compile that statement on every claim (60-140 ms).
SET enable_seqscan = off
SET jit = off
AS $$
DECLARE
    v_now timestamptz := pgcoord_now();
    v_token bigint;
    v_group text[];
    v_n integer;            -- live relays of the topic set
    v_i integer;            -- this relay's place among them
    v_lo integer;           -- its range of buckets: v_lo <= bucket < v_hi
    v_hi integer;
    v_from integer;         -- the bucket of the key to resume after
    v_heads bigint[] := '{}'; -- the ready heads, in walk order
    v_total bigint := 0;    -- the messages they would give
    v_idle boolean[];       -- per relay, in claimant order: nothing taken for a second
    v_seg integer;
    v_j integer;            -- the relay whose range a segment walks
    v_lb integer;           -- the segment: after (v_lb, v_lt, v_lk), before (v_ub, v_ut, v_uk)
    v_lt text;
    v_lk text;
    v_ub integer;
    v_ut text;
    v_uk text;
    v_ids bigint[];
BEGIN
    IF NOT pgcoord_name_ok(p_claimant) THEN
        PERFORM pgcoord_refuse_name('outbox claimant', p_claimant);
    END IF;
    IF p_limit IS NULL OR p_limit NOT BETWEEN 1 AND 10000 THEN
        PERFORM pgcoord_refuse('outbox claim limit', 'between 1 and 10000', p_limit::text);
    END IF;
    IF p_key_limit IS NULL OR p_key_limit NOT BETWEEN 1 AND p_limit THEN
        PERFORM pgcoord_refuse('outbox claim key limit', 'between 1 and the claim limit ' || p_limit, p_key_limit::text);
    END IF;
    IF p_max_bytes IS NULL OR p_max_bytes < 1 THEN
        PERFORM pgcoord_refuse('outbox claim byte limit', 'positive', p_max_bytes::text);
    END IF;
    IF NOT pgcoord_ttl_ok(p_ttl) THEN
        PERFORM pgcoord_refuse('outbox claim ttl', 'positive, at most 24 hours and without months', p_ttl::text);
    END IF;
    IF EXISTS (SELECT FROM unnest(p_topics) t WHERE NOT pgcoord_name_ok(t)) THEN
        PERFORM pgcoord_refuse('outbox claim topics', 'topics of 1 to 255 bytes', 'a NULL, empty or longer topic');
    END IF;
    v_token := pgcoord_next_token();

    -- The relays of the topic set, this one among them: how many, this one's place, and
    -- which have not taken anything for a second. This claim's own registration is written
    -- at the end, with what it took.
    IF p_topics IS NOT NULL THEN
        v_group := ARRAY(SELECT DISTINCT t FROM unnest(p_topics) t ORDER BY 1);
    END IF;
    SELECT count(*), count(*) FILTER (WHERE r.claimant COLLATE "C" < p_claimant COLLATE "C"),
           array_agg(r.claimed_at < v_now - interval '1 second' ORDER BY r.claimant COLLATE "C")
      INTO v_n, v_i, v_idle
      FROM (SELECT x.claimant, x.claimed_at FROM pgcoord_outbox_relays x
             WHERE x.until > v_now AND x.topics IS NOT DISTINCT FROM v_group AND x.claimant <> p_claimant
            UNION ALL
            SELECT p_claimant, v_now) r;
    v_n := greatest(v_n, 1);
    v_i := least(v_i, v_n - 1);
    v_lo := v_i * 1024 / v_n;
    v_hi := (v_i + 1) * 1024 / v_n;
    v_from := pgcoord_outbox_bucket(p_after_topic, p_after_key);
    IF coalesce(p_after_topic, '') = '' OR coalesce(p_after_key, '') = '' OR v_from NOT BETWEEN v_lo AND v_hi - 1 THEN
        v_from := v_lo;
        p_after_topic := '';
        p_after_key := '';
    END IF;

    -- The walk, in segments of (bucket, topic, key) order, each from after its first bound
    -- to before its second (no key or topic is ''): 1 and 2 the own range from the cursor
    -- round to it, then, from the next relay's on, the ranges of the relays that took nothing
    -- for a second (dead, idle, or slow to deliver: a relay that takes messages takes its
    -- own range, and taking it too would bring the collisions back). It stops once the
    -- ready keys give p_limit, and after the own range if that gave any.
    FOR v_seg IN 1..v_n + 1 LOOP
        EXIT WHEN v_total >= p_limit OR (v_seg = 3 AND v_total > 0);
        CONTINUE WHEN v_seg = 2 AND p_after_key = '';
        IF v_seg = 1 THEN
            v_lb := v_from; v_lt := p_after_topic; v_lk := p_after_key; v_ub := v_hi; v_ut := ''; v_uk := '';
        ELSIF v_seg = 2 THEN
            v_lb := v_lo; v_lt := ''; v_lk := ''; v_ub := v_from; v_ut := p_after_topic; v_uk := p_after_key;
        ELSE
            v_j := (v_i + v_seg - 2) % v_n;
            CONTINUE WHEN NOT coalesce(v_idle[v_j + 1], true);
            v_lb := v_j * 1024 / v_n; v_lt := ''; v_lk := ''; v_ub := (v_j + 1) * 1024 / v_n; v_ut := ''; v_uk := '';
        END IF;
        WITH RECURSIVE heads (bucket, topic, key, id, ready, total, step) AS (
            SELECT v_lb, v_lt, v_lk, 0::bigint, false, v_total, 0
            UNION ALL
            -- The next key's head, whether it is ready, and how many messages it would give.
            SELECT n.bucket, n.topic, n.key, n.id, x.ready,
                   h.total + CASE WHEN x.ready THEN
                       (SELECT count(*) FROM (SELECT FROM pgcoord_outbox p
                                               WHERE p.state = 'pending' AND p.bucket = n.bucket
                                                 AND p.topic = n.topic AND p.key = n.key
                                               ORDER BY p.id LIMIT p_key_limit) c)
                   ELSE 0 END,
                   h.step + 1
              FROM heads h
             CROSS JOIN LATERAL (
                SELECT o.bucket, o.topic, o.key, o.id, o.available_at, o.claim_expires_at
                  FROM pgcoord_outbox o
                 WHERE o.state = 'pending' AND (o.bucket, o.topic, o.key) > (h.bucket, h.topic, h.key)
                   AND (o.bucket, o.topic, o.key) < (v_ub, v_ut, v_uk)
                 ORDER BY o.bucket, o.topic, o.key, o.id LIMIT 1) n
             CROSS JOIN LATERAL (
                SELECT n.available_at <= v_now
                       AND (n.claim_expires_at IS NULL OR n.claim_expires_at <= v_now)
                       AND (p_topics IS NULL OR n.topic = ANY (p_topics)) AS ready) x
             WHERE h.total < p_limit
        )
        SELECT v_heads || ARRAY(SELECT h.id FROM heads h WHERE h.ready ORDER BY h.step), coalesce(max(h.total), v_total)
          INTO v_heads, v_total FROM heads h;
    END LOOP;

    WITH locked AS (
        -- Each ready head by primary key (a plan that scans the pending rows instead costs
        -- O(pending) per claim), locked unless a concurrent claim holds it.
        SELECT o.id, o.bucket, o.topic, o.key, h.step
          FROM unnest(v_heads) WITH ORDINALITY h(id, step)
         CROSS JOIN LATERAL (
            SELECT o.id, o.bucket, o.topic, o.key FROM pgcoord_outbox o
             WHERE o.id = h.id AND o.state = 'pending' AND o.available_at <= v_now
               AND (o.claim_expires_at IS NULL OR o.claim_expires_at <= v_now)
               FOR UPDATE SKIP LOCKED) o
    ),
    picked AS (
        -- In walk order: whatever LIMIT and the byte cap below cut off lies after every
        -- message claimed, so the caller's cursor skips none of it.
        SELECT m.id, m.bytes, row_number() OVER (ORDER BY l.step, m.id) AS n FROM locked l CROSS JOIN LATERAL (
            SELECT s.id, s.bytes FROM (
                SELECT o.id, octet_length(o.payload) AS bytes,
                       bool_and(o.available_at <= v_now AND (o.claim_expires_at IS NULL OR o.claim_expires_at <= v_now))
                                OVER (ORDER BY o.id) AS ok
                  FROM pgcoord_outbox o
                 WHERE o.state = 'pending' AND o.bucket = l.bucket AND o.topic = l.topic AND o.key = l.key
                   AND o.id >= l.id
                 ORDER BY o.id LIMIT p_key_limit) s
             WHERE s.ok) m
         ORDER BY l.step, m.id
         LIMIT p_limit
    )
    -- The messages, in claim order, while the payloads so far fit p_max_bytes (the first
    -- one always: octet_length reads the stored size, not the payload).
    SELECT ARRAY(SELECT c.id FROM (SELECT p.id, p.n, sum(p.bytes) OVER (ORDER BY p.n) AS upto FROM picked p) c
                  WHERE c.n = 1 OR c.upto <= p_max_bytes ORDER BY c.n)
      INTO v_ids;

    -- Membership, until this claim expires, and when it last took messages. A relay that
    -- joins also deletes the registrations that ran out, skipping those another relay is
    -- deleting (so no claim waits for another's in a cycle).
    UPDATE pgcoord_outbox_relays r
       SET topics = v_group, until = v_now + p_ttl,
           claimed_at = CASE WHEN cardinality(v_ids) > 0 THEN v_now ELSE r.claimed_at END
     WHERE r.claimant = p_claimant;
    IF NOT FOUND THEN
        DELETE FROM pgcoord_outbox_relays r
         WHERE r.claimant = ANY (ARRAY(SELECT x.claimant FROM pgcoord_outbox_relays x
                                        WHERE x.until <= v_now FOR UPDATE SKIP LOCKED));
        INSERT INTO pgcoord_outbox_relays AS r (claimant, topics, claimed_at, until)
        VALUES (p_claimant, v_group, CASE WHEN cardinality(v_ids) > 0 THEN v_now ELSE '-infinity' END, v_now + p_ttl)
        ON CONFLICT (claimant) DO UPDATE SET topics = excluded.topics, until = excluded.until,
                                             claimed_at = greatest(r.claimed_at, excluded.claimed_at);
    END IF;

    -- The rows by primary key only, as in pgcoord_outbox_settle (which says why), returned
    -- in claim order.
    RETURN QUERY
    WITH claimed AS (
        UPDATE pgcoord_outbox o
           SET claim_token = v_token, claimed_by = p_claimant, claim_expires_at = v_now + p_ttl
         WHERE o.id = ANY (v_ids) AND o.state NOT IN ('delivered', 'dead')
        RETURNING o.*)
    SELECT c.* FROM claimed c JOIN unnest(v_ids) WITH ORDINALITY k(id, n) ON k.id = c.id ORDER BY k.n;
END
$$;
-- +goose StatementEnd

-- pgcoord_outbox_settle records the outcome of one claim (p_token) in one call:
-- p_delivered are marked delivered; p_failed (with p_errors, one per id) count a failed
-- attempt and go dead at p_max_attempts, else are due again after an exponential backoff
-- (p_backoff * 2^(attempts-1), at most p_max_backoff, times a random 0.8..1.2), by the
-- database clock; p_released are let go untried. Only rows still pending under p_token,
-- and not yet settled, change: a claim taken over by another relay, or settled before,
-- changes nothing. Returns how many rows of each kind it changed (delivered, failed —
-- dead included — dead, released): fewer than sent means another relay took the claim over
-- after it expired. Bad arguments raise 22004 or 22023:
-- a token not positive, p_errors not as long as p_failed, p_max_attempts below 1, a backoff
-- not within 0 <= p_backoff <= p_max_backoff <= 366 days.
--
-- Each kind of outcome is one UPDATE whose rows are found by primary key only, so that
-- every plan the planner may pick costs O(ids), however stale the table's statistics:
-- WHERE id = ANY (ids), no join (joined with the ids, the table may be scanned and matched
-- row by row: a plan chosen, after a bulk load or a TRUNCATE that autoanalyze has not seen,
-- for the claim token's or the state's wrongly low estimate, costs O(backlog) per call),
-- and the state tested with NOT IN, which the partial index of pending messages cannot
-- serve (state = 'pending' lets the planner read that whole index instead).
-- +goose StatementBegin
CREATE FUNCTION pgcoord_outbox_settle(
    p_token bigint, p_delivered bigint[], p_failed bigint[], p_errors text[], p_released bigint[],
    p_max_attempts integer, p_backoff interval, p_max_backoff interval
) RETURNS TABLE (delivered integer, failed integer, dead integer, released integer) LANGUAGE plpgsql
-- A table scan is never the way to a claim's rows, even when the planner thinks the table
-- small (a bulk load it has not analyzed yet).
SET enable_seqscan = off
AS $$
DECLARE
    v_now timestamptz := pgcoord_now();
    v_errors jsonb;
BEGIN
    delivered := 0;
    failed := 0;
    dead := 0;
    released := 0;
    IF p_token IS NULL OR p_token < 1 THEN
        PERFORM pgcoord_refuse('claim token', 'positive', p_token::text);
    END IF;
    IF coalesce(cardinality(p_failed), 0) <> coalesce(cardinality(p_errors), 0) THEN
        PERFORM pgcoord_refuse('p_errors', 'one error per failed id (' || coalesce(cardinality(p_failed), 0) || ')',
                               coalesce(cardinality(p_errors), 0)::text);
    END IF;
    IF p_max_attempts IS NULL OR p_max_attempts < 1 THEN
        PERFORM pgcoord_refuse('max attempts', 'at least 1', p_max_attempts::text);
    END IF;
    IF p_backoff IS NULL OR p_max_backoff IS NULL OR p_backoff < interval '0' OR p_max_backoff < p_backoff
       OR p_max_backoff > interval '366 days' THEN
        PERFORM pgcoord_refuse('backoff', 'within 0 <= backoff <= max backoff <= 366 days',
                               p_backoff || ' and ' || p_max_backoff);
    END IF;
    IF cardinality(p_delivered) > 0 THEN
        UPDATE pgcoord_outbox o
           SET state = 'delivered', delivered_at = v_now, claim_expires_at = NULL
         WHERE o.id = ANY (p_delivered)
           AND o.claim_token = p_token AND o.claim_expires_at IS NOT NULL AND o.state NOT IN ('delivered', 'dead');
        GET DIAGNOSTICS delivered = ROW_COUNT;
    END IF;
    IF cardinality(p_failed) > 0 THEN
        -- Each row's error by its id: one lookup in an object, not a join.
        SELECT jsonb_object_agg(f.id, left(f.err, 2000)) INTO v_errors FROM unnest(p_failed, p_errors) AS f(id, err)
         WHERE f.id IS NOT NULL;
        WITH settled AS (
            UPDATE pgcoord_outbox o
               SET state = CASE WHEN o.attempts + 1 >= p_max_attempts THEN 'dead' ELSE 'pending' END,
                   dead_at = CASE WHEN o.attempts + 1 >= p_max_attempts THEN v_now END,
                   attempts = o.attempts + 1,
                   last_error = v_errors ->> o.id::text,
                   available_at = v_now + least(p_max_backoff, p_backoff * power(2, least(o.attempts, 40))) * (0.8 + 0.4 * random()),
                   claim_expires_at = NULL
             WHERE o.id = ANY (p_failed)
               AND o.claim_token = p_token AND o.claim_expires_at IS NOT NULL AND o.state NOT IN ('delivered', 'dead')
            RETURNING o.state)
        SELECT count(*), count(*) FILTER (WHERE settled.state = 'dead') INTO failed, dead FROM settled;
    END IF;
    IF cardinality(p_released) > 0 THEN
        UPDATE pgcoord_outbox o
           SET claim_expires_at = NULL
         WHERE o.id = ANY (p_released)
           AND o.claim_token = p_token AND o.claim_expires_at IS NOT NULL AND o.state NOT IN ('delivered', 'dead');
        GET DIAGNOSTICS released = ROW_COUNT;
    END IF;
    RETURN NEXT;
END
$$;
-- +goose StatementEnd

-- The consumer side: one row per (consumer, message) applied, written in the consumer's
-- transaction together with the message's effect.
CREATE TABLE pgcoord_outbox_inbox (
    consumer   text        NOT NULL CHECK (octet_length(consumer) BETWEEN 1 AND 255),
    message_id bigint      NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT pgcoord_now(),
    PRIMARY KEY (consumer, message_id)
);

CREATE INDEX pgcoord_outbox_inbox_applied ON pgcoord_outbox_inbox (applied_at);

COMMENT ON TABLE pgcoord_outbox_inbox IS 'pgcoord: messages each consumer has applied (exactly-once effects)';

-- +goose Down
DROP TABLE pgcoord_outbox_inbox;
DROP FUNCTION pgcoord_outbox_settle(bigint, bigint[], bigint[], text[], bigint[], integer, interval, interval);
DROP FUNCTION pgcoord_outbox_claim(text, integer, integer, bigint, interval, text[], text, text);
DROP FUNCTION pgcoord_outbox_enqueue(text, text, jsonb, jsonb, interval);
DROP FUNCTION pgcoord_outbox_enqueue_many(text[], text[], bytea[], boolean[], jsonb[], interval[]);
DROP FUNCTION pgcoord_outbox_enqueue_bytes(text, text, bytea, boolean, jsonb, interval);
DROP FUNCTION pgcoord_outbox_insert(text[], text[], bytea[], boolean[], jsonb[], interval[]);
DROP FUNCTION pgcoord_outbox_lock(text, text);
DROP FUNCTION pgcoord_outbox_idle(text, interval);
DROP TABLE pgcoord_outbox;
DROP FUNCTION pgcoord_outbox_bucket(text, text);
DROP FUNCTION pgcoord_outbox_lock_key(text, text);
DROP FUNCTION pgcoord_outbox_wake();
DROP FUNCTION pgcoord_outbox_wake_flag();
DROP TABLE pgcoord_outbox_relays;
DROP TABLE pgcoord_outbox_idle;
