-- Semaphore operations go through the SQL API functions of 00004_semaphores.sql, like the
-- lease queries; each returns the database clock (db_now) beside the permit.

-- name: SemaphoreAcquire :one
SELECT p.key, p.holder, p.fence_token, p.acquired_at, p.expires_at,
       coalesce(sqlc.narg('now')::timestamptz, now())::timestamptz AS db_now
FROM pgcoord_semaphore_acquire(@key::text, @holder::text, @permit_limit::int, @ttl::interval,
                               sqlc.narg('wait')::interval, sqlc.narg('now')::timestamptz) p;

-- name: SemaphoreRenew :one
SELECT p.key, p.holder, p.fence_token, p.acquired_at, p.expires_at,
       coalesce(sqlc.narg('now')::timestamptz, now())::timestamptz AS db_now
FROM pgcoord_semaphore_renew(@key::text, @holder::text, @ttl::interval, @fence_token::bigint,
                             @durable::boolean, sqlc.narg('now')::timestamptz) p;

-- name: SemaphoreRelease :execrows
SELECT 1 FROM pgcoord_semaphore_release(@key::text, @holder::text, @fence_token::bigint, sqlc.narg('now')::timestamptz);

-- name: SemaphoreNext :one
SELECT p.key, p.holder, p.fence_token, p.acquired_at, p.expires_at,
       coalesce(sqlc.narg('now')::timestamptz, now())::timestamptz AS db_now
FROM pgcoord_semaphore_next(@holder::text, @ttl::interval, sqlc.narg('keys')::text[], sqlc.narg('now')::timestamptz) p;

-- name: SemaphoreSetLimit :one
SELECT s.* FROM pgcoord_semaphore_set_limit(@key::text, @permit_limit::int, sqlc.narg('weight')::int) s;

-- name: SemaphoreAddDemand :one
SELECT s.* FROM pgcoord_semaphore_add_demand(@key::text, @units::bigint, @permit_limit::int) s;

-- name: SemaphoreDrain :many
SELECT p.* FROM pgcoord_semaphore_drain(@key::text) p;

-- name: SemaphoreChannel :one
SELECT pgcoord_channel('semaphores')::text AS channel;

-- name: ListSemaphores :many
SELECT s.*, coalesce(sqlc.narg('now')::timestamptz, now())::timestamptz AS db_now,
       (SELECT count(*) FROM pgcoord_semaphore_permits p
         WHERE p.key = s.key AND p.expires_at > coalesce(sqlc.narg('now')::timestamptz, now()))::int AS held,
       (SELECT count(*) FROM pgcoord_semaphore_permits p
         WHERE p.key = s.key AND p.expires_at <= coalesce(sqlc.narg('now')::timestamptz, now()))::int AS expired,
       (SELECT count(*) FROM pgcoord_semaphore_waiters w
         WHERE w.key = s.key AND w.wanted_until > coalesce(sqlc.narg('now')::timestamptz, now()))::int AS waiters,
       (SELECT min(w.since) FROM pgcoord_semaphore_waiters w
         WHERE w.key = s.key AND w.wanted_until > coalesce(sqlc.narg('now')::timestamptz, now()))::timestamptz AS oldest_waiter_since,
       (SELECT min(p.acquired_at) FROM pgcoord_semaphore_permits p
         WHERE p.key = s.key AND p.expires_at > coalesce(sqlc.narg('now')::timestamptz, now()))::timestamptz AS oldest_permit_at
FROM pgcoord_semaphores s
WHERE s.key > @after::text AND (sqlc.narg('only_key')::text IS NULL OR s.key = sqlc.narg('only_key')::text)
ORDER BY s.key
LIMIT @max_rows::int;

-- name: ListPermits :many
SELECT p.*, coalesce(sqlc.narg('now')::timestamptz, now())::timestamptz AS db_now
FROM pgcoord_semaphore_permits p
WHERE p.key = @key::text
ORDER BY p.acquired_at, p.holder;
