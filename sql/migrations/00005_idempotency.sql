-- Idempotency keys: "make running twice harmless" for HTTP APIs, webhooks and payment calls.
--
-- A key row records (scope, key) -> the request's fingerprint, its state (in_flight or
-- completed), the recovery point of an attempt that works in phases, and, once completed,
-- the stored response (status, selected headers, body).
--
-- Liveness is a lock, not a timer: an attempt holds a transaction-level advisory lock on
-- pgcoord_idempotency_lock_key(scope, key) in a transaction that stays open while its
-- handler runs. A second attempt that cannot take the lock knows the first is alive; one
-- that can take it while the row says in_flight knows the holder died (its connection, and
-- with it the lock, is gone) and takes the key over at once. An attempt's first phase inserts
-- the row inside that transaction, so an attempt that rolls back or dies before its first
-- recovery point leaves nothing, and the next attempt simply executes.
--
-- Expired keys are deleted by pgcoord_idempotency_gc, which leaves a tombstone (scope, key,
-- fingerprint, expiry) kept longer, so that a very late retry is refused instead of executed
-- again.

-- +goose Up
CREATE TABLE pgcoord_idempotency_keys (
    scope          text        NOT NULL CHECK (octet_length(scope) BETWEEN 1 AND 255),
    key            text        NOT NULL CHECK (octet_length(key) BETWEEN 1 AND 255),
    fingerprint    bytea       NOT NULL CHECK (octet_length(fingerprint) <= 64),
    state          text        NOT NULL CHECK (state IN ('in_flight', 'completed')),
    -- The attempt that holds (or last held) the key.
    holder         text        NOT NULL,
    attempts       integer     NOT NULL DEFAULT 1,
    -- The last recovery point an attempt recorded, and its data.
    recovery_point text,
    recovery_data  bytea,
    -- The stored response, once completed.
    status         integer,
    headers        jsonb,
    body           bytea,
    created_at     timestamptz NOT NULL,
    updated_at     timestamptz NOT NULL,
    completed_at   timestamptz,
    expires_at     timestamptz NOT NULL,
    PRIMARY KEY (scope, key),
    CHECK ((state = 'completed') = (status IS NOT NULL))
);

-- No index involves state, so completing a key (an UPDATE of the row its attempt inserted)
-- can be a HOT update: it adds no index entries.
CREATE INDEX pgcoord_idempotency_keys_expires ON pgcoord_idempotency_keys (expires_at);

COMMENT ON TABLE pgcoord_idempotency_keys IS 'pgcoord: idempotency keys: request fingerprint, state, recovery point, stored response';

-- What is left of a key after GC: enough to refuse a very late retry.
CREATE TABLE pgcoord_idempotency_tombstones (
    scope       text        NOT NULL,
    key         text        NOT NULL,
    fingerprint bytea       NOT NULL,
    expires_at  timestamptz NOT NULL,
    PRIMARY KEY (scope, key)
);

CREATE INDEX pgcoord_idempotency_tombstones_expires ON pgcoord_idempotency_tombstones (expires_at);

COMMENT ON TABLE pgcoord_idempotency_tombstones IS 'pgcoord: keys removed by GC, kept so that a late retry is refused';

-- pgcoord_idempotency_lock_key is the advisory-lock key an attempt holds on (scope, key).
-- The scope is length-prefixed so that no two (scope, key) pairs share a name.
CREATE FUNCTION pgcoord_idempotency_lock_key(p_scope text, p_key text) RETURNS bigint
    LANGUAGE sql STABLE STRICT PARALLEL SAFE
    AS $$ SELECT pgcoord_lock_key('idempotency:' || octet_length(p_scope) || ':' || p_scope || p_key) $$;

-- pgcoord_idempotency_held tells whether a live attempt holds (scope, key): whether its
-- advisory lock is granted to some session of this database. A pure read of pg_locks: it
-- takes no lock, so operators can call it freely.
CREATE FUNCTION pgcoord_idempotency_held(p_scope text, p_key text) RETURNS boolean
    LANGUAGE sql STABLE STRICT
    AS $$
    SELECT EXISTS (
        SELECT FROM pg_locks l
         WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
           AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
           AND l.classid = ((pgcoord_idempotency_lock_key(p_scope, p_key) >> 32) & 4294967295)::oid
           AND l.objid = (pgcoord_idempotency_lock_key(p_scope, p_key) & 4294967295)::oid)
    $$;

-- pgcoord_idempotency_lookup returns the committed state of (scope, key): its row, or, for a
-- key removed by GC whose tombstone has not expired, a row with state 'expired' carrying the
-- tombstone's fingerprint and expiry; no row for an unknown key. It locks nothing. (A plain
-- SQL function: the planner inlines it, so a replay's lookup costs what the bare SELECT does.
-- The LIMIT stops the Append at the key's row: the tombstones are read only for a key that
-- is not there.)
CREATE FUNCTION pgcoord_idempotency_lookup(p_scope text, p_key text)
RETURNS SETOF pgcoord_idempotency_keys LANGUAGE sql STABLE AS $$
    (SELECT * FROM pgcoord_idempotency_keys WHERE scope = p_scope AND key = p_key)
    UNION ALL
    (SELECT t.scope, t.key, t.fingerprint, 'expired'::text, ''::text, 0, NULL::text, NULL::bytea,
            NULL::integer, NULL::jsonb, NULL::bytea, t.expires_at, t.expires_at, NULL::timestamptz, t.expires_at
       FROM pgcoord_idempotency_tombstones t
      WHERE t.scope = p_scope AND t.key = p_key AND t.expires_at > pgcoord_now())
    LIMIT 1
$$;

-- pgcoord_idempotency_begin starts an attempt of (scope, key) for p_holder. Call it in the
-- transaction that will hold the key while the attempt runs, and keep that transaction open
-- until the attempt completes (pgcoord_idempotency_complete, then COMMIT) or gives up
-- (ROLLBACK). It returns the key's row:
--
--   - state in_flight with holder = p_holder: the caller holds the key. attempts = 1 and no
--     recovery point for a new key; a key whose previous holder died is taken over, with
--     attempts + 1 and the last recovery point that holder recorded.
--   - state completed: the stored response (the caller compares fingerprints: replay, or
--     refuse a different request).
--   - state expired: a tombstone (see pgcoord_idempotency_lookup): refuse.
--   - state in_flight with another holder: a live attempt holds the key, or the fingerprint
--     differs from that of the dead holder's request.
--   - no row: a live attempt holds the key and has not committed its first phase.
--
-- With p_wait NULL it never waits. Otherwise (at most 1 hour) it waits up to p_wait for
-- the holder to finish (then returns what it left: completed, or the key to execute
-- again), and fails with SQLSTATE 55P03 (lock_not_available) when p_wait passes. Scope,
-- key and holder are 1 to 255 bytes, the fingerprint 1 to 64 bytes, the retention positive
-- and at most 36,500 days (else 22004 or 22023).
-- +goose StatementBegin
CREATE FUNCTION pgcoord_idempotency_begin(
    p_scope text, p_key text, p_fingerprint bytea, p_holder text, p_retention interval,
    p_wait interval DEFAULT NULL
) RETURNS SETOF pgcoord_idempotency_keys LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := pgcoord_now();
    v_lock bigint := pgcoord_idempotency_lock_key(p_scope, p_key);
    v_timeout text;
    r pgcoord_idempotency_keys;
BEGIN
    IF NOT (pgcoord_name_ok(p_scope) AND pgcoord_name_ok(p_key) AND pgcoord_name_ok(p_holder)) THEN
        PERFORM pgcoord_idempotency_args(p_scope, p_key, p_holder);
    END IF;
    IF p_fingerprint IS NULL OR octet_length(p_fingerprint) NOT BETWEEN 1 AND 64 THEN
        PERFORM pgcoord_refuse('idempotency fingerprint', '1 to 64 bytes', octet_length(p_fingerprint) || ' bytes');
    END IF;
    IF p_retention IS NULL OR p_retention <= interval '0' OR p_retention > interval '36500 days' THEN
        PERFORM pgcoord_refuse('idempotency retention', 'positive and at most 36500 days', p_retention::text);
    END IF;
    IF p_wait <= interval '0' OR p_wait > interval '1 hour' THEN
        PERFORM pgcoord_refuse('idempotency wait', 'positive and at most 1 hour, or NULL', p_wait::text);
    END IF;
    IF p_wait IS NULL THEN
        IF NOT pg_try_advisory_xact_lock(v_lock) THEN
            RETURN QUERY SELECT * FROM pgcoord_idempotency_lookup(p_scope, p_key);
            RETURN;
        END IF;
    ELSE
        v_timeout := current_setting('lock_timeout');
        PERFORM set_config('lock_timeout', greatest(1, (extract(epoch FROM p_wait) * 1000)::bigint) || 'ms', true);
        PERFORM pg_advisory_xact_lock(v_lock);
        PERFORM set_config('lock_timeout', v_timeout, true);
    END IF;
    -- The caller holds the lock: no live attempt has the key, and what is committed is final.
    SELECT * INTO r FROM pgcoord_idempotency_lookup(p_scope, p_key);
    IF NOT FOUND THEN
        INSERT INTO pgcoord_idempotency_keys
               (scope, key, fingerprint, state, holder, created_at, updated_at, expires_at)
        VALUES (p_scope, p_key, p_fingerprint, 'in_flight', p_holder, v_now, v_now, v_now + p_retention)
        RETURNING * INTO r;
    ELSIF r.state = 'in_flight' AND r.fingerprint = p_fingerprint THEN
        -- Its holder died (the lock was free): take the key over, from its recovery point.
        UPDATE pgcoord_idempotency_keys
           SET holder = p_holder, attempts = attempts + 1, updated_at = v_now
         WHERE scope = p_scope AND key = p_key
        RETURNING * INTO r;
    END IF;
    RETURN NEXT r;
END
$$;
-- +goose StatementEnd

-- pgcoord_idempotency_args refuses a scope, key or holder that is not 1 to 255 bytes.
-- +goose StatementBegin
CREATE FUNCTION pgcoord_idempotency_args(p_scope text, p_key text, p_holder text)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF NOT pgcoord_name_ok(p_scope) THEN
        PERFORM pgcoord_refuse_name('idempotency scope', p_scope);
    END IF;
    IF NOT pgcoord_name_ok(p_key) THEN
        PERFORM pgcoord_refuse_name('idempotency key', p_key);
    END IF;
    IF NOT pgcoord_name_ok(p_holder) THEN
        PERFORM pgcoord_refuse_name('idempotency holder', p_holder);
    END IF;
END
$$;
-- +goose StatementEnd

-- pgcoord_idempotency_checkpoint records a recovery point of the attempt p_holder, in its
-- transaction: COMMIT right after it, so the point (with the writes of the phase it ends)
-- survives the attempt's death, then BEGIN and pgcoord_idempotency_relock to go on holding
-- the key. The point is 1 to 255 bytes, its data at most 1 MiB. Returns the row; fails with
-- SQLSTATE 55000 if p_holder no longer holds the key.
-- +goose StatementBegin
CREATE FUNCTION pgcoord_idempotency_checkpoint(
    p_scope text, p_key text, p_holder text, p_point text, p_data bytea
) RETURNS SETOF pgcoord_idempotency_keys LANGUAGE plpgsql AS $$
DECLARE
    r pgcoord_idempotency_keys;
BEGIN
    IF NOT (pgcoord_name_ok(p_scope) AND pgcoord_name_ok(p_key) AND pgcoord_name_ok(p_holder)) THEN
        PERFORM pgcoord_idempotency_args(p_scope, p_key, p_holder);
    END IF;
    IF NOT pgcoord_name_ok(p_point) THEN
        PERFORM pgcoord_refuse_name('recovery point', p_point);
    END IF;
    IF octet_length(p_data) > 1048576 THEN
        PERFORM pgcoord_refuse('recovery data', 'at most 1048576 bytes', octet_length(p_data) || ' bytes');
    END IF;
    UPDATE pgcoord_idempotency_keys
       SET recovery_point = p_point, recovery_data = p_data, updated_at = pgcoord_now()
     WHERE scope = p_scope AND key = p_key AND holder = p_holder AND state = 'in_flight'
    RETURNING * INTO r;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'pgcoord: idempotency key %/% is no longer held by %', p_scope, p_key, p_holder
            USING ERRCODE = '55000';
    END IF;
    RETURN NEXT r;
END
$$;
-- +goose StatementEnd

-- pgcoord_idempotency_relock takes the key's lock again in the transaction that follows a
-- checkpoint, and tells whether p_holder still holds the key: false if another attempt
-- took it over in between (it found the lock free and the key in flight).
-- +goose StatementBegin
CREATE FUNCTION pgcoord_idempotency_relock(p_scope text, p_key text, p_holder text)
RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    IF NOT (pgcoord_name_ok(p_scope) AND pgcoord_name_ok(p_key) AND pgcoord_name_ok(p_holder)) THEN
        PERFORM pgcoord_idempotency_args(p_scope, p_key, p_holder);
    END IF;
    RETURN pg_try_advisory_xact_lock(pgcoord_idempotency_lock_key(p_scope, p_key))
       AND EXISTS (SELECT FROM pgcoord_idempotency_keys
                    WHERE scope = p_scope AND key = p_key AND holder = p_holder AND state = 'in_flight');
END
$$;
-- +goose StatementEnd

-- pgcoord_idempotency_complete stores the response of the attempt p_holder, in its
-- transaction (COMMIT right after it): a status of 100 to 999, headers a JSON object (or
-- NULL) of at most 65536 bytes as text (octet_length(p_headers::text)), a body of at most
-- 16 MiB (or NULL). Returns the completed row;
-- fails with SQLSTATE 55000 if p_holder no longer holds the key, which aborts the
-- transaction: nothing is half-stored.
-- +goose StatementBegin
CREATE FUNCTION pgcoord_idempotency_complete(
    p_scope text, p_key text, p_holder text, p_status integer, p_headers jsonb, p_body bytea
) RETURNS SETOF pgcoord_idempotency_keys LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := pgcoord_now();
    r pgcoord_idempotency_keys;
BEGIN
    IF NOT (pgcoord_name_ok(p_scope) AND pgcoord_name_ok(p_key) AND pgcoord_name_ok(p_holder)) THEN
        PERFORM pgcoord_idempotency_args(p_scope, p_key, p_holder);
    END IF;
    IF p_status IS NULL OR p_status NOT BETWEEN 100 AND 999 THEN
        PERFORM pgcoord_refuse('response status', 'between 100 and 999', p_status::text);
    END IF;
    -- Measured as text, as PostgreSQL prints it (package idempotency computes the same
    -- length before sending, so that Go refuses what this would).
    IF jsonb_typeof(p_headers) <> 'object' OR octet_length(p_headers::text) > 65536 THEN
        PERFORM pgcoord_refuse('response headers', 'a JSON object of at most 65536 bytes as text, or NULL',
                               jsonb_typeof(p_headers) || ' of ' || octet_length(p_headers::text) || ' bytes');
    END IF;
    IF octet_length(p_body) > 16777216 THEN
        PERFORM pgcoord_refuse('response body', 'at most 16777216 bytes', octet_length(p_body) || ' bytes');
    END IF;
    UPDATE pgcoord_idempotency_keys
       SET state = 'completed', status = p_status, headers = p_headers, body = p_body,
           recovery_data = NULL, completed_at = v_now, updated_at = v_now
     WHERE scope = p_scope AND key = p_key AND holder = p_holder AND state = 'in_flight'
    RETURNING * INTO r;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'pgcoord: idempotency key %/% is no longer held by %', p_scope, p_key, p_holder
            USING ERRCODE = '55000';
    END IF;
    RETURN NEXT r;
END
$$;
-- +goose StatementEnd

-- pgcoord_idempotency_gc deletes up to p_batch (1 to 100,000) keys whose retention has
-- passed, leaving a tombstone for each that expires p_tombstone (0 to 36,500 days) after the
-- deletion, and up to p_batch expired tombstones. Returns the number of keys deleted; a key
-- held by a live attempt is skipped.
-- +goose StatementBegin
CREATE FUNCTION pgcoord_idempotency_gc(p_batch integer, p_tombstone interval)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := pgcoord_now();
    v_deleted bigint;
BEGIN
    IF p_batch IS NULL OR p_batch NOT BETWEEN 1 AND 100000 THEN
        PERFORM pgcoord_refuse('gc batch', 'between 1 and 100000', p_batch::text);
    END IF;
    IF p_tombstone IS NULL OR p_tombstone < interval '0' OR p_tombstone > interval '36500 days' THEN
        PERFORM pgcoord_refuse('tombstone retention', 'between 0 and 36500 days', p_tombstone::text);
    END IF;
    WITH gone AS (
        DELETE FROM pgcoord_idempotency_keys k
         WHERE k.ctid = ANY (ARRAY(
                SELECT c.ctid FROM pgcoord_idempotency_keys c
                 WHERE c.expires_at <= v_now
                 LIMIT p_batch FOR UPDATE SKIP LOCKED))
           AND k.expires_at <= v_now
           AND pg_try_advisory_xact_lock(pgcoord_idempotency_lock_key(k.scope, k.key))
        RETURNING k.scope, k.key, k.fingerprint
    ), kept AS (
        INSERT INTO pgcoord_idempotency_tombstones AS t (scope, key, fingerprint, expires_at)
        SELECT scope, key, fingerprint, v_now + p_tombstone FROM gone
        ON CONFLICT (scope, key) DO UPDATE SET fingerprint = excluded.fingerprint, expires_at = excluded.expires_at
        RETURNING 1
    )
    SELECT count(*) INTO v_deleted FROM kept;
    DELETE FROM pgcoord_idempotency_tombstones t
     WHERE t.ctid = ANY (ARRAY(
            SELECT c.ctid FROM pgcoord_idempotency_tombstones c
             WHERE c.expires_at <= v_now LIMIT p_batch FOR UPDATE SKIP LOCKED))
       AND t.expires_at <= v_now;
    RETURN v_deleted;
END
$$;
-- +goose StatementEnd

-- +goose Down
DROP FUNCTION pgcoord_idempotency_gc(integer, interval);
DROP FUNCTION pgcoord_idempotency_complete(text, text, text, integer, jsonb, bytea);
DROP FUNCTION pgcoord_idempotency_relock(text, text, text);
DROP FUNCTION pgcoord_idempotency_checkpoint(text, text, text, text, bytea);
DROP FUNCTION pgcoord_idempotency_args(text, text, text);
DROP FUNCTION pgcoord_idempotency_begin(text, text, bytea, text, interval, interval);
DROP FUNCTION pgcoord_idempotency_lookup(text, text);
DROP FUNCTION pgcoord_idempotency_held(text, text);
DROP FUNCTION pgcoord_idempotency_lock_key(text, text);
DROP TABLE pgcoord_idempotency_tombstones;
DROP TABLE pgcoord_idempotency_keys;
