-- Partition groups (issue 31): a group's M partitions spread over whichever of its members
-- are alive, balanced by weight, sticky, each partition owned by one member at a time under
-- a fence token of its own.
--
-- A member is a row of pgcoord_partition_members whose lease (expires_at) its process
-- renews by heartbeat (pgcoord_partition_heartbeat), on the database clock. The plan
-- (pgcoord_partitions.target) gives each partition to one live member; it is computed in
-- the database, under the group's row lock, whenever the membership changes (a join, a
-- weight, a leave, an expiry, a drain, a resize), so every member reads the same plan:
--   * quotas: member i gets floor(M * w_i / W) partitions, and the R left over go one each
--     to the members with the largest remainders (then those holding more now, then by
--     name): each member's count is within one of its weighted share M * w_i / W;
--   * stickiness: a member keeps the partitions it holds (or, while a move waits, is
--     given), up to its quota, lowest numbers first; only the others move, the free ones
--     (lowest first) to the members below quota (by name), so a join moves at most the new
--     member's quota, and a leave only the leaver's partitions.
-- A grant (holder, fence_token, expires_at) follows the plan only when the partition is
-- free: its holder released it (after its OnRevoke returned) or its grant expired. So a
-- partition never has two live grants, and a move is revoke, then grant. Each grant takes
-- a new token (pgcoord_next_token: increasing across owners, resizes and failovers) and
-- records it in the fence register of the resource '<group>#<partition>' (package fenced):
-- from the grant on, the register refuses every older token, before the new owner writes.
-- pgcoord_partition_check is the strict check: it holds the grant until the caller's
-- transaction ends.
--
-- A resize bumps the group's epoch and revokes every grant: no grant of the new epoch is
-- made while one of an older epoch lasts, so no key is served under two partition counts
-- at once (a key's partition depends on M, see pgcoord_key_partition).
--
-- Changes are announced on pgcoord_channel('partitions') with the group's wake tag; the
-- operators' changes (drain, rebalance, resize) are audited.

-- +goose Up
CREATE TABLE pgcoord_partition_groups (
    name        text        PRIMARY KEY CHECK (octet_length(name) BETWEEN 1 AND 200),
    partitions  integer     NOT NULL CHECK (partitions BETWEEN 1 AND 65536),
    -- Bumped by a resize: no grant of this epoch while a grant of an older one lasts.
    epoch       bigint      NOT NULL DEFAULT 1,
    -- Bumped by every change of the plan.
    generation  bigint      NOT NULL DEFAULT 1,
    created_at  timestamptz NOT NULL,
    updated_at  timestamptz NOT NULL
);

COMMENT ON TABLE pgcoord_partition_groups IS 'pgcoord: partition groups, their size and epoch';

CREATE TABLE pgcoord_partition_members (
    group_name  text        NOT NULL REFERENCES pgcoord_partition_groups (name) ON DELETE CASCADE,
    member      text        NOT NULL CHECK (octet_length(member) BETWEEN 1 AND 255),
    weight      integer     NOT NULL CHECK (weight BETWEEN 1 AND 1000),
    joined_at   timestamptz NOT NULL,
    expires_at  timestamptz NOT NULL,
    -- Set by pgcoord_partition_drain: the plan gives it nothing until it joins again.
    draining_at timestamptz,
    draining_by text,
    PRIMARY KEY (group_name, member)
);

COMMENT ON TABLE pgcoord_partition_members IS 'pgcoord: the members of partition groups and their leases';

CREATE TABLE pgcoord_partitions (
    group_name  text        NOT NULL REFERENCES pgcoord_partition_groups (name) ON DELETE CASCADE,
    partition   integer     NOT NULL CHECK (partition >= 0),
    -- The member the plan gives it to; NULL when no member is live (or past a resize down).
    target      text,
    -- The current grant: NULL holder when free. fence_token and epoch are the last grant's.
    holder      text,
    fence_token bigint      NOT NULL DEFAULT 0,
    epoch       bigint      NOT NULL DEFAULT 0,
    acquired_at timestamptz,
    expires_at  timestamptz,
    -- Since when it has had no live grant (NULL while granted), and how many grants it had.
    free_since  timestamptz,
    grants      bigint      NOT NULL DEFAULT 0,
    PRIMARY KEY (group_name, partition),
    CHECK ((holder IS NULL) = (expires_at IS NULL))
);

COMMENT ON TABLE pgcoord_partitions IS 'pgcoord: each partition''s planned owner and current grant';

CREATE INDEX pgcoord_partitions_target ON pgcoord_partitions (group_name, target);
CREATE INDEX pgcoord_partitions_holder ON pgcoord_partitions (group_name, holder) WHERE holder IS NOT NULL;
-- A heartbeat asks whether a grant of an older epoch lasts: without this, a read of every
-- held partition of the group.
CREATE INDEX pgcoord_partitions_epoch ON pgcoord_partitions (group_name, epoch) WHERE holder IS NOT NULL;

CREATE TRIGGER pgcoord_refuse_truncate BEFORE TRUNCATE ON pgcoord_partitions
    FOR EACH STATEMENT EXECUTE FUNCTION pgcoord_refuse_truncate();

-- pgcoord_partition_resource is the fence resource of a partition: '<group>#<partition>'.
CREATE FUNCTION pgcoord_partition_resource(p_group text, p_partition integer) RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ SELECT p_group || '#' || p_partition $$;

-- pgcoord_key_partition is the partition of key among p_partitions: jump consistent hash
-- (Lamping and Veach, 2014) of the first 8 bytes of SHA-256 of the key's UTF-8 bytes, read
-- as a big-endian unsigned 64-bit integer. Growing the count from M to M' moves a key only
-- to one of the new partitions M .. M'-1, and about (M'-M)/M' of the keys. The Go library's
-- partition.KeyPartition computes the same.
-- +goose StatementBegin
CREATE FUNCTION pgcoord_key_partition(p_key text, p_partitions integer) RETURNS integer
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    v_key numeric;
    b bigint := -1;
    j bigint := 0;
    v_two64 constant numeric := 18446744073709551616;
BEGIN
    IF p_key IS NULL THEN
        PERFORM pgcoord_refuse('partition key', 'not NULL', NULL);
    END IF;
    IF p_partitions IS NULL OR p_partitions < 1 OR p_partitions > 65536 THEN
        PERFORM pgcoord_refuse('partition count', '1 to 65536', p_partitions::text);
    END IF;
    v_key := ('x' || left(encode(sha256(convert_to(p_key, 'UTF8')), 'hex'), 16))::bit(64)::bigint::numeric;
    IF v_key < 0 THEN
        v_key := v_key + v_two64;
    END IF;
    WHILE j < p_partitions LOOP
        b := j;
        v_key := mod(v_key * 2862933555777941757 + 1, v_two64);
        -- In float8, as the reference and Go compute it.
        j := floor((b + 1)::float8 * (2147483648::float8 / (floor(v_key / 8589934592) + 1)::float8));
    END LOOP;
    RETURN b;
END
$$;
-- +goose StatementEnd

-- pgcoord_partition_group_args refuses a bad group name or count (22004 or 22023).
-- +goose StatementBegin
CREATE FUNCTION pgcoord_partition_group_args(p_group text, p_partitions integer) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF NOT pgcoord_name_ok(p_group) OR octet_length(p_group) > 200 THEN
        PERFORM pgcoord_refuse('partition group', '1 to 200 bytes without control characters',
                               CASE WHEN p_group IS NULL THEN NULL ELSE octet_length(p_group) || ' bytes' END);
    END IF;
    IF p_partitions IS NULL OR p_partitions < 1 OR p_partitions > 65536 THEN
        PERFORM pgcoord_refuse('partition count', '1 to 65536', p_partitions::text);
    END IF;
END
$$;
-- +goose StatementEnd

-- pgcoord_partition_lock locks a group's row for a change of its members or plan, and
-- returns it; an unknown group raises P0002 (no_data_found).
-- +goose StatementBegin
CREATE FUNCTION pgcoord_partition_lock(p_group text) RETURNS pgcoord_partition_groups LANGUAGE plpgsql AS $$
DECLARE
    g pgcoord_partition_groups;
BEGIN
    PERFORM pgcoord_partition_group_args(p_group, 1);
    SELECT * INTO g FROM pgcoord_partition_groups x WHERE x.name = p_group FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'pgcoord: partition group % does not exist', quote_literal(p_group)
            USING ERRCODE = 'P0002', HINT = 'Create it first (pgcoord_partition_create).';
    END IF;
    RETURN g;
END
$$;
-- +goose StatementEnd

-- pgcoord_partition_changed audits an operator's change (p_actor NULL: the session user)
-- and announces it.
-- +goose StatementBegin
CREATE FUNCTION pgcoord_partition_changed(p_group text, p_action text, p_actor text, p_details jsonb)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO pgcoord_audit (at, actor, action, target, details)
    VALUES (pgcoord_now(), coalesce(p_actor, session_user), 'partitions.' || p_action, p_group, coalesce(p_details, '{}'));
    PERFORM pg_notify(pgcoord_channel('partitions'), pgcoord_wake_tag(p_group));
END
$$;
-- +goose StatementEnd

-- pgcoord_partition_plan recomputes the plan of a group whose row the caller locked (see the
-- top of this file): it forgets the members whose lease expired, and gives each partition to
-- a live member that is not draining. It bumps the generation and announces the change
-- when a target changed, and says whether one did.
-- +goose StatementBegin
CREATE FUNCTION pgcoord_partition_plan(p_group text) RETURNS boolean LANGUAGE plpgsql
-- It reads one group's rows by primary key or through its indexes, never by a table scan,
-- and joins its steps (estimated at a row each, as CTEs and arrays are) by hashing, never
-- by a nested loop that would rescan one step per row of another: its cost grows with M,
-- not M squared, even on tables not analyzed yet.
SET enable_seqscan = off
SET enable_nestloop = off
SET jit = off
AS $$
DECLARE
    v_now timestamptz := pgcoord_now();
    v_m integer;
    v_parts integer[];
    v_targets text[];
BEGIN
    SELECT g.partitions INTO v_m FROM pgcoord_partition_groups g WHERE g.name = p_group;
    DELETE FROM pgcoord_partition_members m WHERE m.group_name = p_group AND m.expires_at <= v_now;
    WITH live AS (
        SELECT m.member, m.weight FROM pgcoord_partition_members m
         WHERE m.group_name = p_group AND m.draining_at IS NULL
    ), total AS (
        SELECT sum(l.weight)::bigint AS w FROM live l
    ), cur AS (
        -- Each partition's present owner: its live holder, else the member the plan gives it to.
        SELECT p.partition, CASE WHEN p.holder IS NOT NULL AND p.expires_at > v_now THEN p.holder ELSE p.target END AS owner
          FROM pgcoord_partitions p
         WHERE p.group_name = p_group AND p.partition < v_m
    ), owns AS (
        SELECT c.owner AS member, count(*) AS n FROM cur c WHERE c.owner IS NOT NULL GROUP BY c.owner
    ), share AS (
        SELECT l.member, (v_m::bigint * l.weight) / t.w AS base, (v_m::bigint * l.weight) % t.w AS rem,
               coalesce(o.n, 0) AS owns
          FROM live l CROSS JOIN total t LEFT JOIN owns o ON o.member = l.member
    ), quota AS (
        SELECT s.member,
               s.base + CASE WHEN row_number() OVER (ORDER BY s.rem DESC, s.owns DESC, s.member)
                                  <= v_m - sum(s.base) OVER () THEN 1 ELSE 0 END AS quota
          FROM share s
    ), ranked AS (
        SELECT c.partition, c.owner, row_number() OVER (PARTITION BY c.owner ORDER BY c.partition) AS k
          FROM cur c WHERE c.owner IS NOT NULL
    ), kept AS (
        SELECT r.partition, r.owner FROM ranked r JOIN quota q ON q.member = r.owner WHERE r.k <= q.quota
    ), kept_n AS (
        SELECT k.owner AS member, count(*) AS n FROM kept k GROUP BY k.owner
    ), slots AS (
        SELECT q.member, row_number() OVER (ORDER BY q.member, s.n) AS i
          FROM quota q LEFT JOIN kept_n kn ON kn.member = q.member
         CROSS JOIN LATERAL generate_series(1, q.quota - coalesce(kn.n, 0)) s(n)
    ), freed AS (
        SELECT c.partition, row_number() OVER (ORDER BY c.partition) AS i
          FROM cur c LEFT JOIN kept k ON k.partition = c.partition
         WHERE k.partition IS NULL
    ), plan AS (
        SELECT k.partition, k.owner AS target FROM kept k
        UNION ALL
        SELECT f.partition, s.member FROM freed f LEFT JOIN slots s ON s.i = f.i
        UNION ALL
        SELECT p.partition, NULL FROM pgcoord_partitions p WHERE p.group_name = p_group AND p.partition >= v_m
    )
    SELECT array_agg(pl.partition), array_agg(pl.target) INTO v_parts, v_targets
      FROM plan pl JOIN pgcoord_partitions p ON p.group_name = p_group AND p.partition = pl.partition
     WHERE p.target IS DISTINCT FROM pl.target;
    IF v_parts IS NULL THEN
        RETURN false;
    END IF;
    UPDATE pgcoord_partitions p SET target = u.target
      FROM unnest(v_parts, v_targets) u(partition, target)
     WHERE p.group_name = p_group AND p.partition = u.partition;
    UPDATE pgcoord_partition_groups g SET generation = g.generation + 1, updated_at = v_now WHERE g.name = p_group;
    PERFORM pg_notify(pgcoord_channel('partitions'), pgcoord_wake_tag(p_group));
    RETURN true;
END
$$;
-- +goose StatementEnd

-- pgcoord_partition_create creates a group of p_partitions partitions (1 to 65536; the
-- group's name 1 to 200 bytes), with no member. It returns the group's row; a group of that
-- name and size is returned as it is, one of another size is refused (22023: resize it on
-- purpose, pgcoord_partition_resize).
-- +goose StatementBegin
CREATE FUNCTION pgcoord_partition_create(p_group text, p_partitions integer)
RETURNS pgcoord_partition_groups LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := pgcoord_now();
    g pgcoord_partition_groups;
BEGIN
    PERFORM pgcoord_partition_group_args(p_group, p_partitions);
    INSERT INTO pgcoord_partition_groups AS x (name, partitions, created_at, updated_at)
    VALUES (p_group, p_partitions, v_now, v_now)
    ON CONFLICT (name) DO NOTHING
    RETURNING x.* INTO g;
    IF FOUND THEN
        INSERT INTO pgcoord_partitions (group_name, partition, free_since)
        SELECT p_group, n, v_now FROM generate_series(0, p_partitions - 1) n;
        RETURN g;
    END IF;
    SELECT * INTO g FROM pgcoord_partition_groups x WHERE x.name = p_group;
    IF g.partitions <> p_partitions THEN
        PERFORM pgcoord_refuse('partition count', 'the group''s own (' || g.partitions || '; pgcoord_partition_resize changes it)',
                               p_partitions::text);
    END IF;
    RETURN g;
END
$$;
-- +goose StatementEnd

-- pgcoord_partition_heartbeat is a member's call, every third of its TTL and whenever the
-- group's notification wakes it: it releases the partitions of p_release the member holds
-- (their OnRevoke returned), joins the group or renews the member's lease (weight 1 to
-- 1000, TTL as a lease's; p_join clears a drain: a new process of the member), recomputes
-- the plan if the membership changed, renews the member's live grants, and grants it the
-- partitions the plan gives it that are free (none while a grant of an older epoch lasts).
-- It returns the partitions the member holds with their tokens (all expiring at
-- expires_at), those of them it must release (revoke: the plan moved them, or a resize
-- did), the group's size and epoch, and when something may change without a notification
-- (a lease of another member or a grant the member waits for expires; NULL: nothing).
-- An unknown group raises P0002.
-- +goose StatementBegin
CREATE FUNCTION pgcoord_partition_heartbeat(
    p_group text, p_member text, p_weight integer, p_ttl interval, p_release integer[] DEFAULT '{}', p_join boolean DEFAULT false
) RETURNS TABLE (owned integer[], tokens bigint[], revoke integer[], expires_at timestamptz, partitions integer,
                 epoch bigint, wake_at timestamptz, db_now timestamptz)
LANGUAGE plpgsql
SET enable_seqscan = off
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := pgcoord_now();
    g pgcoord_partition_groups;
    m pgcoord_partition_members;
    v_changed boolean;
    v_released integer;
    v_grant integer[];
    v_registers text[];
BEGIN
    IF NOT pgcoord_name_ok(p_member) THEN
        PERFORM pgcoord_refuse_name('partition member', p_member);
    END IF;
    IF p_weight IS NULL OR p_weight < 1 OR p_weight > 1000 THEN
        PERFORM pgcoord_refuse('partition member weight', '1 to 1000', p_weight::text);
    END IF;
    IF NOT pgcoord_ttl_ok(p_ttl) THEN
        PERFORM pgcoord_refuse('partition member ttl', 'positive, at most 24 hours and without months', p_ttl::text);
    END IF;
    IF p_release IS NULL OR cardinality(p_release) > 65536 THEN
        PERFORM pgcoord_refuse('released partitions', 'an array of at most 65536', cardinality(p_release)::text);
    END IF;
    IF p_join IS NULL THEN
        PERFORM pgcoord_refuse('join', 'true or false', NULL);
    END IF;
    PERFORM pgcoord_grant_prepare(NULL);
    g := pgcoord_partition_lock(p_group);

    UPDATE pgcoord_partitions p SET holder = NULL, expires_at = NULL, free_since = v_now
     WHERE p.group_name = p_group AND p.partition = ANY (p_release) AND p.holder = p_member;
    GET DIAGNOSTICS v_released = ROW_COUNT;

    SELECT * INTO m FROM pgcoord_partition_members x WHERE x.group_name = p_group AND x.member = p_member;
    v_changed := m.member IS NULL OR m.expires_at <= v_now OR m.weight <> p_weight OR (p_join AND m.draining_at IS NOT NULL)
                 OR EXISTS (SELECT FROM pgcoord_partition_members x WHERE x.group_name = p_group AND x.expires_at <= v_now);
    INSERT INTO pgcoord_partition_members AS x (group_name, member, weight, joined_at, expires_at)
    VALUES (p_group, p_member, p_weight, v_now, v_now + p_ttl)
    ON CONFLICT (group_name, member) DO UPDATE
       SET weight = excluded.weight, expires_at = excluded.expires_at,
           joined_at = CASE WHEN x.expires_at <= v_now THEN excluded.joined_at ELSE x.joined_at END,
           draining_at = CASE WHEN p_join THEN NULL ELSE x.draining_at END,
           draining_by = CASE WHEN p_join THEN NULL ELSE x.draining_by END;
    IF v_changed THEN
        PERFORM pgcoord_partition_plan(p_group);
    END IF;
    IF v_released > 0 THEN
        -- The members the released partitions go to are waiting for them.
        PERFORM pg_notify(pgcoord_channel('partitions'), pgcoord_wake_tag(p_group));
    END IF;

    UPDATE pgcoord_partitions p SET expires_at = v_now + p_ttl
     WHERE p.group_name = p_group AND p.holder = p_member AND p.expires_at > v_now;
    IF NOT EXISTS (SELECT FROM pgcoord_partitions p
                    WHERE p.group_name = p_group AND p.holder IS NOT NULL AND p.expires_at > v_now AND p.epoch < g.epoch) THEN
        -- The free partitions the plan gives this member, but those a transaction holds: a
        -- pgcoord_partition_check of the last holder (FOR KEY SHARE, which this FOR UPDATE
        -- waits for) or a fence check of the partition's register. They are skipped, never
        -- waited for: this transaction holds the group's row, and waiting would stall
        -- every heartbeat of the group. The next heartbeat tries them again.
        v_grant := ARRAY(
            SELECT p.partition FROM pgcoord_partitions p
             WHERE p.group_name = p_group AND p.target = p_member AND p.partition < g.partitions
               AND (p.holder IS NULL OR p.expires_at <= v_now)
             ORDER BY p.partition
               FOR UPDATE SKIP LOCKED);
        v_registers := ARRAY(
            SELECT f.resource FROM pgcoord_fences f
             WHERE f.resource = ANY (ARRAY(SELECT pgcoord_partition_resource(p_group, x) FROM unnest(v_grant) x))
             ORDER BY f.resource
               FOR UPDATE SKIP LOCKED);
        v_grant := ARRAY(
            SELECT x FROM unnest(v_grant) x
             WHERE pgcoord_partition_resource(p_group, x) = ANY (v_registers)
                OR NOT EXISTS (SELECT FROM pgcoord_fences f WHERE f.resource = pgcoord_partition_resource(p_group, x)));
        -- Each grant's token goes to its resource's fence register at once.
        WITH x AS (
            UPDATE pgcoord_partitions p
               SET holder = p_member, fence_token = pgcoord_next_token(), epoch = g.epoch, acquired_at = v_now,
                   expires_at = v_now + p_ttl, free_since = NULL, grants = p.grants + 1
             WHERE p.group_name = p_group AND p.partition = ANY (v_grant)
            RETURNING p.partition, p.fence_token
        )
        SELECT count(pgcoord_fence_record(pgcoord_partition_resource(p_group, x.partition), x.fence_token))
          INTO v_released FROM x;
    END IF;
    -- Partitions past a resize down go once free (and no transaction holds them).
    DELETE FROM pgcoord_partitions p
     WHERE (p.group_name, p.partition) IN (
               SELECT x.group_name, x.partition FROM pgcoord_partitions x
                WHERE x.group_name = p_group AND x.partition >= g.partitions AND (x.holder IS NULL OR x.expires_at <= v_now)
                  FOR UPDATE SKIP LOCKED);

    RETURN QUERY
    SELECT coalesce(array_agg(p.partition ORDER BY p.partition), '{}'),
           coalesce(array_agg(p.fence_token ORDER BY p.partition), '{}'),
           coalesce(array_agg(p.partition ORDER BY p.partition)
                        FILTER (WHERE p.target IS DISTINCT FROM p_member OR p.epoch < g.epoch), '{}'),
           v_now + p_ttl, g.partitions, g.epoch,
           least((SELECT min(x.expires_at) FROM pgcoord_partition_members x
                   WHERE x.group_name = p_group AND x.member <> p_member),
                 (SELECT min(x.expires_at) FROM pgcoord_partitions x
                   WHERE x.group_name = p_group AND x.target = p_member AND x.holder <> p_member)),
           v_now
      FROM pgcoord_partitions p
     WHERE p.group_name = p_group AND p.holder = p_member AND p.expires_at > v_now;
END
$$;
-- +goose StatementEnd

-- pgcoord_partition_leave releases every partition the member holds and removes it from
-- the group (its partitions go to the others at once). It returns how many it held; an
-- unknown group raises P0002.
-- +goose StatementBegin
CREATE FUNCTION pgcoord_partition_leave(p_group text, p_member text) RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := pgcoord_now();
    v_n integer;
BEGIN
    IF NOT pgcoord_name_ok(p_member) THEN
        PERFORM pgcoord_refuse_name('partition member', p_member);
    END IF;
    PERFORM pgcoord_partition_lock(p_group);
    UPDATE pgcoord_partitions p SET holder = NULL, expires_at = NULL, free_since = v_now
     WHERE p.group_name = p_group AND p.holder = p_member;
    GET DIAGNOSTICS v_n = ROW_COUNT;
    DELETE FROM pgcoord_partition_members m WHERE m.group_name = p_group AND m.member = p_member;
    IF FOUND THEN
        PERFORM pgcoord_partition_plan(p_group);
    END IF;
    IF v_n > 0 THEN
        PERFORM pg_notify(pgcoord_channel('partitions'), pgcoord_wake_tag(p_group));
    END IF;
    RETURN v_n;
END
$$;
-- +goose StatementEnd

-- pgcoord_partition_check returns the partition's row, locked until the caller's
-- transaction ends, when p_member holds it under p_token (the grant is current, by the
-- database clock); no row otherwise: the partition moved on, and the caller must not write
-- for it. While the row is locked no other grant of the partition is made (a grant locks
-- the row FOR UPDATE, and skips it while it is held); its plan and renewals, which lock it
-- FOR NO KEY UPDATE, go on, so a checking transaction never stalls the group.
-- +goose StatementBegin
CREATE FUNCTION pgcoord_partition_check(p_group text, p_partition integer, p_member text, p_token bigint)
RETURNS SETOF pgcoord_partitions LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pgcoord_partition_group_args(p_group, 1);
    IF p_partition IS NULL OR p_partition < 0 OR p_partition > 65535 THEN
        PERFORM pgcoord_refuse('partition', '0 to 65535', p_partition::text);
    END IF;
    IF NOT pgcoord_name_ok(p_member) THEN
        PERFORM pgcoord_refuse_name('partition member', p_member);
    END IF;
    IF p_token IS NULL OR p_token < 1 THEN
        PERFORM pgcoord_refuse('fence token', 'positive', p_token::text);
    END IF;
    RETURN QUERY
    SELECT p.* FROM pgcoord_partitions p
      JOIN pgcoord_partition_groups g ON g.name = p.group_name
     WHERE p.group_name = p_group AND p.partition = p_partition AND p.holder = p_member AND p.fence_token = p_token
       AND p.expires_at > pgcoord_now() AND p.epoch = g.epoch AND p.partition < g.partitions
       FOR KEY SHARE OF p;
END
$$;
-- +goose StatementEnd

-- pgcoord_partition_drain moves every partition away from a live member (before a deploy):
-- the plan gives it nothing until it leaves or joins again; its grants are revoked as the
-- others' moves are. Audited; false when the member is not live in the group.
-- +goose StatementBegin
CREATE FUNCTION pgcoord_partition_drain(p_group text, p_member text, p_actor text DEFAULT NULL)
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := pgcoord_now();
BEGIN
    IF NOT pgcoord_name_ok(p_member) THEN
        PERFORM pgcoord_refuse_name('partition member', p_member);
    END IF;
    IF p_actor IS NOT NULL AND NOT pgcoord_name_ok(p_actor) THEN
        PERFORM pgcoord_refuse_name('actor', p_actor);
    END IF;
    PERFORM pgcoord_partition_lock(p_group);
    UPDATE pgcoord_partition_members m SET draining_at = v_now, draining_by = coalesce(p_actor, session_user)
     WHERE m.group_name = p_group AND m.member = p_member AND m.expires_at > v_now;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM pgcoord_partition_plan(p_group);
    PERFORM pgcoord_partition_changed(p_group, 'drain', p_actor, jsonb_build_object('member', p_member));
    RETURN true;
END
$$;
-- +goose StatementEnd

-- pgcoord_partition_rebalance recomputes the plan now (forgetting members whose lease
-- expired, which heartbeats otherwise do), audited. It returns whether the plan changed.
-- +goose StatementBegin
CREATE FUNCTION pgcoord_partition_rebalance(p_group text, p_actor text DEFAULT NULL)
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    v_changed boolean;
BEGIN
    IF p_actor IS NOT NULL AND NOT pgcoord_name_ok(p_actor) THEN
        PERFORM pgcoord_refuse_name('actor', p_actor);
    END IF;
    PERFORM pgcoord_partition_lock(p_group);
    v_changed := pgcoord_partition_plan(p_group);
    PERFORM pgcoord_partition_changed(p_group, 'rebalance', p_actor, jsonb_build_object('changed', v_changed));
    RETURN v_changed;
END
$$;
-- +goose StatementEnd

-- pgcoord_partition_resize changes the group's partition count (1 to 65536), audited: a
-- new epoch, whose grants wait until every grant of the old one was released or expired.
-- Returns the group's row.
-- +goose StatementBegin
CREATE FUNCTION pgcoord_partition_resize(p_group text, p_partitions integer, p_actor text DEFAULT NULL)
RETURNS pgcoord_partition_groups LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := pgcoord_now();
    g pgcoord_partition_groups;
    v_old integer;
BEGIN
    PERFORM pgcoord_partition_group_args(p_group, p_partitions);
    IF p_actor IS NOT NULL AND NOT pgcoord_name_ok(p_actor) THEN
        PERFORM pgcoord_refuse_name('actor', p_actor);
    END IF;
    g := pgcoord_partition_lock(p_group);
    IF g.partitions = p_partitions THEN
        RETURN g;
    END IF;
    v_old := g.partitions;
    UPDATE pgcoord_partition_groups x SET partitions = p_partitions, epoch = x.epoch + 1, updated_at = v_now
     WHERE x.name = p_group
    RETURNING x.* INTO g;
    INSERT INTO pgcoord_partitions (group_name, partition, free_since)
    SELECT p_group, n, v_now FROM generate_series(v_old, p_partitions - 1) n
    ON CONFLICT (group_name, partition) DO NOTHING;
    PERFORM pgcoord_partition_plan(p_group);
    PERFORM pgcoord_partition_changed(p_group, 'resize', p_actor,
                                      jsonb_build_object('from', v_old, 'to', p_partitions, 'epoch', g.epoch));
    RETURN g;
END
$$;
-- +goose StatementEnd

-- Retention: pgcoord_gc lists one kind more, partition_members, after those of 00016. A
-- member that leaves deletes its row, and every re-plan of its group deletes the rows of
-- members whose lease expired; a group nobody heartbeats any more keeps the rows of its
-- last members. pgcoord_gc_partition_members deletes, by the database clock, up to
-- p_batch member rows whose lease expired longer than p_older_than ago, skipping groups
-- a member is changing; with p_dry_run it counts them. Groups and their partitions are
-- kept: they are configuration (their last tokens live on in the fence registers).
-- +goose StatementBegin
CREATE FUNCTION pgcoord_gc_partition_members(p_older_than interval, p_batch integer, p_dry_run boolean)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    v_cutoff timestamptz := pgcoord_now() - p_older_than;
    v_n bigint;
BEGIN
    IF p_dry_run THEN
        SELECT count(*) INTO v_n FROM pgcoord_partition_members m WHERE m.expires_at < v_cutoff;
        RETURN v_n;
    END IF;
    DELETE FROM pgcoord_partition_members m
     WHERE (m.group_name, m.member) IN (
               SELECT x.group_name, x.member FROM pgcoord_partition_members x
                WHERE x.expires_at < v_cutoff
                  AND x.group_name IN (SELECT g.name FROM pgcoord_partition_groups g
                                        WHERE g.name = x.group_name FOR NO KEY UPDATE SKIP LOCKED)
                LIMIT p_batch)
       AND m.expires_at < v_cutoff;
    GET DIAGNOSTICS v_n = ROW_COUNT;
    RETURN v_n;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pgcoord_gc(p_older_than interval, p_batch integer DEFAULT 10000, p_dry_run boolean DEFAULT false)
RETURNS TABLE (kind text, removed bigint) LANGUAGE plpgsql AS $$
BEGIN
    -- The core checks the arguments first.
    RETURN QUERY SELECT g.kind, g.removed FROM pgcoord_gc_core(p_older_than, p_batch, p_dry_run) g;
    kind := 'ratelimit'; removed := pgcoord_gc_ratelimit(p_batch, p_dry_run); RETURN NEXT;
    kind := 'schedule_handlers'; removed := pgcoord_gc_schedule_handlers(p_older_than, p_batch, p_dry_run); RETURN NEXT;
    kind := 'partition_members'; removed := pgcoord_gc_partition_members(p_older_than, p_batch, p_dry_run); RETURN NEXT;
END
$$;
-- +goose StatementEnd

-- +goose Down
-- pgcoord_gc as 00016 made it.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pgcoord_gc(p_older_than interval, p_batch integer DEFAULT 10000, p_dry_run boolean DEFAULT false)
RETURNS TABLE (kind text, removed bigint) LANGUAGE plpgsql AS $$
BEGIN
    -- The core checks the arguments first.
    RETURN QUERY SELECT g.kind, g.removed FROM pgcoord_gc_core(p_older_than, p_batch, p_dry_run) g;
    kind := 'ratelimit'; removed := pgcoord_gc_ratelimit(p_batch, p_dry_run); RETURN NEXT;
    kind := 'schedule_handlers'; removed := pgcoord_gc_schedule_handlers(p_older_than, p_batch, p_dry_run); RETURN NEXT;
END
$$;
-- +goose StatementEnd
DROP FUNCTION pgcoord_gc_partition_members(interval, integer, boolean);
DROP FUNCTION pgcoord_partition_resize(text, integer, text);
DROP FUNCTION pgcoord_partition_rebalance(text, text);
DROP FUNCTION pgcoord_partition_drain(text, text, text);
DROP FUNCTION pgcoord_partition_check(text, integer, text, bigint);
DROP FUNCTION pgcoord_partition_leave(text, text);
DROP FUNCTION pgcoord_partition_heartbeat(text, text, integer, interval, integer[], boolean);
DROP FUNCTION pgcoord_partition_create(text, integer);
DROP FUNCTION pgcoord_partition_plan(text);
DROP FUNCTION pgcoord_partition_changed(text, text, text, jsonb);
DROP FUNCTION pgcoord_partition_lock(text);
DROP FUNCTION pgcoord_partition_group_args(text, integer);
DROP FUNCTION pgcoord_key_partition(text, integer);
DROP FUNCTION pgcoord_partition_resource(text, integer);
DROP TABLE pgcoord_partitions;
DROP TABLE pgcoord_partition_members;
DROP TABLE pgcoord_partition_groups;
