-- A partition's handoff (issue 31: from a member's death to the new owner's first write, at
-- most twice a lease's handoff) took three calls: the leave, which freed the partition; the
-- survivor's heartbeat, woken by the leave's notification, which granted it; the write.
-- Now the call that frees a partition grants it to the member the plan gives it to, in
-- the same transaction: a leave grants the leaver's partitions, and a heartbeat the
-- partitions it releases (after their OnRevoke returned). Revoke-before-grant holds as
-- before: only a free partition is granted, and only to a live member, expiring with that
-- member's lease (as the grants its own heartbeats renew). The new owner learns of the
-- grant without a write: a member woken by a notification reads its grants
-- (pgcoord_partition_owned: no lock, no commit to wait for), and heartbeats only when the
-- read shows a partition planned for it that is still free (granted by nobody yet: a
-- transaction held it, an older epoch's grant lasts, or its holder's grant expired).
-- A heartbeat's empty release no longer costs an UPDATE.
--
-- And the functions read partitions by plain index scans, never bitmap scans: a handoff
-- updates a partition's row several times (its release, its target, its grant), each
-- update changes an indexed column (no HOT update), and until vacuum comes a bitmap scan
-- visits every dead version its index still points to (282 index entries for a group of 2
-- partitions, seen during a bench run), where an index scan marks the dead entries it met
-- and skips them after. The leave of partition.handoff went from 1.02-1.13 ms to
-- 0.79-0.90 ms (three runs each), and a rebalance of 10,000 partitions costs what it did.

-- +goose Up
-- pgcoord_partition_grant grants, in a group whose row the caller locked (of epoch p_epoch
-- and p_partitions partitions), the free partitions planned for p_member, or (p_member
-- NULL) the free ones of p_parts, each to the live member the plan gives it to, under a new
-- token recorded in the partition's fence register, expiring with that member's lease. It
-- grants nothing while a grant of an older epoch lasts, and skips the partitions a
-- transaction holds (a pgcoord_partition_check of the last holder, FOR KEY SHARE, or a
-- fence check of the partition's register): this transaction holds the group's row, and
-- waiting would stall every heartbeat of the group; the planned owner's next heartbeat
-- tries them again. It returns how many it granted.
-- +goose StatementBegin
CREATE FUNCTION pgcoord_partition_grant(p_group text, p_epoch bigint, p_partitions integer, p_member text, p_parts integer[])
RETURNS integer LANGUAGE plpgsql
SET enable_seqscan = off
SET enable_bitmapscan = off
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    v_now timestamptz := pgcoord_now();
    v_grant integer[];
    v_n integer;
BEGIN
    IF EXISTS (SELECT FROM pgcoord_partitions p
                WHERE p.group_name = p_group AND p.holder IS NOT NULL AND p.expires_at > v_now AND p.epoch < p_epoch) THEN
        RETURN 0;
    END IF;
    IF p_member IS NOT NULL THEN
        v_grant := ARRAY(
            SELECT p.partition FROM pgcoord_partitions p
             WHERE p.group_name = p_group AND p.target = p_member AND p.partition < p_partitions
               AND (p.holder IS NULL OR p.expires_at <= v_now)
             ORDER BY p.partition
               FOR UPDATE SKIP LOCKED);
    ELSE
        v_grant := ARRAY(
            SELECT p.partition FROM pgcoord_partitions p
             WHERE p.group_name = p_group AND p.partition = ANY (p_parts) AND p.partition < p_partitions
               AND p.target IS NOT NULL AND (p.holder IS NULL OR p.expires_at <= v_now)
             ORDER BY p.partition
               FOR UPDATE SKIP LOCKED);
    END IF;
    IF cardinality(v_grant) = 0 THEN
        RETURN 0;
    END IF;
    -- Their fence registers too: a register a transaction holds (a fence check of the
    -- partition) is skipped with its partition.
    v_grant := ARRAY(
        SELECT x FROM unnest(v_grant) x
         WHERE EXISTS (SELECT FROM pgcoord_fences f WHERE f.resource = pgcoord_partition_resource(p_group, x)
                          FOR UPDATE SKIP LOCKED)
            OR NOT EXISTS (SELECT FROM pgcoord_fences f WHERE f.resource = pgcoord_partition_resource(p_group, x)));
    -- Each grant's token goes to its resource's fence register at once.
    WITH x AS (
        UPDATE pgcoord_partitions p
           SET holder = p.target, fence_token = pgcoord_next_token(), epoch = p_epoch, acquired_at = v_now,
               expires_at = m.expires_at, free_since = NULL, grants = p.grants + 1
          FROM pgcoord_partition_members m
         WHERE p.group_name = p_group AND p.partition = ANY (v_grant)
           AND m.group_name = p_group AND m.member = p.target AND m.expires_at > v_now
        RETURNING p.partition, p.fence_token
    )
    SELECT count(pgcoord_fence_record(pgcoord_partition_resource(p_group, x.partition), x.fence_token))
      INTO v_n FROM x;
    RETURN v_n;
END
$$;
-- +goose StatementEnd

-- pgcoord_partition_heartbeat is a member's call, every third of its TTL, and when a read of
-- its grants (pgcoord_partition_owned), which the group's notification prompts, shows a
-- partition planned for it still free: it releases the partitions of p_release it holds
-- (their OnRevoke returned), joins the group or renews the member's lease (weight 1 to
-- 1000, TTL as a lease's; p_join clears a drain: a new process of the member), recomputes
-- the plan if the membership changed, grants the partitions it released to the members
-- the plan gives them to, renews the member's live grants, and grants it the partitions
-- the plan gives it that are free (see pgcoord_partition_grant).
-- It returns the partitions the member holds with their tokens (all expiring at
-- expires_at), those of them it must release (revoke: the plan moved them, or a resize
-- did), the group's size and epoch, and when something may change without a notification
-- (a lease of another member or a grant the member waits for expires; NULL: nothing).
-- An unknown group raises P0002.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pgcoord_partition_heartbeat(
    p_group text, p_member text, p_weight integer, p_ttl interval, p_release integer[] DEFAULT '{}', p_join boolean DEFAULT false
) RETURNS TABLE (owned integer[], tokens bigint[], revoke integer[], expires_at timestamptz, partitions integer,
                 epoch bigint, wake_at timestamptz, db_now timestamptz)
LANGUAGE plpgsql
SET enable_seqscan = off
SET enable_bitmapscan = off
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := pgcoord_now();
    g pgcoord_partition_groups;
    m pgcoord_partition_members;
    v_changed boolean;
    v_freed integer[];
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

    IF cardinality(p_release) > 0 THEN
        WITH x AS (
            UPDATE pgcoord_partitions p SET holder = NULL, expires_at = NULL, free_since = v_now
             WHERE p.group_name = p_group AND p.partition = ANY (p_release) AND p.holder = p_member
            RETURNING p.partition
        )
        SELECT array_agg(x.partition) INTO v_freed FROM x;
    END IF;

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
    IF v_freed IS NOT NULL THEN
        -- They go to their next owners now; the notification tells those to look.
        PERFORM pgcoord_partition_grant(p_group, g.epoch, g.partitions, NULL, v_freed);
        PERFORM pg_notify(pgcoord_channel('partitions'), pgcoord_wake_tag(p_group));
    END IF;

    UPDATE pgcoord_partitions p SET expires_at = v_now + p_ttl
     WHERE p.group_name = p_group AND p.holder = p_member AND p.expires_at > v_now;
    PERFORM pgcoord_partition_grant(p_group, g.epoch, g.partitions, p_member, NULL);
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

-- pgcoord_partition_leave releases every partition the member holds, removes it from the
-- group and grants its partitions to the members the plan now gives them to (see
-- pgcoord_partition_grant), in one transaction. It returns how many it held; an unknown
-- group raises P0002.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pgcoord_partition_leave(p_group text, p_member text) RETURNS integer LANGUAGE plpgsql
SET enable_bitmapscan = off
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    v_now timestamptz := pgcoord_now();
    g pgcoord_partition_groups;
    v_freed integer[];
BEGIN
    IF NOT pgcoord_name_ok(p_member) THEN
        PERFORM pgcoord_refuse_name('partition member', p_member);
    END IF;
    PERFORM pgcoord_grant_prepare(NULL);
    g := pgcoord_partition_lock(p_group);
    -- Released first, then granted: no grant is made while another lasts, not even within
    -- the transaction.
    WITH x AS (
        UPDATE pgcoord_partitions p SET holder = NULL, expires_at = NULL, free_since = v_now
         WHERE p.group_name = p_group AND p.holder = p_member
        RETURNING p.partition
    )
    SELECT array_agg(x.partition) INTO v_freed FROM x;
    DELETE FROM pgcoord_partition_members m WHERE m.group_name = p_group AND m.member = p_member;
    IF FOUND THEN
        PERFORM pgcoord_partition_plan(p_group);
    END IF;
    IF v_freed IS NOT NULL THEN
        PERFORM pgcoord_partition_grant(p_group, g.epoch, g.partitions, NULL, v_freed);
        PERFORM pg_notify(pgcoord_channel('partitions'), pgcoord_wake_tag(p_group));
    END IF;
    RETURN coalesce(cardinality(v_freed), 0);
END
$$;
-- +goose StatementEnd

-- pgcoord_partition_owned reads what a heartbeat of p_member would answer about its grants,
-- without a write, a lock or a renewal: the partitions it holds with their tokens, those of
-- them to release, when they expire (NULL: the member is not live in the group, and holds
-- nothing), the group's size and epoch, when something may change without a notification
-- (as the heartbeat says), and how many partitions the plan gives the member that are still
-- free (pending: its heartbeat would try to grant them). A member woken by the group's
-- notification reads this rather than heartbeat. An unknown group raises P0002.
-- +goose StatementBegin
CREATE FUNCTION pgcoord_partition_owned(p_group text, p_member text)
RETURNS TABLE (owned integer[], tokens bigint[], revoke integer[], expires_at timestamptz, partitions integer,
               epoch bigint, wake_at timestamptz, db_now timestamptz, pending integer)
LANGUAGE plpgsql STABLE
SET enable_seqscan = off
SET enable_bitmapscan = off
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := pgcoord_now();
    g pgcoord_partition_groups;
    v_expires timestamptz;
BEGIN
    PERFORM pgcoord_partition_group_args(p_group, 1);
    IF NOT pgcoord_name_ok(p_member) THEN
        PERFORM pgcoord_refuse_name('partition member', p_member);
    END IF;
    SELECT * INTO g FROM pgcoord_partition_groups x WHERE x.name = p_group;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'pgcoord: partition group % does not exist', quote_literal(p_group)
            USING ERRCODE = 'P0002', HINT = 'Create it first (pgcoord_partition_create).';
    END IF;
    SELECT x.expires_at INTO v_expires FROM pgcoord_partition_members x
     WHERE x.group_name = p_group AND x.member = p_member AND x.expires_at > v_now;
    RETURN QUERY
    SELECT coalesce(array_agg(p.partition ORDER BY p.partition), '{}'),
           coalesce(array_agg(p.fence_token ORDER BY p.partition), '{}'),
           coalesce(array_agg(p.partition ORDER BY p.partition)
                        FILTER (WHERE p.target IS DISTINCT FROM p_member OR p.epoch < g.epoch), '{}'),
           v_expires, g.partitions, g.epoch,
           least((SELECT min(x.expires_at) FROM pgcoord_partition_members x
                   WHERE x.group_name = p_group AND x.member <> p_member),
                 (SELECT min(x.expires_at) FROM pgcoord_partitions x
                   WHERE x.group_name = p_group AND x.target = p_member AND x.holder <> p_member)),
           v_now,
           (SELECT count(*)::integer FROM pgcoord_partitions x
             WHERE x.group_name = p_group AND x.target = p_member AND x.partition < g.partitions
               AND (x.holder IS NULL OR x.expires_at <= v_now))
      FROM pgcoord_partitions p
     WHERE p.group_name = p_group AND p.holder = p_member AND p.expires_at > v_now AND v_expires IS NOT NULL;
END
$$;
-- +goose StatementEnd

ALTER FUNCTION pgcoord_partition_plan(text) SET enable_bitmapscan = off;

-- +goose Down
ALTER FUNCTION pgcoord_partition_plan(text) RESET enable_bitmapscan;
DROP FUNCTION pgcoord_partition_owned(text, text);
-- pgcoord_partition_heartbeat and pgcoord_partition_leave as 00018 and 00021 made them.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pgcoord_partition_heartbeat(
    p_group text, p_member text, p_weight integer, p_ttl interval, p_release integer[] DEFAULT '{}', p_join boolean DEFAULT false
) RETURNS TABLE (owned integer[], tokens bigint[], revoke integer[], expires_at timestamptz, partitions integer,
                 epoch bigint, wake_at timestamptz, db_now timestamptz)
LANGUAGE plpgsql
SET enable_seqscan = off
SET jit = off
SET plan_cache_mode = force_generic_plan
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

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pgcoord_partition_leave(p_group text, p_member text) RETURNS integer LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
AS $$
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
DROP FUNCTION pgcoord_partition_grant(text, bigint, integer, text, integer[]);
