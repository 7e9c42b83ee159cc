-- Leases with fencing tokens, and the fence register.
--
-- One row per lease name, kept forever: fence_token counts the grants of that name, so a
-- token is never issued twice — not after release, expiry, operator expiry, a restart or
-- crash recovery (the table is logged, the counter lives in the row, and rows cannot be
-- deleted or truncated), nor after a failover (new tokens exceed pgcoord_token_floor()).
-- Expiry is judged by the database clock only; every function takes an optional p_now so
-- tests can judge at another instant instead of sleeping.

-- +goose Up
CREATE TABLE pgcoord_leases (
    name         text        PRIMARY KEY CHECK (octet_length(name) BETWEEN 1 AND 255),
    fence_token  bigint      NOT NULL CHECK (fence_token > 0),
    holder       text        CHECK (octet_length(holder) BETWEEN 1 AND 255),
    metadata     jsonb       NOT NULL DEFAULT '{}',
    acquired_at  timestamptz NOT NULL,
    renewed_at   timestamptz,
    expires_at   timestamptz,
    released_at  timestamptz,
    -- Set when an operator forced the lease to expire (pgcoord leases expire).
    expired_by   text,
    -- Until when a blocked acquirer waits for this lease: a release notifies only while
    -- someone waits, because NOTIFY serializes committing transactions database-wide.
    wanted_until timestamptz,
    -- Counters for operators, kept across grants. A near miss is a renewal that arrived
    -- with less than a quarter of its grant's time left, by the database clock: a holder
    -- that paused, or a database that answered slowly, came close to losing the lease
    -- (and its work to a second holder). Forced expiries count pgcoord_lease_expire.
    near_misses      bigint      NOT NULL DEFAULT 0,
    last_near_miss_at timestamptz,
    forced_expiries  bigint      NOT NULL DEFAULT 0,
    CHECK ((holder IS NULL) = (expires_at IS NULL))
);

COMMENT ON TABLE pgcoord_leases IS
    'pgcoord: one row per lease name, kept so fence tokens never repeat; a free lease has holder NULL';

-- pgcoord_keep_rows refuses DELETE and TRUNCATE on tables whose rows carry fence tokens: a
-- deleted row would forget its highest token, and tokens would repeat.
-- +goose StatementBegin
CREATE FUNCTION pgcoord_keep_rows() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'pgcoord: rows of % are never deleted, so that fence tokens never repeat', TG_TABLE_NAME
        USING HINT = 'Free what a row holds instead: pgcoord leases expire, pgcoord semaphores drain.';
END
$$;
-- +goose StatementEnd

CREATE TRIGGER pgcoord_keep_rows BEFORE DELETE ON pgcoord_leases
    FOR EACH ROW EXECUTE FUNCTION pgcoord_keep_rows();
CREATE TRIGGER pgcoord_keep_rows_truncate BEFORE TRUNCATE ON pgcoord_leases
    FOR EACH STATEMENT EXECUTE FUNCTION pgcoord_keep_rows();

-- pgcoord_channel(topic) is the NOTIFY channel pgcoord uses for topic ('leases', ...),
-- namespaced by the install schema like pgcoord_lock_key, and short enough for any schema.
CREATE FUNCTION pgcoord_channel(topic text) RETURNS text
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    AS $$ SELECT 'pgcoord_' || lpad(to_hex(pgcoord_lock_key('channel:' || topic)), 16, '0') $$;

-- pgcoord_lease_acquire grants the lease to p_holder if it is free or expired, with a new
-- fence token, and returns the granted row. If p_holder already holds it (an earlier
-- attempt committed but its reply was lost) it returns that grant unchanged. Otherwise it
-- returns no row, and it has written nothing, locked nothing and waited for nothing.
-- A new token is above pgcoord_token_floor(), so it survives a failover; p_sync_commit, if
-- not NULL, is the synchronous_commit level of the caller's transaction (e.g. 'on' to wait
-- for a synchronous standby when the server runs with 'local'). On a standby it raises 25006.
-- +goose StatementBegin
CREATE FUNCTION pgcoord_lease_acquire(
    p_name text, p_holder text, p_ttl interval,
    p_metadata jsonb DEFAULT '{}', p_now timestamptz DEFAULT NULL, p_sync_commit text DEFAULT NULL
) RETURNS SETOF pgcoord_leases LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := coalesce(p_now, now());
    v_floor bigint := pgcoord_token_floor();
    r pgcoord_leases;
BEGIN
    IF p_ttl IS NULL OR p_ttl <= interval '0' THEN
        RAISE EXCEPTION 'pgcoord: lease ttl must be positive, got %', p_ttl USING ERRCODE = '22023';
    END IF;
    IF p_sync_commit IS NOT NULL THEN
        PERFORM set_config('synchronous_commit', p_sync_commit, true);
    END IF;
    -- Take a free or expired lease. A row whose latest committed version is held and
    -- unexpired fails the WHERE clause before it is locked: a refusal writes nothing,
    -- locks nothing and waits for no transaction, not even one of the holder's that is
    -- renewing or committing.
    UPDATE pgcoord_leases
       SET fence_token = greatest(fence_token + 1, v_floor), holder = p_holder, metadata = coalesce(p_metadata, '{}'),
           acquired_at = v_now, renewed_at = NULL, expires_at = v_now + p_ttl,
           released_at = NULL, expired_by = NULL
     WHERE name = p_name AND (holder IS NULL OR expires_at <= v_now)
    RETURNING * INTO r;
    IF FOUND THEN
        RETURN NEXT r;
        RETURN;
    END IF;
    SELECT * INTO r FROM pgcoord_leases WHERE name = p_name;
    IF FOUND THEN
        IF r.holder = p_holder AND r.expires_at > v_now THEN
            RETURN NEXT r; -- our own live grant, from an attempt whose reply was lost
        END IF;
        RETURN;
    END IF;
    -- First grant of this name.
    INSERT INTO pgcoord_leases (name, fence_token, holder, metadata, acquired_at, expires_at)
    VALUES (p_name, greatest(1, v_floor), p_holder, coalesce(p_metadata, '{}'), v_now, v_now + p_ttl)
    ON CONFLICT (name) DO NOTHING
    RETURNING * INTO r;
    IF FOUND THEN
        RETURN NEXT r;
    END IF;
END
$$;
-- +goose StatementEnd

-- pgcoord_lease_wait is pgcoord_lease_acquire for a caller that will wait: if the lease is
-- not granted, it records that someone waits for it until p_now + p_want (so its release
-- sends a notification on pgcoord_channel('leases')) and returns the current holder's row,
-- whose expires_at tells the caller when to try again. Granted iff the returned row's holder
-- is p_holder. Listen on the channel before calling it, so no release is missed. The wait
-- registration commits without waiting for the WAL flush: losing it only delays a wake-up.
-- p_sync_commit applies to a grant as in pgcoord_lease_acquire.
-- +goose StatementBegin
CREATE FUNCTION pgcoord_lease_wait(
    p_name text, p_holder text, p_ttl interval, p_want interval,
    p_metadata jsonb DEFAULT '{}', p_now timestamptz DEFAULT NULL, p_sync_commit text DEFAULT NULL
) RETURNS SETOF pgcoord_leases LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := coalesce(p_now, now());
    r pgcoord_leases;
BEGIN
    IF p_want IS NULL OR p_want <= interval '0' THEN
        RAISE EXCEPTION 'pgcoord: wait interval must be positive, got %', p_want USING ERRCODE = '22023';
    END IF;
    -- Two rounds: the lease may be released between a failed attempt and the registration,
    -- in which case the registration matches nothing and the second attempt takes it.
    FOR i IN 1..2 LOOP
        SELECT * INTO r FROM pgcoord_lease_acquire(p_name, p_holder, p_ttl, p_metadata, p_now, p_sync_commit);
        IF FOUND THEN
            RETURN NEXT r;
            RETURN;
        END IF;
        -- Register the wait, unless a registration that lasts long enough is there already:
        -- many waiters woken together should not each rewrite the row.
        SELECT * INTO r FROM pgcoord_leases
         WHERE name = p_name AND holder IS NOT NULL AND expires_at > v_now
           AND wanted_until >= v_now + p_want / 2;
        IF FOUND THEN
            RETURN NEXT r;
            RETURN;
        END IF;
        UPDATE pgcoord_leases
           SET wanted_until = greatest(wanted_until, v_now + p_want)
         WHERE name = p_name AND holder IS NOT NULL AND expires_at > v_now
        RETURNING * INTO r;
        IF FOUND THEN
            PERFORM set_config('synchronous_commit', 'off', true);
            RETURN NEXT r;
            RETURN;
        END IF;
    END LOOP;
END
$$;
-- +goose StatementEnd

-- pgcoord_lease_renew extends one grant (name + holder + token) to p_now + p_ttl and returns
-- it; no row if that grant is no longer current (released, expired, taken over). With
-- p_durable false the renewal commits without waiting for the WAL flush: losing it in a
-- crash only shortens the lease. Never pass false inside a transaction that has other writes.
-- Expiry is judged by clock_timestamp(), not the transaction's start: a renewal that waited
-- on a lock past the grant's expiry must not revive it. A renewal that finds less than a
-- quarter of the grant left counts as a near miss.
-- +goose StatementBegin
CREATE FUNCTION pgcoord_lease_renew(
    p_name text, p_holder text, p_fence_token bigint, p_ttl interval,
    p_durable boolean DEFAULT true, p_now timestamptz DEFAULT NULL
) RETURNS SETOF pgcoord_leases LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz;
BEGIN
    IF p_ttl IS NULL OR p_ttl <= interval '0' THEN
        RAISE EXCEPTION 'pgcoord: lease ttl must be positive, got %', p_ttl USING ERRCODE = '22023';
    END IF;
    IF NOT p_durable THEN
        PERFORM set_config('synchronous_commit', 'off', true);
    END IF;
    -- Lock the row first, then judge expiry by clock_timestamp(): a renewal that waited
    -- for the lock (held by a fenced write's pgcoord_lease_check, say) until after the
    -- grant expired must fail, not revive it.
    PERFORM FROM pgcoord_leases
     WHERE name = p_name AND holder = p_holder AND fence_token = p_fence_token
       FOR NO KEY UPDATE;
    v_now := coalesce(p_now, clock_timestamp());
    RETURN QUERY
    UPDATE pgcoord_leases
       SET expires_at = v_now + p_ttl,
           renewed_at = v_now,
           -- A near miss: less than a quarter of the grant being renewed was left (the
           -- right-hand sides read the row as it was).
           near_misses = near_misses + (expires_at - v_now < (expires_at - coalesce(renewed_at, acquired_at)) / 4)::int,
           last_near_miss_at = CASE WHEN expires_at - v_now < (expires_at - coalesce(renewed_at, acquired_at)) / 4
                                    THEN v_now ELSE last_near_miss_at END
     WHERE name = p_name AND holder = p_holder AND fence_token = p_fence_token
       AND expires_at > v_now
    RETURNING *;
END
$$;
-- +goose StatementEnd

-- pgcoord_lease_release frees one grant (name + holder + token) and returns the freed row;
-- no row if that grant is no longer current, in which case nothing changed. Waiters
-- registered by pgcoord_lease_wait are woken by a notification on
-- pgcoord_channel('leases') carrying the lease name.
-- +goose StatementBegin
CREATE FUNCTION pgcoord_lease_release(
    p_name text, p_holder text, p_fence_token bigint, p_now timestamptz DEFAULT NULL
) RETURNS SETOF pgcoord_leases LANGUAGE plpgsql AS $$
DECLARE
    r pgcoord_leases;
BEGIN
    UPDATE pgcoord_leases
       SET holder = NULL, expires_at = NULL, released_at = coalesce(p_now, now())
     WHERE name = p_name AND holder = p_holder AND fence_token = p_fence_token
    RETURNING * INTO r;
    IF FOUND THEN
        IF r.wanted_until > coalesce(p_now, now()) THEN
            PERFORM pg_notify(pgcoord_channel('leases'), p_name);
        END IF;
        RETURN NEXT r;
    END IF;
END
$$;
-- +goose StatementEnd

-- pgcoord_lease_expire is the operator's forced expiry: the lease becomes free at once, its
-- holder's renewals, releases and in-database checks fail, and the next grant gets a higher
-- token. Returns the row as it was before, or nothing if the lease was not held.
-- +goose StatementBegin
CREATE FUNCTION pgcoord_lease_expire(p_name text, p_by text, p_now timestamptz DEFAULT NULL)
RETURNS SETOF pgcoord_leases LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := coalesce(p_now, now());
    r pgcoord_leases;
BEGIN
    SELECT * INTO r FROM pgcoord_leases WHERE name = p_name AND holder IS NOT NULL FOR UPDATE;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    UPDATE pgcoord_leases
       SET holder = NULL, expires_at = NULL, released_at = v_now, expired_by = coalesce(p_by, 'operator'),
           forced_expiries = forced_expiries + 1
     WHERE name = p_name;
    PERFORM pg_notify(pgcoord_channel('leases'), p_name);
    RETURN NEXT r;
END
$$;
-- +goose StatementEnd

-- pgcoord_lease_check verifies, inside the caller's transaction, that one grant is still
-- current, and holds a share lock on it until that transaction ends: a takeover, release or
-- forced expiry waits until then. Returns the row, or nothing if the grant is not current.
-- +goose StatementBegin
CREATE FUNCTION pgcoord_lease_check(
    p_name text, p_holder text, p_fence_token bigint, p_now timestamptz DEFAULT NULL
) RETURNS SETOF pgcoord_leases LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY SELECT * FROM pgcoord_leases
     WHERE name = p_name AND holder = p_holder AND fence_token = p_fence_token
       AND expires_at > coalesce(p_now, now())
       FOR SHARE;
END
$$;
-- +goose StatementEnd

-- The fence register: the highest token seen per resource.
CREATE TABLE pgcoord_fences (
    resource    text        PRIMARY KEY CHECK (octet_length(resource) BETWEEN 1 AND 255),
    fence_token bigint      NOT NULL,
    updated_at  timestamptz NOT NULL
);

COMMENT ON TABLE pgcoord_fences IS 'pgcoord: the highest fence token accepted per resource';

CREATE TRIGGER pgcoord_keep_rows BEFORE DELETE ON pgcoord_fences
    FOR EACH ROW EXECUTE FUNCTION pgcoord_keep_rows();
CREATE TRIGGER pgcoord_keep_rows_truncate BEFORE TRUNCATE ON pgcoord_fences
    FOR EACH STATEMENT EXECUTE FUNCTION pgcoord_keep_rows();

-- pgcoord_fence_check records p_fence_token for p_resource if it is not lower than the
-- highest seen, and returns the row; no row means the token is stale and the caller's
-- transaction must not write. The row stays locked until the caller's transaction ends,
-- so concurrent writers to one resource are ordered by token.
-- +goose StatementBegin
CREATE FUNCTION pgcoord_fence_check(p_resource text, p_fence_token bigint, p_now timestamptz DEFAULT NULL)
RETURNS SETOF pgcoord_fences LANGUAGE plpgsql AS $$
BEGIN
    IF p_fence_token IS NULL THEN
        RAISE EXCEPTION 'pgcoord: fence token is null' USING ERRCODE = '22004';
    END IF;
    RETURN QUERY
    INSERT INTO pgcoord_fences AS f (resource, fence_token, updated_at)
    VALUES (p_resource, p_fence_token, coalesce(p_now, now()))
    ON CONFLICT (resource) DO UPDATE
       SET fence_token = excluded.fence_token, updated_at = excluded.updated_at
     WHERE f.fence_token <= excluded.fence_token
    RETURNING *;
END
$$;
-- +goose StatementEnd

-- pgcoord_fence_assert is pgcoord_fence_check that raises SQLSTATE PGC01 for a stale token
-- instead of returning no row, aborting the caller's transaction. Send it in the same
-- round trip as the write it protects (a pipeline or batch): the write then never runs.
-- +goose StatementBegin
CREATE FUNCTION pgcoord_fence_assert(p_resource text, p_fence_token bigint, p_now timestamptz DEFAULT NULL)
RETURNS SETOF pgcoord_fences LANGUAGE plpgsql AS $$
DECLARE
    r pgcoord_fences;
BEGIN
    IF p_fence_token IS NULL THEN
        RAISE EXCEPTION 'pgcoord: fence token is null' USING ERRCODE = '22004';
    END IF;
    -- pgcoord_fence_check's statement, inlined: this runs on every fenced write.
    INSERT INTO pgcoord_fences AS f (resource, fence_token, updated_at)
    VALUES (p_resource, p_fence_token, coalesce(p_now, now()))
    ON CONFLICT (resource) DO UPDATE
       SET fence_token = excluded.fence_token, updated_at = excluded.updated_at
     WHERE f.fence_token <= excluded.fence_token
    RETURNING * INTO r;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'pgcoord: stale fence token % for %', p_fence_token, p_resource
            USING ERRCODE = 'PGC01';
    END IF;
    RETURN NEXT r;
END
$$;
-- +goose StatementEnd

-- pgcoord_fence_guard is a trigger for the user's own tables: installed with
-- `pgcoord fence guard TABLE COLUMN` (or fenced.InstallGuard) it refuses, with SQLSTATE
-- PGC01, any UPDATE that would lower the fence column or set it to NULL, whichever code path
-- sent it.
-- +goose StatementBegin
CREATE FUNCTION pgcoord_fence_guard() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    v_col text := TG_ARGV[0];
    v_old bigint := (to_jsonb(OLD) ->> v_col)::bigint;
    v_new bigint := (to_jsonb(NEW) ->> v_col)::bigint;
BEGIN
    IF v_old IS NOT NULL AND (v_new IS NULL OR v_new < v_old) THEN
        RAISE EXCEPTION 'pgcoord: stale fence token % for %.% (the row already has %)',
            coalesce(v_new::text, 'NULL'), TG_TABLE_NAME, v_col, v_old
            USING ERRCODE = 'PGC01';
    END IF;
    RETURN NEW;
END
$$;
-- +goose StatementEnd

-- +goose Down
DROP FUNCTION pgcoord_fence_guard();
DROP FUNCTION pgcoord_fence_assert(text, bigint, timestamptz);
DROP FUNCTION pgcoord_fence_check(text, bigint, timestamptz);
DROP TABLE pgcoord_fences;
DROP FUNCTION pgcoord_lease_check(text, text, bigint, timestamptz);
DROP FUNCTION pgcoord_lease_expire(text, text, timestamptz);
DROP FUNCTION pgcoord_lease_release(text, text, bigint, timestamptz);
DROP FUNCTION pgcoord_lease_renew(text, text, bigint, interval, boolean, timestamptz);
DROP FUNCTION pgcoord_lease_wait(text, text, interval, interval, jsonb, timestamptz, text);
DROP FUNCTION pgcoord_lease_acquire(text, text, interval, jsonb, timestamptz, text);
DROP FUNCTION pgcoord_channel(text);
DROP TABLE pgcoord_leases;
DROP FUNCTION pgcoord_keep_rows();
