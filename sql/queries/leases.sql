-- Every lease operation goes through the SQL API functions of 00002_leases.sql, so Go and
-- plain SQL callers share one implementation. Each query also returns the database clock
-- (db_now) so the caller can tell how much of the TTL remains without trusting its own clock.
-- The hot-path queries (acquire, wait, renew) return only what a Lease needs.

-- name: AcquireLease :one
SELECT l.name, l.fence_token, l.holder, l.acquired_at, l.expires_at, pgcoord_now()::timestamptz AS db_now
FROM pgcoord_lease_acquire(@name::text, @holder::text, @ttl::interval, @metadata::jsonb,
                           nullif(@sync_commit::text, '')) l;

-- name: WaitLease :one
SELECT l.name, l.fence_token, l.holder, l.acquired_at, l.expires_at, pgcoord_now()::timestamptz AS db_now
FROM pgcoord_lease_wait(@name::text, @holder::text, @ttl::interval, @want::interval, @metadata::jsonb,
                        nullif(@sync_commit::text, '')) l;

-- name: RenewLease :one
SELECT l.name, l.fence_token, l.holder, l.acquired_at, l.expires_at, pgcoord_now()::timestamptz AS db_now
FROM pgcoord_lease_renew(@name::text, @holder::text, @fence_token::bigint, @ttl::interval, @durable::boolean) l;

-- name: ReleaseLease :execrows
SELECT 1 FROM pgcoord_lease_release(@name::text, @holder::text, @fence_token::bigint);

-- The coalesced forms of the three above (leases/coalesce.go): the concurrent calls of one
-- process on one pool, as arrays in the order to run them (by name, so that two batches lock
-- rows in one order), in one statement and one commit. i is the call's position (from 1);
-- a call that is refused or finds its grant gone returns no row. A batch holds the rows it
-- has written while it runs the next calls, so it must never wait long for a row another
-- transaction holds — that transaction might be waiting for one of the batch's rows, and
-- one of the two would die in a deadlock. So a batch sets lock_timeout for its transaction
-- before any call runs (in the bound of the series of positions, computed before the series
-- yields its first row to the calls): a batch that would wait longer fails (55P03), rolls
-- back having done nothing, and its calls are sent one by one.

-- name: AcquireLeases :many
SELECT a.i::int AS i, l.name, l.fence_token, l.holder, l.acquired_at, l.expires_at, pgcoord_now()::timestamptz AS db_now
FROM generate_series(1, cardinality(@names::text[]) + 0 * length(set_config('lock_timeout', @lock_timeout::text, true))) AS a(i)
CROSS JOIN LATERAL pgcoord_lease_acquire((@names::text[])[a.i], (@holders::text[])[a.i], (@ttls::interval[])[a.i],
                                         (@metadata::jsonb[])[a.i], nullif(@sync_commit::text, '')) l;

-- name: RenewLeases :many
SELECT a.i::int AS i, l.name, l.fence_token, l.holder, l.acquired_at, l.expires_at, pgcoord_now()::timestamptz AS db_now
FROM generate_series(1, cardinality(@names::text[]) + 0 * length(set_config('lock_timeout', @lock_timeout::text, true))) AS a(i)
CROSS JOIN LATERAL pgcoord_lease_renew((@names::text[])[a.i], (@holders::text[])[a.i], (@fence_tokens::bigint[])[a.i],
                                       (@ttls::interval[])[a.i], @durable::boolean) l;

-- name: ReleaseLeases :many
SELECT a.i::int AS i
FROM generate_series(1, cardinality(@names::text[]) + 0 * length(set_config('lock_timeout', @lock_timeout::text, true))) AS a(i)
CROSS JOIN LATERAL pgcoord_lease_release((@names::text[])[a.i], (@holders::text[])[a.i], (@fence_tokens::bigint[])[a.i]) l;

-- name: ExpireLease :one
SELECT l.*, pgcoord_now()::timestamptz AS db_now
FROM pgcoord_lease_expire(@name::text, @expired_by::text) l;

-- name: CheckLease :one
SELECT l.* FROM pgcoord_lease_check(@name::text, @holder::text, @fence_token::bigint) l;

-- name: GetLease :one
SELECT l.*, pgcoord_now()::timestamptz AS db_now
FROM pgcoord_leases l WHERE l.name = @name::text;

-- name: ListLeases :many
-- prefix ('' for all) matches by starts_with, exactly ('%' and '_' are plain characters); the
-- bound name >= prefix starts the primary key's index scan at the prefix in any collation.
-- There is no upper bound (one is exact only in the C collation), so a page that finds
-- fewer matches than max_rows reads the index on to its end.
SELECT l.*, pgcoord_now()::timestamptz AS db_now
FROM pgcoord_leases l
WHERE l.name > @after::text
  AND l.name >= @prefix::text AND starts_with(l.name, @prefix::text)
  AND (NOT @held_only::boolean OR l.expires_at > pgcoord_now())
  AND (NOT @expired_only::boolean OR l.expires_at <= pgcoord_now())
ORDER BY l.name
LIMIT @max_rows::int;

-- name: LeaseChannel :one
SELECT pgcoord_channel('leases')::text AS channel;
