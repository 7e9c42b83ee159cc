-- The audit log is append-only for every role but its owner, and records who logged in.
--
-- With the grants of docs/security.md an application role could DELETE and UPDATE rows of
-- pgcoord_audit (erasing or rewriting what operators did), and the actor was whatever the
-- CLI's --actor said. From this migration:
--   - session_role records the database role the session logged in as (session_user) beside
--     the claimed actor. For a role that does not own the table it is always session_user,
--     whatever the INSERT says, and `at` is always the database clock (pgcoord_now()).
--     Rows written before this migration have session_role '' (not known).
--   - UPDATE, DELETE and TRUNCATE are refused (SQLSTATE 42501) unless the current role owns
--     the table or is a member of its owner — whatever privileges were granted. The owner
--     prunes the log with a plain DELETE; pgcoord_gc never collects it.
-- `pgcoord doctor` (check "audit") reports a role other than the owner with UPDATE, DELETE,
-- TRUNCATE or TRIGGER on the table, and a missing or disabled trigger.

-- +goose Up
-- Existing rows: '' (the role that wrote them is not known); new rows: session_user.
ALTER TABLE pgcoord_audit ADD COLUMN session_role text NOT NULL DEFAULT '';
ALTER TABLE pgcoord_audit ALTER COLUMN session_role SET DEFAULT session_user;
COMMENT ON COLUMN pgcoord_audit.session_role IS
    'pgcoord: the role the writing session logged in as (session_user); '''' for rows older than the column';

-- pgcoord_audit_guard is the trigger function of both triggers below. For the table's owner
-- (current_user is the owner or a member of it) it changes and refuses nothing. For any
-- other role: an INSERT gets session_role := session_user and at := pgcoord_now(); an
-- UPDATE, DELETE or TRUNCATE is refused with SQLSTATE 42501 (insufficient_privilege).
-- Its search_path is pinned to the schema pgcoord is installed in, then pg_temp.
-- +goose StatementBegin
CREATE FUNCTION pgcoord_audit_guard() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    v_owner oid;
BEGIN
    SELECT c.relowner INTO v_owner FROM pg_catalog.pg_class c WHERE c.oid = TG_RELID;
    IF pg_catalog.pg_has_role(current_user, v_owner, 'MEMBER') THEN
        RETURN NEW;
    END IF;
    IF TG_OP = 'INSERT' THEN
        NEW.session_role := session_user;
        NEW.at := pgcoord_now();
        RETURN NEW;
    END IF;
    RAISE EXCEPTION 'pgcoord: the audit log is append-only: % refused for role % (only its owner %, or a member of it, may)',
        TG_OP, current_user, v_owner::regrole
        USING ERRCODE = 'insufficient_privilege',
              HINT = 'Prune old entries as the owner: DELETE FROM pgcoord_audit WHERE at < ...; revoke UPDATE, DELETE and TRUNCATE on pgcoord_audit from other roles.';
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
DO $body$
BEGIN
    EXECUTE format('ALTER FUNCTION pgcoord_audit_guard() SET search_path = %I, pg_temp', current_schema());
END
$body$;
-- +goose StatementEnd

COMMENT ON FUNCTION pgcoord_audit_guard() IS
    'pgcoord: keeps pgcoord_audit append-only for every role but its owner, and stamps session_role and at';

CREATE TRIGGER pgcoord_audit_stamp BEFORE INSERT ON pgcoord_audit
    FOR EACH ROW EXECUTE FUNCTION pgcoord_audit_guard();
-- A statement trigger fires even when no row matches, and is the only kind TRUNCATE has.
CREATE TRIGGER pgcoord_audit_append_only BEFORE UPDATE OR DELETE OR TRUNCATE ON pgcoord_audit
    FOR EACH STATEMENT EXECUTE FUNCTION pgcoord_audit_guard();

-- +goose Down
DROP TRIGGER pgcoord_audit_append_only ON pgcoord_audit;
DROP TRIGGER pgcoord_audit_stamp ON pgcoord_audit;
DROP FUNCTION pgcoord_audit_guard();
ALTER TABLE pgcoord_audit DROP COLUMN session_role;
