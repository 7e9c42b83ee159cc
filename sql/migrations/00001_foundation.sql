-- The foundation every pgcoord primitive shares.
--
-- pgcoord_lock_key(name) maps a name to the 64-bit key pgcoord passes to the advisory-lock
-- functions. Advisory locks are database-wide, so the key must carry the schema pgcoord is
-- installed in: two applications (or two parallel test schemas) in one database that both
-- lock "report" must get different keys. The schema name is baked into the function body when
-- this migration runs, so every caller gets the same key whatever its search_path, and the
-- Go library and plain SQL callers can never disagree.

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

-- +goose Down
DROP FUNCTION pgcoord_lock_key(text);
