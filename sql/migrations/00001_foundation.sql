-- The foundation every pgcoord primitive shares.
--
-- pgcoord_lock_key(name) maps a name to the 64-bit key pgcoord passes to the advisory-lock
-- functions. Advisory locks are database-wide, so the key must carry the schema pgcoord is
-- installed in: two applications (or two parallel test schemas) in one database that both
-- lock "report" must get different keys. The schema name is baked into the function body when
-- this migration runs, so every caller gets the same key whatever its search_path, and the
-- Go library and plain SQL callers can never disagree.
--
-- pgcoord_token_floor() is the lowest fence token this server may issue, and refuses when the
-- server is a standby (see docs/failover.md).

-- +goose Up
-- The signature, for readers and for sqlc; the DO block below replaces the body.
CREATE FUNCTION pgcoord_lock_key(name text) RETURNS bigint
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    AS $$ SELECT hashtextextended(name, 0) $$;

-- +goose StatementBegin
DO $body$
BEGIN
    IF current_schema() IS NULL THEN
        RAISE EXCEPTION 'pgcoord: search_path names no existing schema to install into';
    END IF;
    EXECUTE format(
        'CREATE OR REPLACE FUNCTION pgcoord_lock_key(name text) RETURNS bigint '
        'LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS %L',
        format('SELECT hashtextextended(%L || name, 0)', current_schema() || '.'));
END
$body$;
-- +goose StatementEnd

COMMENT ON FUNCTION pgcoord_lock_key(text) IS
    'pgcoord: advisory-lock key for a name, namespaced by the schema pgcoord is installed in';

-- pgcoord_token_floor returns (timeline - 1) << 32, the lowest fence token this server may
-- issue: every function that issues a token issues greatest(previous + 1, floor). A promoted
-- standby, or a point-in-time restore, starts a new timeline, so every token it issues is
-- higher than every token of the old timeline — even one whose grant was lost with the old
-- primary (asynchronous replication) — as long as a name gets fewer than 2^32 grants per
-- timeline. On timeline 1 the floor is 0 and changes nothing. The timeline is read from the
-- name of the WAL file being written, which any role may read; on a standby (in recovery)
-- the function raises SQLSTATE 25006 instead: tokens are only issued by the primary.
-- It is LANGUAGE sql so that it is inlined into its callers: it runs on every grant, and a
-- PL/pgSQL call would cost several times more (about 2 µs against 0.4 µs here).
-- +goose StatementBegin
CREATE FUNCTION pgcoord_refuse_on_standby() RETURNS bigint LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'pgcoord: this server is a standby in recovery; only the primary grants'
        USING ERRCODE = '25006', HINT = 'Connect to the primary (e.g. target_session_attrs=read-write).';
END
$$;
-- +goose StatementEnd

CREATE FUNCTION pgcoord_token_floor() RETURNS bigint LANGUAGE sql AS $$
    SELECT CASE WHEN pg_is_in_recovery() THEN pgcoord_refuse_on_standby()
                ELSE (('x' || left(pg_walfile_name(pg_current_wal_lsn()), 8))::bit(32)::bigint - 1) << 32
           END
$$;

COMMENT ON FUNCTION pgcoord_token_floor() IS
    'pgcoord: the lowest fence token this server may issue, (timeline - 1) << 32; raises 25006 on a standby';

-- +goose Down
DROP FUNCTION pgcoord_token_floor();
DROP FUNCTION pgcoord_refuse_on_standby();
DROP FUNCTION pgcoord_lock_key(text);
