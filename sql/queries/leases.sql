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
