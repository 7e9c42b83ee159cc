-- Leases with fencing tokens, and the fence register.
--
-- One row per lease name. fence_token is the token of the name's newest grant, drawn from
-- pgcoord_next_token(): higher than every token issued before it — not repeated after a
-- release, an expiry, an operator expiry, a restart, crash recovery (the sequence is logged)
-- or a failover (tokens exceed pgcoord_token_floor()). Because tokens come from one counter,
-- a row may be deleted (pgcoord_gc collects leases free for longer than its retention)
-- without letting a token repeat; what the deleted row knew — its newest grant — moves to
-- the fence register of the same name, so a late write of an older grant is still refused.
-- Expiry is judged by the database clock only (pgcoord_now(), pgcoord_clock()).

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
    'pgcoord: one row per lease name and its newest grant; a free lease has holder NULL';

-- pgcoord_refuse_truncate refuses TRUNCATE on the tables whose rows carry fence tokens:
-- a DELETE hands what a row knew to the fence registers (see the retire triggers below), a
-- TRUNCATE would not.
-- +goose StatementBegin
CREATE FUNCTION pgcoord_refuse_truncate() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'pgcoord: % is never truncated, so that no stale fence token is accepted again', TG_TABLE_NAME
        USING HINT = 'Delete rows instead (pgcoord gc collects what is no longer needed).';
END
$$;
-- +goose StatementEnd

CREATE TRIGGER pgcoord_refuse_truncate BEFORE TRUNCATE ON pgcoord_leases
    FOR EACH STATEMENT EXECUTE FUNCTION pgcoord_refuse_truncate();

-- pgcoord_channel(topic) is the NOTIFY channel pgcoord uses for topic ('leases', ...),
-- namespaced by the install schema like pgcoord_lock_key, and short enough for any schema.
CREATE FUNCTION pgcoord_channel(topic text) RETURNS text
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    AS $$ SELECT 'pgcoord_' || lpad(to_hex(pgcoord_lock_key('channel:' || topic)), 16, '0') $$;

-- pgcoord_lease_args refuses bad arguments of the granting functions: a name or holder that
-- is not 1 to 255 bytes, a TTL outside (0, 24 hours] or with months (which have no fixed
-- length: '1 mon -29 days' compares as 24 hours), metadata that is not a JSON object of
-- at most 8 kB (NULL means {}).
-- +goose StatementBegin
CREATE FUNCTION pgcoord_lease_args(p_name text, p_holder text, p_ttl interval, p_metadata jsonb)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF NOT pgcoord_name_ok(p_name) THEN
        PERFORM pgcoord_refuse_name('lease name', p_name);
    END IF;
    IF NOT pgcoord_name_ok(p_holder) THEN
        PERFORM pgcoord_refuse_name('lease holder', p_holder);
    END IF;
    IF NOT pgcoord_ttl_ok(p_ttl) THEN
        PERFORM pgcoord_refuse('lease ttl', 'positive, at most 24 hours and without months', p_ttl::text);
    END IF;
    IF jsonb_typeof(p_metadata) <> 'object' OR pg_column_size(p_metadata) > 8192 THEN
        PERFORM pgcoord_refuse('lease metadata', 'a JSON object of at most 8192 bytes',
                               jsonb_typeof(p_metadata) || ' of ' || pg_column_size(p_metadata) || ' bytes');
    END IF;
END
$$;
-- +goose StatementEnd

-- pgcoord_lease_grant_args refuses the bad arguments of a call that names one grant
-- (name + holder + token).
-- +goose StatementBegin
CREATE FUNCTION pgcoord_lease_grant_args(p_name text, p_holder text, p_fence_token bigint)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF NOT pgcoord_name_ok(p_name) THEN
        PERFORM pgcoord_refuse_name('lease name', p_name);
    END IF;
    IF NOT pgcoord_name_ok(p_holder) THEN
        PERFORM pgcoord_refuse_name('lease holder', p_holder);
    END IF;
    IF p_fence_token IS NULL OR p_fence_token < 1 THEN
        PERFORM pgcoord_refuse('fence token', 'positive', p_fence_token::text);
    END IF;
END
$$;
-- +goose StatementEnd

-- pgcoord_lease_acquire grants the lease to p_holder if it is free or expired, with a new
-- fence token, and returns the granted row. If p_holder already holds it (an earlier
-- attempt committed but its reply was lost, or is committing now) it returns that grant
-- unchanged, after locking
-- its row: the lock gives this transaction a commit of its own, which waits for a
-- synchronous standby like the grant's, so the grant is acknowledged only once it is as
-- durable as a fresh one (an earlier attempt whose wait for the standby was cancelled
-- committed on the primary alone). Otherwise it returns no row, and it has written nothing,
-- locked nothing and waited for nothing.
-- p_sync_commit, if not NULL, is the synchronous_commit level of the caller's transaction
-- (e.g. 'on' to wait for a synchronous standby when the server runs with 'local'). Bad
-- arguments raise 22004 (NULL) or 22023 (pgcoord_lease_args); on a standby it raises 25006.
-- +goose StatementBegin
CREATE FUNCTION pgcoord_lease_acquire(
    p_name text, p_holder text, p_ttl interval,
    p_metadata jsonb DEFAULT '{}', p_sync_commit text DEFAULT NULL
) RETURNS SETOF pgcoord_leases LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := pgcoord_now();
    r pgcoord_leases;
BEGIN
    -- The checks, inline (a call costs microseconds on every grant); the helpers raise.
    IF NOT (pgcoord_name_ok(p_name) AND pgcoord_name_ok(p_holder) AND pgcoord_ttl_ok(p_ttl))
       OR jsonb_typeof(p_metadata) <> 'object' OR pg_column_size(p_metadata) > 8192 THEN
        PERFORM pgcoord_lease_args(p_name, p_holder, p_ttl, p_metadata);
    END IF;
    IF p_sync_commit IS NOT NULL OR pg_is_in_recovery() THEN
        PERFORM pgcoord_grant_prepare(p_sync_commit); -- on a standby it refuses even when the lease is held
    END IF;
    -- Take a free or expired lease. A row whose latest committed version is held and
    -- unexpired fails the WHERE clause before it is locked: a refusal writes nothing,
    -- locks nothing and waits for no transaction, not even one of the holder's that is
    -- renewing or committing.
    UPDATE pgcoord_leases
       SET fence_token = pgcoord_next_token(), holder = p_holder, metadata = coalesce(p_metadata, '{}'),
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
            -- Our own live grant, from an attempt whose reply was lost: lock it (see above).
            SELECT * INTO r FROM pgcoord_leases WHERE name = p_name FOR UPDATE;
            IF r.holder = p_holder AND r.expires_at > v_now THEN
                RETURN NEXT r;
            END IF;
        END IF;
        RETURN;
    END IF;
    -- First grant of this name (or the first since its row was collected).
    INSERT INTO pgcoord_leases (name, fence_token, holder, metadata, acquired_at, expires_at)
    VALUES (p_name, pgcoord_next_token(), p_holder, coalesce(p_metadata, '{}'), v_now, v_now + p_ttl)
    ON CONFLICT (name) DO NOTHING
    RETURNING * INTO r;
    IF FOUND THEN
        RETURN NEXT r;
        RETURN;
    END IF;
    -- A concurrent first grant won, and the insert waited for it to commit. If it was this
    -- holder's own attempt (a retry racing it), it is our grant: locked and returned as above.
    SELECT * INTO r FROM pgcoord_leases WHERE name = p_name AND holder = p_holder AND expires_at > v_now FOR UPDATE;
    IF FOUND THEN
        RETURN NEXT r;
    END IF;
END
$$;
-- +goose StatementEnd

-- pgcoord_lease_wait is pgcoord_lease_acquire for a caller that will wait: if the lease is
-- not granted, it records that someone waits for it until now + p_want, at most 24 hours
-- (so its release sends a notification on pgcoord_channel('leases')) and returns the
-- current holder's row, whose expires_at tells the caller when to try again. Granted iff
-- the returned row's holder is p_holder. Listen on the channel before calling it, so no
-- release is missed. The wait registration commits without waiting for the WAL flush:
-- losing it only delays a wake-up. p_sync_commit applies to a grant as in
-- pgcoord_lease_acquire.
-- +goose StatementBegin
CREATE FUNCTION pgcoord_lease_wait(
    p_name text, p_holder text, p_ttl interval, p_want interval,
    p_metadata jsonb DEFAULT '{}', p_sync_commit text DEFAULT NULL
) RETURNS SETOF pgcoord_leases LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := pgcoord_now();
    r pgcoord_leases;
BEGIN
    IF NOT pgcoord_ttl_ok(p_want) THEN
        PERFORM pgcoord_refuse('lease wait', 'positive, at most 24 hours and without months', p_want::text);
    END IF;
    -- Two rounds: the lease may be released between a failed attempt and the registration,
    -- in which case the registration matches nothing and the second attempt takes it.
    FOR i IN 1..2 LOOP
        SELECT * INTO r FROM pgcoord_lease_acquire(p_name, p_holder, p_ttl, p_metadata, p_sync_commit);
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

-- pgcoord_lease_renew extends one grant (name + holder + token) to now + p_ttl (at most 24
-- hours) and returns it; no row if that grant is no longer current (released, expired,
-- taken over). With p_durable false the renewal commits without waiting for the WAL flush:
-- losing it in a crash only shortens the lease. Never pass false inside a transaction that
-- has other writes. Expiry is judged by pgcoord_clock(), not the transaction's start: a
-- renewal that waited on a lock past the grant's expiry must not revive it. A renewal that
-- finds less than a quarter of the grant left counts as a near miss.
-- +goose StatementBegin
CREATE FUNCTION pgcoord_lease_renew(
    p_name text, p_holder text, p_fence_token bigint, p_ttl interval, p_durable boolean DEFAULT true
) RETURNS SETOF pgcoord_leases LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz;
BEGIN
    IF NOT (pgcoord_name_ok(p_name) AND pgcoord_name_ok(p_holder)) OR p_fence_token IS NULL OR p_fence_token < 1 THEN
        PERFORM pgcoord_lease_grant_args(p_name, p_holder, p_fence_token);
    END IF;
    IF NOT pgcoord_ttl_ok(p_ttl) THEN
        PERFORM pgcoord_refuse('lease ttl', 'positive, at most 24 hours and without months', p_ttl::text);
    END IF;
    IF p_durable IS NULL THEN
        PERFORM pgcoord_refuse('p_durable', 'true or false', NULL);
    END IF;
    IF NOT p_durable THEN
        PERFORM set_config('synchronous_commit', 'off', true);
    END IF;
    -- Lock the row first, then judge expiry by the clock: a renewal that waited for the
    -- lock (held by a fenced write's pgcoord_lease_check, say) until after the grant
    -- expired must fail, not revive it.
    PERFORM FROM pgcoord_leases
     WHERE name = p_name AND holder = p_holder AND fence_token = p_fence_token
       FOR NO KEY UPDATE;
    v_now := pgcoord_clock();
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
CREATE FUNCTION pgcoord_lease_release(p_name text, p_holder text, p_fence_token bigint)
RETURNS SETOF pgcoord_leases LANGUAGE plpgsql AS $$
DECLARE
    r pgcoord_leases;
BEGIN
    IF NOT (pgcoord_name_ok(p_name) AND pgcoord_name_ok(p_holder)) OR p_fence_token IS NULL OR p_fence_token < 1 THEN
        PERFORM pgcoord_lease_grant_args(p_name, p_holder, p_fence_token);
    END IF;
    UPDATE pgcoord_leases
       SET holder = NULL, expires_at = NULL, released_at = pgcoord_now()
     WHERE name = p_name AND holder = p_holder AND fence_token = p_fence_token
    RETURNING * INTO r;
    IF FOUND THEN
        IF r.wanted_until > pgcoord_now() THEN
            PERFORM pg_notify(pgcoord_channel('leases'), p_name);
        END IF;
        RETURN NEXT r;
    END IF;
END
$$;
-- +goose StatementEnd

-- pgcoord_lease_expire is the operator's forced expiry: the lease becomes free at once, its
-- holder's renewals, releases and in-database checks fail, and the next grant gets a higher
-- token. p_by (NULL: 'operator'; at most 255 bytes) is recorded as expired_by. Returns the
-- row as it was before, or nothing if the lease was not held.
-- +goose StatementBegin
CREATE FUNCTION pgcoord_lease_expire(p_name text, p_by text)
RETURNS SETOF pgcoord_leases LANGUAGE plpgsql AS $$
DECLARE
    r pgcoord_leases;
BEGIN
    IF NOT pgcoord_name_ok(p_name) THEN
        PERFORM pgcoord_refuse_name('lease name', p_name);
    END IF;
    IF octet_length(p_by) NOT BETWEEN 1 AND 255 THEN
        PERFORM pgcoord_refuse_name('p_by', p_by);
    END IF;
    SELECT * INTO r FROM pgcoord_leases WHERE name = p_name AND holder IS NOT NULL FOR UPDATE;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    UPDATE pgcoord_leases
       SET holder = NULL, expires_at = NULL, released_at = pgcoord_now(), expired_by = coalesce(p_by, 'operator'),
           forced_expiries = forced_expiries + 1
     WHERE name = p_name;
    PERFORM pg_notify(pgcoord_channel('leases'), p_name);
    RETURN NEXT r;
END
$$;
-- +goose StatementEnd

-- pgcoord_lease_check verifies, inside the caller's transaction, that one grant is still
-- current by pgcoord_clock(), and holds a share lock on it until that transaction ends: a
-- takeover, release or forced expiry waits until then. Returns the row, or nothing if the
-- grant is not current.
-- +goose StatementBegin
CREATE FUNCTION pgcoord_lease_check(p_name text, p_holder text, p_fence_token bigint)
RETURNS SETOF pgcoord_leases LANGUAGE plpgsql AS $$
BEGIN
    IF NOT (pgcoord_name_ok(p_name) AND pgcoord_name_ok(p_holder)) OR p_fence_token IS NULL OR p_fence_token < 1 THEN
        PERFORM pgcoord_lease_grant_args(p_name, p_holder, p_fence_token);
    END IF;
    RETURN QUERY SELECT * FROM pgcoord_leases
     WHERE name = p_name AND holder = p_holder AND fence_token = p_fence_token
       AND expires_at > pgcoord_clock()
       FOR SHARE;
END
$$;
-- +goose StatementEnd

-- The fence register: the highest token accepted per resource. A row idle for longer than
-- pgcoord_gc's retention may be deleted; its token then moves to pgcoord_fence_floor.
CREATE TABLE pgcoord_fences (
    resource    text        PRIMARY KEY CHECK (octet_length(resource) BETWEEN 1 AND 255),
    fence_token bigint      NOT NULL,
    updated_at  timestamptz NOT NULL
);

COMMENT ON TABLE pgcoord_fences IS 'pgcoord: the highest fence token accepted per resource';

CREATE TRIGGER pgcoord_refuse_truncate BEFORE TRUNCATE ON pgcoord_fences
    FOR EACH STATEMENT EXECUTE FUNCTION pgcoord_refuse_truncate();

-- The retired floor: the highest token any deleted register or lease row held. A resource
-- with no register may have had one that was collected, so its first write must carry a
-- token at least this high — unless it is the newest grant of the lease named like the
-- resource, which no collected row can have seen beaten. One row.
CREATE TABLE pgcoord_fence_floor (
    one         boolean PRIMARY KEY DEFAULT true CHECK (one),
    fence_token bigint  NOT NULL
);

INSERT INTO pgcoord_fence_floor (fence_token) VALUES (0);

COMMENT ON TABLE pgcoord_fence_floor IS 'pgcoord: the highest fence token of every collected register and lease';

CREATE TRIGGER pgcoord_refuse_truncate BEFORE TRUNCATE ON pgcoord_fence_floor
    FOR EACH STATEMENT EXECUTE FUNCTION pgcoord_refuse_truncate();

-- pgcoord_retire runs once per DELETE statement on pgcoord_leases and pgcoord_fences, so
-- that what the deleted rows knew survives them: the newest grant of each deleted lease
-- raises the register of the resource named like it (if it has one), and the highest token
-- of the deleted rows raises the floor. An older grant of that name is still refused at the
-- data, whichever code path deleted the rows.
-- +goose StatementBegin
CREATE FUNCTION pgcoord_retire() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_TABLE_NAME = 'pgcoord_leases' THEN
        UPDATE pgcoord_fences f SET fence_token = o.fence_token
          FROM retired o WHERE f.resource = o.name AND f.fence_token < o.fence_token;
    END IF;
    UPDATE pgcoord_fence_floor
       SET fence_token = (SELECT max(o.fence_token) FROM retired o)
     WHERE fence_token < (SELECT max(o.fence_token) FROM retired o);
    RETURN NULL;
END
$$;
-- +goose StatementEnd

CREATE TRIGGER pgcoord_retire AFTER DELETE ON pgcoord_leases
    REFERENCING OLD TABLE AS retired
    FOR EACH STATEMENT EXECUTE FUNCTION pgcoord_retire();
CREATE TRIGGER pgcoord_retire AFTER DELETE ON pgcoord_fences
    REFERENCING OLD TABLE AS retired
    FOR EACH STATEMENT EXECUTE FUNCTION pgcoord_retire();

-- pgcoord_fence_record records p_fence_token for p_resource and returns the register's row,
-- or NULL — the token is stale, and the caller's transaction must not write — when the
-- token is lower than
--   - the newest grant of the lease named p_resource, even before that grant's holder
--     wrote anything (a holder paused past its lease cannot write after the takeover), or
--   - the highest token recorded for p_resource, or, when p_resource has no register, the
--     retired floor (pgcoord_fence_floor), unless the token is the newest grant of the
--     lease named p_resource.
-- The register row stays locked until the caller's transaction ends, so concurrent writers
-- to one resource are ordered by token. The resource must be 1 to 255 bytes and the token
-- positive (else 22004 or 22023). It is the one implementation behind pgcoord_fence_check,
-- pgcoord_fence_assert and the guard trigger, which call it as an expression (a call that
-- costs far less than a query of a set-returning function).
-- +goose StatementBegin
CREATE FUNCTION pgcoord_fence_record(p_resource text, p_fence_token bigint)
RETURNS pgcoord_fences LANGUAGE plpgsql AS $$
DECLARE
    v_grant bigint;
    r pgcoord_fences;
BEGIN
    IF NOT pgcoord_name_ok(p_resource) THEN
        PERFORM pgcoord_refuse_name('fence resource', p_resource);
    END IF;
    IF p_fence_token IS NULL OR p_fence_token < 1 THEN
        PERFORM pgcoord_refuse('fence token', 'positive', p_fence_token::text);
    END IF;
    SELECT l.fence_token INTO v_grant FROM pgcoord_leases l WHERE l.name = p_resource;
    IF v_grant > p_fence_token THEN
        RETURN NULL; -- a newer grant of the lease exists
    END IF;
    UPDATE pgcoord_fences SET fence_token = p_fence_token, updated_at = pgcoord_now()
     WHERE resource = p_resource AND fence_token <= p_fence_token
    RETURNING * INTO r;
    IF NOT FOUND THEN
        -- No register, or a stale token. A new register must clear the floor.
        INSERT INTO pgcoord_fences AS f (resource, fence_token, updated_at)
        SELECT p_resource, p_fence_token, pgcoord_now()
         WHERE v_grant = p_fence_token
            OR p_fence_token >= (SELECT fl.fence_token FROM pgcoord_fence_floor fl)
        ON CONFLICT (resource) DO UPDATE
           SET fence_token = excluded.fence_token, updated_at = excluded.updated_at
         WHERE f.fence_token <= excluded.fence_token
        RETURNING * INTO r;
        IF NOT FOUND THEN
            RETURN NULL;
        END IF;
    END IF;
    RETURN r;
END
$$;
-- +goose StatementEnd

-- pgcoord_fence_check is pgcoord_fence_record as a query: the register's row, or no row
-- for a stale token.
-- +goose StatementBegin
CREATE FUNCTION pgcoord_fence_check(p_resource text, p_fence_token bigint)
RETURNS SETOF pgcoord_fences LANGUAGE plpgsql AS $$
DECLARE
    r pgcoord_fences := pgcoord_fence_record(p_resource, p_fence_token);
BEGIN
    IF r.resource IS NOT NULL THEN
        RETURN NEXT r;
    END IF;
END
$$;
-- +goose StatementEnd

-- pgcoord_fence_assert is pgcoord_fence_check that raises SQLSTATE PGC01 for a stale token
-- instead of returning no row, aborting the caller's transaction. Send it in the same
-- round trip as the write it protects (a pipeline or batch): the write then never runs.
-- +goose StatementBegin
CREATE FUNCTION pgcoord_fence_assert(p_resource text, p_fence_token bigint)
RETURNS SETOF pgcoord_fences LANGUAGE plpgsql AS $$
DECLARE
    r pgcoord_fences := pgcoord_fence_record(p_resource, p_fence_token);
BEGIN
    IF r.resource IS NULL THEN
        RAISE EXCEPTION 'pgcoord: stale fence token % for %', p_fence_token, p_resource
            USING ERRCODE = 'PGC01';
    END IF;
    RETURN NEXT r;
END
$$;
-- +goose StatementEnd

-- pgcoord_fence_guard is a trigger for the user's own tables, installed with
-- `pgcoord fence guard` (or fenced.InstallGuard). Its arguments are the fence column and,
-- optionally, a resource column and a prefix. It refuses with SQLSTATE PGC01, whichever
-- code path sends the write:
--   - an UPDATE that would lower the fence column or set it to NULL;
--   - with a resource column: every INSERT and UPDATE whose row carries a token that
--     pgcoord_fence_check refuses for the resource prefix || <resource column> (the token is
--     recorded in that resource's register), or carries no (positive) token or no resource.
-- Its search_path is pinned to the schema pgcoord is installed in, so it works whatever
-- search_path the writer has.
-- +goose StatementBegin
CREATE FUNCTION pgcoord_fence_guard() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    v_col text := TG_ARGV[0];
    v_new bigint := (to_jsonb(NEW) ->> v_col)::bigint;
    v_old bigint;
    v_resource text;
BEGIN
    IF TG_OP = 'UPDATE' THEN
        v_old := (to_jsonb(OLD) ->> v_col)::bigint;
        IF v_old IS NOT NULL AND (v_new IS NULL OR v_new < v_old) THEN
            RAISE EXCEPTION 'pgcoord: stale fence token % for %.% (the row already has %)',
                coalesce(v_new::text, 'NULL'), TG_TABLE_NAME, v_col, v_old
                USING ERRCODE = 'PGC01';
        END IF;
    END IF;
    IF TG_NARGS > 1 THEN
        v_resource := coalesce(TG_ARGV[2], '') || (to_jsonb(NEW) ->> TG_ARGV[1]);
        IF v_new IS NULL OR v_new < 1 OR v_resource IS NULL THEN
            RAISE EXCEPTION 'pgcoord: a row of % must carry a fence token (%, positive) and a resource (%)',
                TG_TABLE_NAME, v_col, TG_ARGV[1]
                USING ERRCODE = 'PGC01';
        END IF;
        IF (pgcoord_fence_record(v_resource, v_new)).resource IS NULL THEN
            RAISE EXCEPTION 'pgcoord: stale fence token % for % (a row of %)', v_new, v_resource, TG_TABLE_NAME
                USING ERRCODE = 'PGC01';
        END IF;
    END IF;
    RETURN NEW;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
DO $body$
BEGIN
    EXECUTE format('ALTER FUNCTION pgcoord_fence_guard() SET search_path = %I', current_schema());
END
$body$;
-- +goose StatementEnd

-- +goose Down
DROP FUNCTION pgcoord_fence_guard();
DROP FUNCTION pgcoord_fence_assert(text, bigint);
DROP FUNCTION pgcoord_fence_check(text, bigint);
DROP FUNCTION pgcoord_fence_record(text, bigint);
DROP TABLE pgcoord_fence_floor;
DROP TABLE pgcoord_fences;
DROP FUNCTION pgcoord_lease_check(text, text, bigint);
DROP FUNCTION pgcoord_lease_expire(text, text);
DROP FUNCTION pgcoord_lease_release(text, text, bigint);
DROP FUNCTION pgcoord_lease_renew(text, text, bigint, interval, boolean);
DROP FUNCTION pgcoord_lease_wait(text, text, interval, interval, jsonb, text);
DROP FUNCTION pgcoord_lease_acquire(text, text, interval, jsonb, text);
DROP TABLE pgcoord_leases;
DROP FUNCTION pgcoord_retire();
DROP FUNCTION pgcoord_lease_grant_args(text, text, bigint);
DROP FUNCTION pgcoord_lease_args(text, text, interval, jsonb);
DROP FUNCTION pgcoord_channel(text);
DROP FUNCTION pgcoord_refuse_truncate();
