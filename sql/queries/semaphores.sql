-- Semaphore operations go through the SQL API functions of 00004_semaphores.sql, like the
-- lease queries; each returns the database clock (db_now) beside the permit.

-- name: SemaphoreAcquire :one
SELECT p.key, p.holder, p.fence_token, p.acquired_at, p.expires_at,
       pgcoord_now()::timestamptz AS db_now
FROM pgcoord_semaphore_acquire(@key::text, @holder::text, @permit_limit::int, @ttl::interval,
                               sqlc.narg('wait')::interval, nullif(@sync_commit::text, '')) p;

-- name: SemaphoreRenew :one
SELECT p.key, p.holder, p.fence_token, p.acquired_at, p.expires_at,
       pgcoord_now()::timestamptz AS db_now
FROM pgcoord_semaphore_renew(@key::text, @holder::text, @ttl::interval, @fence_token::bigint,
                             @durable::boolean) p;

-- name: SemaphoreRelease :execrows
SELECT 1 FROM pgcoord_semaphore_release(@key::text, @holder::text, @fence_token::bigint);

-- name: SemaphoreDone :execrows
SELECT 1 FROM pgcoord_semaphore_done(@key::text, @holder::text, @fence_token::bigint);

-- The coalesced forms of the four above (semaphore/coalesce.go), as the lease queries' (see
-- sql/queries/leases.sql): calls in key order, under lock_timeout, i the call's position.

-- name: SemaphoreAcquireMany :many
SELECT a.i::int AS i, p.key, p.holder, p.fence_token, p.acquired_at, p.expires_at,
       pgcoord_now()::timestamptz AS db_now
FROM generate_series(1, cardinality(@keys::text[]) + 0 * length(set_config('lock_timeout', @lock_timeout::text, true))) AS a(i)
CROSS JOIN LATERAL pgcoord_semaphore_acquire((@keys::text[])[a.i], (@holders::text[])[a.i], (@permit_limits::int[])[a.i],
                                             (@ttls::interval[])[a.i], (@waits::interval[])[a.i], nullif(@sync_commit::text, '')) p;

-- name: SemaphoreRenewMany :many
SELECT a.i::int AS i, p.key, p.holder, p.fence_token, p.acquired_at, p.expires_at,
       pgcoord_now()::timestamptz AS db_now
FROM generate_series(1, cardinality(@keys::text[]) + 0 * length(set_config('lock_timeout', @lock_timeout::text, true))) AS a(i)
CROSS JOIN LATERAL pgcoord_semaphore_renew((@keys::text[])[a.i], (@holders::text[])[a.i], (@ttls::interval[])[a.i],
                                           (@fence_tokens::bigint[])[a.i], @durable::boolean) p;

-- name: SemaphoreReleaseMany :many
SELECT a.i::int AS i
FROM generate_series(1, cardinality(@keys::text[]) + 0 * length(set_config('lock_timeout', @lock_timeout::text, true))) AS a(i)
CROSS JOIN LATERAL pgcoord_semaphore_release((@keys::text[])[a.i], (@holders::text[])[a.i], (@fence_tokens::bigint[])[a.i]) p;

-- name: SemaphoreNext :one
SELECT p.key, p.holder, p.fence_token, p.acquired_at, p.expires_at,
       pgcoord_now()::timestamptz AS db_now
FROM pgcoord_semaphore_next(@holder::text, @ttl::interval, sqlc.narg('keys')::text[],
                            nullif(@sync_commit::text, ''), nullif(@rate_policy::text, '')) p;

-- name: SemaphoreSetLimit :one
SELECT s.* FROM pgcoord_semaphore_set_limit(@key::text, @permit_limit::int, sqlc.narg('weight')::int) s;

-- name: SemaphoreAddDemand :one
SELECT s.* FROM pgcoord_semaphore_add_demand(@key::text, @units::bigint, @permit_limit::int) s;

-- name: SemaphoreDrain :many
SELECT p.* FROM pgcoord_semaphore_drain(@key::text) p;

-- name: SemaphoreChannel :one
SELECT pgcoord_channel('semaphores')::text AS channel;

-- name: ListSemaphores :many
-- prefix ('' for all keys) as in ListLeases.
-- oldest_waiter_since and oldest_permit_at are 'epoch' when there is none (waiters = 0,
-- held = 0): a NULL would not scan into the time.Time sqlc gives them. recent_waits is the
-- admission-wait histogram of the last 5 to 10 minutes by db_now, bucket by bucket: the
-- key's current window if it is db_now's window or the one before, plus its previous
-- window if the current one is db_now's (a window that old is the one before db_now's).
SELECT s.*, pgcoord_now()::timestamptz AS db_now,
       (SELECT coalesce(array_agg(
                 CASE WHEN s.wait_window >= date_bin('5 minutes', pgcoord_now(), timestamptz 'epoch')
                                            - interval '5 minutes' THEN s.waits[i] ELSE 0 END
               + CASE WHEN s.wait_window >= date_bin('5 minutes', pgcoord_now(), timestamptz 'epoch')
                      THEN s.waits_prev[i] ELSE 0 END ORDER BY i), '{}')
          FROM generate_subscripts(s.waits, 1) AS i)::int[] AS recent_waits,
       (SELECT count(*) FROM pgcoord_semaphore_permits p
         WHERE p.key = s.key AND p.expires_at > pgcoord_now())::int AS held,
       (SELECT count(*) FROM pgcoord_semaphore_permits p
         WHERE p.key = s.key AND p.expires_at <= pgcoord_now())::int AS expired,
       (SELECT count(*) FROM pgcoord_semaphore_waiters w
         WHERE w.key = s.key AND w.wanted_until > pgcoord_now())::int AS waiters,
       coalesce((SELECT min(w.since) FROM pgcoord_semaphore_waiters w
         WHERE w.key = s.key AND w.wanted_until > pgcoord_now()), 'epoch')::timestamptz AS oldest_waiter_since,
       coalesce((SELECT min(p.acquired_at) FROM pgcoord_semaphore_permits p
         WHERE p.key = s.key AND p.expires_at > pgcoord_now()), 'epoch')::timestamptz AS oldest_permit_at
FROM pgcoord_semaphores s
WHERE s.key > @after::text
  AND s.key >= @prefix::text AND starts_with(s.key, @prefix::text)
  AND (sqlc.narg('only_key')::text IS NULL OR s.key = sqlc.narg('only_key')::text)
ORDER BY s.key
LIMIT @max_rows::int;

-- name: ListPermits :many
SELECT p.*, pgcoord_now()::timestamptz AS db_now
FROM pgcoord_semaphore_permits p
WHERE p.key = @key::text
ORDER BY p.acquired_at, p.holder;

-- name: SemaphoreNextExpiry :one
-- When the first permit of a key expires, or the place in line of another waiter lapses
-- ('epoch' if neither comes): a refused Acquire tries again then at the latest, since
-- neither sends a notification (a waiter that died, or whose last attempt committed after
-- it gave up, holds its place until it lapses). Rows already past are counted too: the
-- refused attempt deleted those it found past, so any left expired or lapsed after it, in
-- the instant before this read, and the Acquire must try again at once (not at the next
-- one, a poll interval later).
SELECT coalesce(least(
         (SELECT min(p.expires_at) FROM pgcoord_semaphore_permits p WHERE p.key = @key::text),
         (SELECT min(w.wanted_until) FROM pgcoord_semaphore_waiters w
           WHERE w.key = @key::text AND w.holder <> @holder::text)),
       'epoch')::timestamptz AS next_expiry,
       pgcoord_now()::timestamptz AS db_now;

-- name: SemaphoreLeaveLine :exec
-- A waiter that gives up leaves the line at once instead of holding its place until its
-- registration lapses, and wakes the others if a permit is free for the next in line.
WITH gone AS (
    DELETE FROM pgcoord_semaphore_waiters WHERE key = @key::text AND holder = @holder::text
    RETURNING key
)
SELECT pg_notify(pgcoord_channel('semaphores'), pgcoord_wake_tag(@key::text))
 WHERE EXISTS (SELECT FROM gone)
   AND EXISTS (SELECT FROM pgcoord_semaphore_waiters w
                WHERE w.key = @key::text AND w.holder <> @holder::text AND w.wanted_until > pgcoord_now())
   AND (SELECT count(*) FROM pgcoord_semaphore_permits p WHERE p.key = @key::text AND p.expires_at > pgcoord_now())
       < (SELECT s.permit_limit FROM pgcoord_semaphores s WHERE s.key = @key::text);

-- name: SemaphoreReleaseHolder :execrows
-- Frees whatever permit holder has on key, whatever its token: for a waiter that gives up
-- after an attempt whose outcome it never learned, under an identity nobody else uses.
SELECT 1 FROM pgcoord_semaphore_release(@key::text, @holder::text, NULL);
