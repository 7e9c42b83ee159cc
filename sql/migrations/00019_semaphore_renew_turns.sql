-- A renewal no longer races an admission of its key (found by the semaphore test with real
-- processes and kills, through PgBouncer: three permits of a key of limit 2 live at once).
--
-- An admission locks the key's row, judges the permits by its transaction's now, counts the
-- live ones, deletes the expired ones and inserts its own. A renewal locked only its permit's
-- row and judged expiry by the clock. So an admission whose now was just past a permit's
-- expiry could count it expired (its snapshot taken before the renewal committed), wait for
-- the renewal's row lock to delete it, find it renewed (and leave it), and admit one more:
-- one over the limit until the renewed permit ended. A renewal now takes the key's row
-- first (FOR KEY SHARE, which the admission's FOR UPDATE waits for, and which waits for
-- it): the two take turns, and each sees what the other committed. Key rows before permit
-- rows in both, so batches of renewals cannot deadlock with admissions.

-- +goose Up
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pgcoord_semaphore_renew(
    p_key text, p_holder text, p_ttl interval, p_fence_token bigint DEFAULT NULL,
    p_durable boolean DEFAULT true
) RETURNS SETOF pgcoord_semaphore_permits LANGUAGE plpgsql AS $$
BEGIN
    IF NOT (pgcoord_name_ok(p_key) AND pgcoord_name_ok(p_holder)) OR p_fence_token < 1 THEN
        PERFORM pgcoord_semaphore_permit_args(p_key, p_holder, p_fence_token);
    END IF;
    IF NOT pgcoord_ttl_ok(p_ttl) THEN
        PERFORM pgcoord_refuse('permit ttl', 'positive, at most 24 hours and without months', p_ttl::text);
    END IF;
    IF p_durable IS NULL THEN
        PERFORM pgcoord_refuse('p_durable', 'true or false', NULL);
    END IF;
    IF NOT p_durable THEN
        PERFORM set_config('synchronous_commit', 'off', true);
    END IF;
    -- The key's row first, as an admission locks it (FOR UPDATE) before it counts the live
    -- permits: a renewal and an admission of one key take turns.
    PERFORM FROM pgcoord_semaphores WHERE key = p_key FOR KEY SHARE;
    PERFORM FROM pgcoord_semaphore_permits
     WHERE key = p_key AND holder = p_holder FOR NO KEY UPDATE;
    RETURN QUERY
    UPDATE pgcoord_semaphore_permits
       SET expires_at = pgcoord_clock() + p_ttl,
           renewed_at = pgcoord_clock()
     WHERE key = p_key AND holder = p_holder
       AND (p_fence_token IS NULL OR fence_token = p_fence_token)
       AND expires_at > pgcoord_clock()
    RETURNING *;
END
$$;
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pgcoord_semaphore_renew(
    p_key text, p_holder text, p_ttl interval, p_fence_token bigint DEFAULT NULL,
    p_durable boolean DEFAULT true
) RETURNS SETOF pgcoord_semaphore_permits LANGUAGE plpgsql AS $$
BEGIN
    IF NOT (pgcoord_name_ok(p_key) AND pgcoord_name_ok(p_holder)) OR p_fence_token < 1 THEN
        PERFORM pgcoord_semaphore_permit_args(p_key, p_holder, p_fence_token);
    END IF;
    IF NOT pgcoord_ttl_ok(p_ttl) THEN
        PERFORM pgcoord_refuse('permit ttl', 'positive, at most 24 hours and without months', p_ttl::text);
    END IF;
    IF p_durable IS NULL THEN
        PERFORM pgcoord_refuse('p_durable', 'true or false', NULL);
    END IF;
    IF NOT p_durable THEN
        PERFORM set_config('synchronous_commit', 'off', true);
    END IF;
    PERFORM FROM pgcoord_semaphore_permits
     WHERE key = p_key AND holder = p_holder FOR NO KEY UPDATE;
    RETURN QUERY
    UPDATE pgcoord_semaphore_permits
       SET expires_at = pgcoord_clock() + p_ttl,
           renewed_at = pgcoord_clock()
     WHERE key = p_key AND holder = p_holder
       AND (p_fence_token IS NULL OR fence_token = p_fence_token)
       AND expires_at > pgcoord_clock()
    RETURNING *;
END
$$;
-- +goose StatementEnd
