-- Function search paths and what notifications tell a stranger.
--
-- Any login of the database may LISTEN on pgcoord's channels (and NOTIFY them): LISTEN needs
-- no privilege. Until this migration the lease and semaphore notifications carried the lease
-- name or semaphore key as their payload, so a login with no grant on any pgcoord table
-- learned every name as it was released. From here on they carry pgcoord_wake_tag(name): the
-- first 32 hex digits of SHA-256 of the name (UTF-8). A waiter computes the same tag
-- (internal/listen.Tag) and is woken by it alone. A tag is not a secret: a stranger can
-- still confirm a guessed name and see when it is released, but no longer reads names.
-- Forged notifications cost a waiter at most a bounded number of extra checks (see
-- internal/listen: wake-ups are coalesced per waiter).
--
-- Search paths. A trigger function runs with the search_path of whoever writes the table,
-- and a SECURITY DEFINER function with its owner's rights: both are pinned to the install
-- schema followed by pg_temp (pg_temp last, as the PostgreSQL documentation on SECURITY
-- DEFINER advises, so no temporary table or function of the caller's can stand in for one of
-- pgcoord's). The DO block pins every such pgcoord_* function of the schema, so those of the
-- migrations before this one are covered whoever wrote them; pgcoord's test
-- TestFunctionSearchPaths checks every one after Migrate.
--
-- The other functions are left unpinned on purpose: the plain SQL ones (pgcoord_now,
-- pgcoord_clock, pgcoord_lock_key, pgcoord_channel, pgcoord_wake_tag, pgcoord_name_ok, ...)
-- because a SQL function with a SET clause is never inlined into its caller's query, and
-- inlining is what makes them cost what now() or a hash costs (and the test clock relies on
-- replacing pgcoord_now in a test's schema); the plpgsql API functions because they run with
-- the caller's own rights and search_path, like any query the caller could send itself, and
-- callers reach them through that search_path in the first place.

-- +goose Up
-- +goose StatementBegin
CREATE FUNCTION pgcoord_wake_tag(p_name text) RETURNS text
    LANGUAGE sql STABLE STRICT PARALLEL SAFE
    AS $$ SELECT pg_catalog.left(pg_catalog.encode(pg_catalog.sha256(pg_catalog.convert_to(p_name, 'UTF8')), 'hex'), 32) $$;
-- +goose StatementEnd

COMMENT ON FUNCTION pgcoord_wake_tag(text) IS
    'pgcoord: the payload of a notification about name: the first 32 hex digits of its SHA-256';

-- Every pg_notify of a pgcoord function whose payload is one of its arguments (p_name,
-- p_key) sends the argument's tag instead. The functions are rewritten from their own
-- current text, so this holds whichever migration last replaced them.
-- +goose StatementBegin
DO $body$
DECLARE
    r record;
BEGIN
    FOR r IN
        -- (The functions of this schema first, behind OFFSET 0: with the filters side by
        -- side, the planner ran the cheaper-looking pg_get_functiondef on every function of
        -- the database, and one of another schema dropped meanwhile failed the migration
        -- with "cache lookup failed".)
        SELECT d.def
          FROM (SELECT pg_get_functiondef(p.oid) AS def
                  FROM pg_proc p
                 WHERE p.pronamespace = current_schema()::regnamespace AND p.proname LIKE 'pgcoord\_%' AND p.prokind = 'f'
                OFFSET 0) d
         WHERE d.def ~ 'pg_notify\(pgcoord_channel\(''[a-z_]+''\), p_[a-z_]+\)'
    LOOP
        EXECUTE regexp_replace(r.def, 'pg_notify\((pgcoord_channel\(''[a-z_]+''\)), (p_[a-z_]+)\)',
                               'pg_notify(\1, pgcoord_wake_tag(\2))', 'g');
    END LOOP;
END
$body$;
-- +goose StatementEnd

-- +goose StatementBegin
DO $body$
DECLARE
    r record;
BEGIN
    FOR r IN
        SELECT p.oid::regprocedure AS fn
          FROM pg_proc p
         WHERE p.pronamespace = current_schema()::regnamespace AND p.proname LIKE 'pgcoord\_%'
           AND (p.prorettype = 'trigger'::regtype OR p.prosecdef)
    LOOP
        EXECUTE format('ALTER FUNCTION %s SET search_path = %I, pg_temp', r.fn, current_schema());
    END LOOP;
END
$body$;
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
DO $body$
DECLARE
    r record;
BEGIN
    EXECUTE format('ALTER FUNCTION pgcoord_fence_guard() SET search_path = %I', current_schema());
    ALTER FUNCTION pgcoord_retire() RESET search_path;
    ALTER FUNCTION pgcoord_refuse_truncate() RESET search_path;
    FOR r IN
        SELECT d.def
          FROM (SELECT pg_get_functiondef(p.oid) AS def
                  FROM pg_proc p
                 WHERE p.pronamespace = current_schema()::regnamespace AND p.proname LIKE 'pgcoord\_%' AND p.prokind = 'f'
                OFFSET 0) d
         WHERE d.def ~ 'pgcoord_wake_tag\(p_[a-z_]+\)'
    LOOP
        EXECUTE regexp_replace(r.def, 'pgcoord_wake_tag\((p_[a-z_]+)\)', '\1', 'g');
    END LOOP;
END
$body$;
-- +goose StatementEnd
DROP FUNCTION pgcoord_wake_tag(text);
