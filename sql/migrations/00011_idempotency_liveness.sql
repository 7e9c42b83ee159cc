-- Idempotency liveness without a held connection, and without advisory locks.
--
-- 00005 kept an attempt alive with a transaction-level advisory lock, in a transaction
-- held open on a connection of the caller's pool while its handler ran. Two faults:
--   - MaxConns requests in flight whose handlers use the same pool wait forever for a
--     connection only a finished request can return;
--   - advisory locks are database-wide and need no grant: any login could read the held
--     keys from pg_locks (or compute them from 00005) and hold them after the attempt
--     ended, so the retry of a failed attempt saw "in flight" forever.
--
-- Now an attempt holds its key with a lease on the key's row, on the database clock:
-- pgcoord_idempotency_claim inserts the row (or takes over one whose lease has lapsed) and
-- commits at once, pgcoord_idempotency_renew extends the lease while the attempt runs (the
-- Go library renews every third of the lease), and complete / release end it. Only a role
-- with grants on pgcoord_idempotency_keys can touch a lease, and no connection is held
-- between those statements. A holder that dies is taken over by the first attempt after
-- its lease lapses: at most one lease after its last renewal.
--
-- pgcoord_idempotency_begin and pgcoord_idempotency_relock (the advisory-lock protocol)
-- are dropped, with pgcoord_idempotency_lock_key: a process of an older version fails
-- ("function does not exist") instead of believing it holds a key it does not.

-- +goose Up
-- When the holder's lease lapses; NULL: no live holder (released), taken over at once.
ALTER TABLE pgcoord_idempotency_keys ADD COLUMN lease_expires_at timestamptz;
-- A key in flight when this migration runs may be held by a process of the older version,
-- still in its handler: it gets a lease of 30 seconds (the default), not none, so that a
-- retry does not run the handler beside it at once.
UPDATE pgcoord_idempotency_keys SET lease_expires_at = pgcoord_now() + interval '30 seconds' WHERE state = 'in_flight';

DROP FUNCTION pgcoord_idempotency_begin(text, text, bytea, text, interval, interval);
DROP FUNCTION pgcoord_idempotency_relock(text, text, text);
DROP FUNCTION pgcoord_idempotency_lock_key(text, text);

-- pgcoord_idempotency_lookup: as in 00005, with the lease column (NULL for a tombstone).
CREATE OR REPLACE FUNCTION pgcoord_idempotency_lookup(p_scope text, p_key text)
RETURNS SETOF pgcoord_idempotency_keys LANGUAGE sql STABLE AS $$
    (SELECT * FROM pgcoord_idempotency_keys WHERE scope = p_scope AND key = p_key)
    UNION ALL
    (SELECT t.scope, t.key, t.fingerprint, 'expired'::text, ''::text, 0, NULL::text, NULL::bytea,
            NULL::integer, NULL::jsonb, NULL::bytea, t.expires_at, t.expires_at, NULL::timestamptz, t.expires_at,
            NULL::timestamptz
       FROM pgcoord_idempotency_tombstones t
      WHERE t.scope = p_scope AND t.key = p_key AND t.expires_at > pgcoord_now())
    LIMIT 1
$$;

-- pgcoord_idempotency_held tells whether a live attempt holds (scope, key): the key is in
-- flight and its holder's lease has not lapsed. A plain read.
CREATE OR REPLACE FUNCTION pgcoord_idempotency_held(p_scope text, p_key text) RETURNS boolean
    LANGUAGE sql STABLE STRICT
    AS $$
    SELECT EXISTS (
        SELECT FROM pgcoord_idempotency_keys
         WHERE scope = p_scope AND key = p_key AND state = 'in_flight'
           AND lease_expires_at > pgcoord_now())
    $$;

-- pgcoord_idempotency_claim starts an attempt of (scope, key) for p_holder and commits
-- with the statement that calls it (call it outside a transaction, or commit right after):
-- the attempt then holds the key for p_lease, by the database clock, without holding a
-- connection. It returns the key's row:
--
--   - state in_flight with holder = p_holder: the caller holds the key until
--     lease_expires_at. attempts = 1 and no recovery point for a new key; a key in flight
--     whose lease has lapsed (its holder died, or gave up after a recovery point) is taken
--     over, with attempts + 1 and the last recovery point recorded.
--   - state completed: the stored response (the caller compares fingerprints: replay, or
--     refuse a different request).
--   - state expired: a tombstone (see pgcoord_idempotency_lookup): refuse.
--   - state in_flight with another holder: a live attempt holds the key, or the
--     fingerprint differs from that of the dead holder's request.
--   - no row: the attempt that held the key released it in the instant of this call: try
--     again.
--
-- It never waits for another attempt (only, briefly, for a concurrent claim of the same
-- key). Keep the lease with pgcoord_idempotency_renew well before it lapses; end the
-- attempt with pgcoord_idempotency_complete or pgcoord_idempotency_release. Scope, key and
-- holder are 1 to 255 bytes, the fingerprint 1 to 64 bytes, the retention positive and at
-- most 36,500 days, the lease positive and at most 1 hour (else 22004 or 22023).
-- +goose StatementBegin
CREATE FUNCTION pgcoord_idempotency_claim(
    p_scope text, p_key text, p_fingerprint bytea, p_holder text, p_retention interval, p_lease interval
) RETURNS SETOF pgcoord_idempotency_keys LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := pgcoord_now();
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
    IF p_lease IS NULL OR p_lease <= interval '0' OR p_lease > interval '1 hour' THEN
        PERFORM pgcoord_refuse('idempotency lease', 'positive and at most 1 hour', p_lease::text);
    END IF;
    SELECT * INTO r FROM pgcoord_idempotency_keys WHERE scope = p_scope AND key = p_key FOR UPDATE;
    IF FOUND THEN
        IF r.state = 'in_flight' AND r.fingerprint = p_fingerprint
           AND (r.lease_expires_at IS NULL OR r.lease_expires_at <= v_now) THEN
            -- No live holder: take the key over, from its recovery point.
            UPDATE pgcoord_idempotency_keys
               SET holder = p_holder, attempts = attempts + 1, updated_at = v_now,
                   lease_expires_at = v_now + p_lease
             WHERE scope = p_scope AND key = p_key
            RETURNING * INTO r;
        END IF;
        RETURN NEXT r;
        RETURN;
    END IF;
    -- No row: a tombstone refuses the key; else insert it (a concurrent claim that
    -- inserted first holds it).
    RETURN QUERY SELECT * FROM pgcoord_idempotency_lookup(p_scope, p_key);
    IF FOUND THEN
        RETURN;
    END IF;
    INSERT INTO pgcoord_idempotency_keys
           (scope, key, fingerprint, state, holder, created_at, updated_at, expires_at, lease_expires_at)
    VALUES (p_scope, p_key, p_fingerprint, 'in_flight', p_holder, v_now, v_now, v_now + p_retention, v_now + p_lease)
    ON CONFLICT (scope, key) DO NOTHING
    RETURNING * INTO r;
    IF FOUND THEN
        RETURN NEXT r;
        RETURN;
    END IF;
    RETURN QUERY SELECT * FROM pgcoord_idempotency_lookup(p_scope, p_key);
END
$$;
-- +goose StatementEnd

-- pgcoord_idempotency_renew extends the lease of the attempt p_holder to p_lease (positive,
-- at most 1 hour) from now, by the database clock. Returns false if p_holder no longer
-- holds the key (another attempt took it over after the lease lapsed, or the key is
-- completed): stop the work.
-- +goose StatementBegin
CREATE FUNCTION pgcoord_idempotency_renew(p_scope text, p_key text, p_holder text, p_lease interval)
RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    IF NOT (pgcoord_name_ok(p_scope) AND pgcoord_name_ok(p_key) AND pgcoord_name_ok(p_holder)) THEN
        PERFORM pgcoord_idempotency_args(p_scope, p_key, p_holder);
    END IF;
    IF p_lease IS NULL OR p_lease <= interval '0' OR p_lease > interval '1 hour' THEN
        PERFORM pgcoord_refuse('idempotency lease', 'positive and at most 1 hour', p_lease::text);
    END IF;
    UPDATE pgcoord_idempotency_keys
       SET lease_expires_at = pgcoord_now() + p_lease
     WHERE scope = p_scope AND key = p_key AND holder = p_holder AND state = 'in_flight';
    RETURN FOUND;
END
$$;
-- +goose StatementEnd

-- pgcoord_idempotency_release gives up the attempt p_holder: a key with no recovery point
-- is deleted (the next attempt is a first attempt), one with a recovery point is left in
-- flight with no lease (the next attempt takes it over at once, from that point). Returns
-- false, changing nothing, if p_holder does not hold the key.
-- +goose StatementBegin
CREATE FUNCTION pgcoord_idempotency_release(p_scope text, p_key text, p_holder text)
RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    IF NOT (pgcoord_name_ok(p_scope) AND pgcoord_name_ok(p_key) AND pgcoord_name_ok(p_holder)) THEN
        PERFORM pgcoord_idempotency_args(p_scope, p_key, p_holder);
    END IF;
    DELETE FROM pgcoord_idempotency_keys
     WHERE scope = p_scope AND key = p_key AND holder = p_holder AND state = 'in_flight'
       AND recovery_point IS NULL;
    IF FOUND THEN
        RETURN true;
    END IF;
    UPDATE pgcoord_idempotency_keys
       SET lease_expires_at = NULL
     WHERE scope = p_scope AND key = p_key AND holder = p_holder AND state = 'in_flight';
    RETURN FOUND;
END
$$;
-- +goose StatementEnd

-- pgcoord_idempotency_gc: as in 00005, but a key is held when its lease has not lapsed.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pgcoord_idempotency_gc(p_batch integer, p_tombstone interval)
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
                   AND NOT (c.state = 'in_flight' AND c.lease_expires_at > v_now)
                 LIMIT p_batch FOR UPDATE SKIP LOCKED))
           AND k.expires_at <= v_now
           AND NOT (k.state = 'in_flight' AND k.lease_expires_at > v_now)
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

-- The functions this migration creates or replaces resolve names in pgcoord's schema, then
-- pg_temp, whatever the caller's search_path.
-- +goose StatementBegin
DO $body$
DECLARE
    f text;
BEGIN
    FOREACH f IN ARRAY ARRAY[
        'pgcoord_idempotency_lookup(text, text)',
        'pgcoord_idempotency_held(text, text)',
        'pgcoord_idempotency_claim(text, text, bytea, text, interval, interval)',
        'pgcoord_idempotency_renew(text, text, text, interval)',
        'pgcoord_idempotency_release(text, text, text)',
        'pgcoord_idempotency_gc(integer, interval)'
    ] LOOP
        EXECUTE format('ALTER FUNCTION %s SET search_path = %I, pg_temp', f, current_schema());
    END LOOP;
END
$body$;
-- +goose StatementEnd

-- +goose Down
DROP FUNCTION pgcoord_idempotency_release(text, text, text);
DROP FUNCTION pgcoord_idempotency_renew(text, text, text, interval);
DROP FUNCTION pgcoord_idempotency_claim(text, text, bytea, text, interval, interval);
ALTER TABLE pgcoord_idempotency_keys DROP COLUMN lease_expires_at;

CREATE OR REPLACE FUNCTION pgcoord_idempotency_lookup(p_scope text, p_key text)
RETURNS SETOF pgcoord_idempotency_keys LANGUAGE sql STABLE AS $$
    (SELECT * FROM pgcoord_idempotency_keys WHERE scope = p_scope AND key = p_key)
    UNION ALL
    (SELECT t.scope, t.key, t.fingerprint, 'expired'::text, ''::text, 0, NULL::text, NULL::bytea,
            NULL::integer, NULL::jsonb, NULL::bytea, t.expires_at, t.expires_at, NULL::timestamptz, t.expires_at
       FROM pgcoord_idempotency_tombstones t
      WHERE t.scope = p_scope AND t.key = p_key AND t.expires_at > pgcoord_now())
    LIMIT 1
$$;

CREATE FUNCTION pgcoord_idempotency_lock_key(p_scope text, p_key text) RETURNS bigint
    LANGUAGE sql STABLE STRICT PARALLEL SAFE
    AS $$ SELECT pgcoord_lock_key('idempotency:' || octet_length(p_scope) || ':' || p_scope || p_key) $$;

CREATE OR REPLACE FUNCTION pgcoord_idempotency_held(p_scope text, p_key text) RETURNS boolean
    LANGUAGE sql STABLE STRICT
    AS $$
    SELECT EXISTS (
        SELECT FROM pg_locks l
         WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
           AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
           AND l.classid = ((pgcoord_idempotency_lock_key(p_scope, p_key) >> 32) & 4294967295)::oid
           AND l.objid = (pgcoord_idempotency_lock_key(p_scope, p_key) & 4294967295)::oid)
    $$;

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
    SELECT * INTO r FROM pgcoord_idempotency_lookup(p_scope, p_key);
    IF NOT FOUND THEN
        INSERT INTO pgcoord_idempotency_keys
               (scope, key, fingerprint, state, holder, created_at, updated_at, expires_at)
        VALUES (p_scope, p_key, p_fingerprint, 'in_flight', p_holder, v_now, v_now, v_now + p_retention)
        RETURNING * INTO r;
    ELSIF r.state = 'in_flight' AND r.fingerprint = p_fingerprint THEN
        UPDATE pgcoord_idempotency_keys
           SET holder = p_holder, attempts = attempts + 1, updated_at = v_now
         WHERE scope = p_scope AND key = p_key
        RETURNING * INTO r;
    END IF;
    RETURN NEXT r;
END
$$;
-- +goose StatementEnd

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

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pgcoord_idempotency_gc(p_batch integer, p_tombstone interval)
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
