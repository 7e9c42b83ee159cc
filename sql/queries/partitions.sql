-- Partition groups (package partition; migration 00018).

-- name: PartitionCreate :one
SELECT g.* FROM pgcoord_partition_create(@group_name::text, @partitions::int) g;

-- name: PartitionHeartbeat :one
-- wake_at is a day away when nothing is bound to change without a notification.
SELECT h.owned::int[] AS owned, h.tokens::bigint[] AS tokens, h.revoke::int[] AS revoke,
       h.expires_at::timestamptz AS expires_at, h.partitions::int AS partitions, h.epoch::bigint AS epoch,
       coalesce(h.wake_at, h.db_now + interval '1 day')::timestamptz AS wake_at, h.db_now::timestamptz AS db_now
FROM pgcoord_partition_heartbeat(@group_name::text, @member::text, @weight::int, @ttl::interval,
                                 @release::int[], @joining::boolean) h;

-- name: PartitionOwned :one
-- A member's read of its grants, as PartitionHeartbeat answers, with whether the member is
-- live (else it holds nothing, and expires_at is db_now) and how many partitions planned for
-- it are still free.
SELECT (o.expires_at IS NOT NULL)::boolean AS live, o.owned::int[] AS owned, o.tokens::bigint[] AS tokens,
       o.revoke::int[] AS revoke, coalesce(o.expires_at, o.db_now)::timestamptz AS expires_at, o.partitions::int AS partitions, o.epoch::bigint AS epoch,
       coalesce(o.wake_at, o.db_now + interval '1 day')::timestamptz AS wake_at, o.db_now::timestamptz AS db_now,
       o.pending::int AS pending
FROM pgcoord_partition_owned(@group_name::text, @member::text) o;

-- name: PartitionLeave :one
SELECT pgcoord_partition_leave(@group_name::text, @member::text)::int AS released;

-- name: PartitionCheck :many
SELECT p.partition FROM pgcoord_partition_check(@group_name::text, @partition::int, @member::text, @fence_token::bigint) p;

-- name: PartitionDrain :one
SELECT pgcoord_partition_drain(@group_name::text, @member::text, nullif(@actor::text, ''))::boolean AS drained;

-- name: PartitionRebalance :one
SELECT pgcoord_partition_rebalance(@group_name::text, nullif(@actor::text, ''))::boolean AS changed;

-- name: PartitionResize :one
SELECT g.* FROM pgcoord_partition_resize(@group_name::text, @partitions::int, nullif(@actor::text, '')) g;

-- name: PartitionChannel :one
SELECT pgcoord_channel('partitions')::text AS channel;

-- name: PartitionGroups :many
-- Groups after after (name order), with their live members, their partitions without a live
-- grant, how long the oldest of these has been without one (since it was freed, or since
-- its grant lapsed), and the grants made so far.
SELECT g.name, g.partitions, g.epoch, g.generation, g.created_at, g.updated_at,
       (SELECT count(*) FROM pgcoord_partition_members m
         WHERE m.group_name = g.name AND m.expires_at > pgcoord_now())::bigint AS members,
       s.unowned::bigint AS unowned, s.unowned_seconds::float8 AS unowned_seconds, s.grants::bigint AS grants,
       pgcoord_now()::timestamptz AS db_now
FROM pgcoord_partition_groups g
CROSS JOIN LATERAL (
    SELECT count(*) FILTER (WHERE p.partition < g.partitions AND (p.holder IS NULL OR p.expires_at <= pgcoord_now())) AS unowned,
           coalesce(extract(epoch FROM pgcoord_now() - min(coalesce(p.free_since, p.expires_at))
                    FILTER (WHERE p.partition < g.partitions AND (p.holder IS NULL OR p.expires_at <= pgcoord_now()))), 0) AS unowned_seconds,
           coalesce(sum(p.grants), 0) AS grants
      FROM pgcoord_partitions p WHERE p.group_name = g.name
) s
WHERE g.name > @after::text
ORDER BY g.name
LIMIT @max_rows::int;

-- name: PartitionGroup :one
-- The group named group_name as PartitionGroups reads it (no row: there is none).
SELECT g.name, g.partitions, g.epoch, g.generation, g.created_at, g.updated_at,
       (SELECT count(*) FROM pgcoord_partition_members m
         WHERE m.group_name = g.name AND m.expires_at > pgcoord_now())::bigint AS members,
       s.unowned::bigint AS unowned, s.unowned_seconds::float8 AS unowned_seconds, s.grants::bigint AS grants,
       pgcoord_now()::timestamptz AS db_now
FROM pgcoord_partition_groups g
CROSS JOIN LATERAL (
    SELECT count(*) FILTER (WHERE p.partition < g.partitions AND (p.holder IS NULL OR p.expires_at <= pgcoord_now())) AS unowned,
           coalesce(extract(epoch FROM pgcoord_now() - min(coalesce(p.free_since, p.expires_at))
                    FILTER (WHERE p.partition < g.partitions AND (p.holder IS NULL OR p.expires_at <= pgcoord_now()))), 0) AS unowned_seconds,
           coalesce(sum(p.grants), 0) AS grants
      FROM pgcoord_partitions p WHERE p.group_name = g.name
) s
WHERE g.name = @group_name::text;

-- name: PartitionMembers :many
SELECT m.member, m.weight, m.joined_at, m.expires_at, m.draining_at, m.draining_by,
       (SELECT count(*) FROM pgcoord_partitions p
         WHERE p.group_name = m.group_name AND p.holder = m.member AND p.expires_at > pgcoord_now())::bigint AS owns,
       (SELECT count(*) FROM pgcoord_partitions p
         WHERE p.group_name = m.group_name AND p.target = m.member)::bigint AS planned,
       pgcoord_now()::timestamptz AS db_now
FROM pgcoord_partition_members m
WHERE m.group_name = @group_name::text
ORDER BY m.member;

-- name: PartitionList :many
-- The partitions of a group, in order: planned owner and current grant.
-- (A grant whose expires_at is not after db_now has lapsed.)
SELECT p.partition, p.target, p.holder,
       p.fence_token, p.epoch, p.acquired_at, p.expires_at, p.free_since, p.grants, pgcoord_now()::timestamptz AS db_now
FROM pgcoord_partitions p
WHERE p.group_name = @group_name::text
ORDER BY p.partition;
