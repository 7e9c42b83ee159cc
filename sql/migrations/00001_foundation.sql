-- The foundation every pgcoord primitive shares.
--
-- pgcoord_lock_key(name) maps a name to the 64-bit key pgcoord passes to the advisory-lock
-- functions. Advisory locks are database-wide, so the key must carry the schema pgcoord is
-- installed in: two applications (or two parallel test schemas) in one database that both
-- lock "report" must get different keys. The schema name is baked into the function body when
-- this migration runs, so every caller gets the same key whatever its search_path, and the
-- Go library and plain SQL callers can never disagree.
--
-- pgcoord_now() and pgcoord_clock() are the only clocks pgcoord reads: every expiry, due time
-- and TTL in pgcoord's SQL is judged by them, and no SQL API function or Go option lets a
-- caller choose "now". pgcoord_token_floor() and pgcoord_next_token() issue fence tokens.

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

-- pgcoord_now() is the database clock as pgcoord reads it: the start of the current
-- transaction. pgcoord_clock() is the current instant, for the few judgements that must not
-- use the transaction's start (a renewal that waited for a lock past the grant's expiry).
-- They are LANGUAGE sql so that the planner inlines them: they cost what now() and
-- clock_timestamp() cost. They are the test suite's seam: its harness replaces them, in a
-- test's own schema, to move time without sleeping (internal/pgtest's Clock). Production
-- never does; replacing them needs ownership of the schema's functions, and `pgcoord doctor`
-- reports a clock that is not the database's.
CREATE FUNCTION pgcoord_now() RETURNS timestamptz LANGUAGE sql STABLE PARALLEL SAFE
    AS $$ SELECT now() $$;
CREATE FUNCTION pgcoord_clock() RETURNS timestamptz LANGUAGE sql VOLATILE PARALLEL SAFE
    AS $$ SELECT clock_timestamp() $$;

COMMENT ON FUNCTION pgcoord_now() IS 'pgcoord: the database clock pgcoord judges by (now())';
COMMENT ON FUNCTION pgcoord_clock() IS 'pgcoord: the current instant pgcoord judges by (clock_timestamp())';

-- pgcoord_token_floor returns (timeline - 1) << 44, the lowest fence token this server may
-- issue. Every fence token — of leases, semaphore permits, job runs and outbox claims — is
-- pgcoord_next_token() = floor + the next value of one schema-wide sequence, so tokens are
-- ordered by when they were issued, whatever they were issued for, and deleting a row never
-- lets a token repeat. A promoted standby, or a point-in-time restore, starts a new
-- timeline, so every token it issues is higher than every token of the old timeline — even
-- one whose grant was lost with the old primary (asynchronous replication, which can also
-- set the sequence back) — as long as the schema issues fewer than 2^44 (17.6 trillion)
-- tokens in all: 55 years at 10,000 grants a second. On timeline 1 the floor is 0. The
-- timeline is read from the name of the WAL file being written, which any role may read;
-- on a standby (in recovery) the function raises SQLSTATE 25006 instead: tokens are only
-- issued by the primary. It is LANGUAGE sql so that it is inlined into its callers: it
-- runs on every grant, and a PL/pgSQL call would cost several times more (about 2 µs
-- against 0.4 µs here).
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
                ELSE (('x' || left(pg_walfile_name(pg_current_wal_lsn()), 8))::bit(32)::bigint - 1) << 44
           END
$$;

COMMENT ON FUNCTION pgcoord_token_floor() IS
    'pgcoord: the lowest fence token this server may issue, (timeline - 1) << 44; raises 25006 on a standby';

-- MAXVALUE 2^44 - 1: a schema that issued every token of its budget fails its grants
-- loudly (SQLSTATE 2200H) instead of issuing tokens in the next timeline's range.
CREATE SEQUENCE pgcoord_token_seq AS bigint MAXVALUE 17592186044415 NO CYCLE;

COMMENT ON SEQUENCE pgcoord_token_seq IS 'pgcoord: the schema-wide fence token counter (see pgcoord_next_token)';

-- pgcoord_next_token issues a fence token: higher than every token issued before it in this
-- schema, on this timeline and every earlier one. A sequence is not transactional, so a
-- token taken by a transaction that rolls back is skipped, never reused.
CREATE FUNCTION pgcoord_next_token() RETURNS bigint LANGUAGE sql
    AS $$ SELECT pgcoord_token_floor() + nextval('pgcoord_token_seq') $$;

COMMENT ON FUNCTION pgcoord_next_token() IS 'pgcoord: a new fence token, above every earlier one; raises 25006 on a standby';

-- pgcoord_refuse raises the error of a bad argument to a SQL API function: SQLSTATE 22004
-- (null_value_not_allowed) when p_got is NULL, else 22023 (invalid_parameter_value), with the
-- message "pgcoord: <p_what> must be <p_want>, got <p_got>". Functions test their arguments
-- with plain IF conditions and call it only to fail, so a good call pays for no function call.
-- +goose StatementBegin
CREATE FUNCTION pgcoord_refuse(p_what text, p_want text, p_got text) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF p_got IS NULL THEN
        RAISE EXCEPTION 'pgcoord: % is NULL; it must be %', p_what, p_want USING ERRCODE = '22004';
    END IF;
    RAISE EXCEPTION 'pgcoord: % must be %, got %', p_what, p_want, p_got USING ERRCODE = '22023';
END
$$;
-- +goose StatementEnd

-- pgcoord_grant_prepare starts every function that grants (and so issues a fence token):
-- it refuses a synchronous_commit level a grant may not ask for (22023: a grant must be
-- durable, so only 'on', 'remote_write' and 'remote_apply', or NULL for the server's
-- setting), refuses on a standby (25006, even where the grant would be refused anyway), and
-- sets the level for the rest of the caller's transaction.
-- +goose StatementBegin
CREATE FUNCTION pgcoord_grant_prepare(p_sync_commit text) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF p_sync_commit NOT IN ('on', 'remote_write', 'remote_apply') THEN
        PERFORM pgcoord_refuse('synchronous_commit level of a grant', 'on, remote_write or remote_apply', p_sync_commit);
    END IF;
    IF pg_is_in_recovery() THEN
        PERFORM pgcoord_refuse_on_standby();
    END IF;
    IF p_sync_commit IS NOT NULL THEN
        PERFORM set_config('synchronous_commit', p_sync_commit, true);
    END IF;
END
$$;
-- +goose StatementEnd

-- pgcoord_name_ok tells whether p_name is a valid name for a lease, holder, key, job, scope
-- or topic: not NULL, 1 to 255 bytes, without a control character — C0, DEL, C1, the line
-- and paragraph separators and the bidirectional controls — which, printed by the CLI or
-- a log, could move a terminal's cursor, retitle its window, fake a row or reverse text.
CREATE FUNCTION pgcoord_name_ok(p_name text) RETURNS boolean
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ SELECT p_name IS NOT NULL AND octet_length(p_name) BETWEEN 1 AND 255
                 AND p_name !~ '[\x01-\x1f\x7f-\x9f\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]' $$;

-- pgcoord_ttl_ok tells whether p_ttl is a valid TTL or wait: not NULL, positive, at most 24
-- hours, and without months or years, which have no fixed length ('1 mon -29 days'
-- compares as 24 hours).
CREATE FUNCTION pgcoord_ttl_ok(p_ttl interval) RETURNS boolean
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ SELECT p_ttl IS NOT NULL AND p_ttl > interval '0' AND p_ttl <= interval '24 hours'
                 AND date_part('month', p_ttl) = 0 AND date_part('year', p_ttl) = 0 $$;

-- pgcoord_refuse_name raises pgcoord_refuse's error for a name that is not pgcoord_name_ok.
CREATE FUNCTION pgcoord_refuse_name(p_what text, p_name text) RETURNS void
    LANGUAGE sql
    AS $$ SELECT pgcoord_refuse(p_what, '1 to 255 bytes without control characters',
                                CASE WHEN octet_length(p_name) BETWEEN 1 AND 255 THEN 'a control character'
                                     ELSE octet_length(p_name) || ' bytes' END) $$;

-- +goose Down
DROP FUNCTION pgcoord_refuse_name(text, text);
DROP FUNCTION pgcoord_ttl_ok(interval);
DROP FUNCTION pgcoord_name_ok(text);
DROP FUNCTION pgcoord_grant_prepare(text);
DROP FUNCTION pgcoord_refuse(text, text, text);
DROP FUNCTION pgcoord_next_token();
DROP SEQUENCE pgcoord_token_seq;
DROP FUNCTION pgcoord_token_floor();
DROP FUNCTION pgcoord_refuse_on_standby();
DROP FUNCTION pgcoord_clock();
DROP FUNCTION pgcoord_now();
DROP FUNCTION pgcoord_lock_key(text);
