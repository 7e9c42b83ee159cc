-- A batch of messages locks its keys' order rows in one statement, not one call per key.
--
-- Writers of one (topic, key) take turns on its row of pgcoord_outbox_keys, created if
-- missing, held until they commit (00010_no_stranger_locks.sql). pgcoord_outbox_insert, the
-- batch write (EnqueueBatch, pgcoord_outbox_enqueue_many), called pgcoord_outbox_lock once
-- per distinct key: a PL/pgSQL call with a pinned search_path, whose SELECT ... FOR UPDATE,
-- INSERT ... ON CONFLICT DO NOTHING and SELECT ... FOR UPDATE again took the row. One
-- statement for them all takes a quarter less time for 100 messages of 100 keys
-- (docs/benchmarks.md).
--
-- Now both take the row with one INSERT ... ON CONFLICT DO UPDATE ... WHERE false, which
-- inserts a missing row and locks an existing one (an ON CONFLICT DO UPDATE locks every
-- conflicting row, updated or not, in the mode of an UPDATE of the key: FOR UPDATE, as
-- before). The batch takes all of its keys in one such statement, in (topic, key) order as
-- before, so two batches still never deadlock on each other. A row that pgcoord_gc deletes
-- while the statement waits for it is inserted again (the ON CONFLICT checks again). In
-- REPEATABLE READ or SERIALIZABLE the statement fails with 40001 when another transaction
-- created the key's row after the snapshot, as before; a row deleted meanwhile no longer
-- fails it (SELECT ... FOR UPDATE did).
--
-- pgcoord_outbox_lock is a plain PL/pgSQL function now, unpinned: its search_path was
-- pinned with the other functions 00010 replaced, and pgcoord's rule (00012, checked by
-- TestFunctionSearchPaths) pins only triggers and SECURITY DEFINER functions; a pinned
-- search_path is set and reset around every call.

-- +goose Up
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pgcoord_outbox_lock(p_topic text, p_key text) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting(pgcoord_outbox_wake_flag(), true) IS DISTINCT FROM 'on' THEN
        PERFORM pgcoord_outbox_wake();
    END IF;
    INSERT INTO pgcoord_outbox_keys AS k (topic, key) VALUES (p_topic, p_key)
        ON CONFLICT (topic, key) DO UPDATE SET key = excluded.key WHERE false;
    RETURN true;
END
$$;
-- +goose StatementEnd
ALTER FUNCTION pgcoord_outbox_lock(text, text) RESET ALL;

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pgcoord_outbox_insert(
    p_topics text[], p_keys text[], p_payloads bytea[], p_is_json boolean[], p_headers jsonb[], p_delays interval[]
) RETURNS SETOF pgcoord_outbox LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pgcoord_outbox_wake(); -- an empty batch too
    INSERT INTO pgcoord_outbox_keys AS k (topic, key)
    SELECT DISTINCT m.topic, m.key FROM unnest(p_topics, p_keys) AS m(topic, key) ORDER BY 1, 2
        ON CONFLICT (topic, key) DO UPDATE SET key = excluded.key WHERE false;
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

-- +goose Down
-- The functions as 00006 (pgcoord_outbox_insert) and 00010 (pgcoord_outbox_lock) made them.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pgcoord_outbox_insert(
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

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pgcoord_outbox_lock(p_topic text, p_key text) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting(pgcoord_outbox_wake_flag(), true) IS DISTINCT FROM 'on' THEN
        PERFORM pgcoord_outbox_wake();
    END IF;
    PERFORM FROM pgcoord_outbox_keys k WHERE k.topic = p_topic AND k.key = p_key FOR UPDATE;
    IF NOT FOUND THEN
        -- Waits for a concurrent creator of the row to end; then the row is there (or not).
        INSERT INTO pgcoord_outbox_keys (topic, key) VALUES (p_topic, p_key) ON CONFLICT DO NOTHING;
        PERFORM FROM pgcoord_outbox_keys k WHERE k.topic = p_topic AND k.key = p_key FOR UPDATE;
    END IF;
    RETURN true;
END
$$;
-- +goose StatementEnd
-- +goose StatementBegin
DO $body$
BEGIN
    EXECUTE format('ALTER FUNCTION pgcoord_outbox_lock(text, text) SET search_path = %I, pg_temp', current_schema());
END
$body$;
-- +goose StatementEnd
