-- Idempotency keys go through the SQL API functions of 00005_idempotency.sql,
-- 00011_idempotency_liveness.sql and 00014_idempotency_one_trip.sql. The claim, renewals, releases and the calls an attempt
-- pipelines with BEGIN or COMMIT are sent by package idempotency itself; these are the
-- others.

-- name: IdempotencyGC :one
SELECT pgcoord_idempotency_gc(@batch::int, @tombstone::interval)::bigint AS deleted;

-- name: IdempotencyCountExpired :one
SELECT count(*) FROM pgcoord_idempotency_keys
WHERE expires_at <= pgcoord_now();

-- name: IdempotencyGet :one
SELECT k.scope, k.key, k.fingerprint, k.state, k.holder, k.attempts, k.recovery_point,
       k.status, k.headers, k.body, k.created_at, k.updated_at, k.completed_at, k.expires_at,
       pgcoord_idempotency_held(k.scope, k.key) AS held,
       pgcoord_now()::timestamptz AS db_now
FROM pgcoord_idempotency_keys k
WHERE k.scope = @scope::text AND k.key = @key::text;

-- name: IdempotencyList :many
-- held is whether a live attempt holds the key (its lease has not lapsed); an in-flight
-- key nobody holds is stuck: its holder died and no retry has recovered it yet.
-- scope_prefix ('' for all scopes) as in ListLeases.
SELECT k.scope, k.key, k.fingerprint, k.state, k.holder, k.attempts, k.recovery_point,
       k.status, coalesce(octet_length(k.body), 0)::int AS body_bytes, k.created_at, k.updated_at,
       k.completed_at, k.expires_at,
       (k.state = 'in_flight' AND pgcoord_idempotency_held(k.scope, k.key))::boolean AS held,
       pgcoord_now()::timestamptz AS db_now
FROM pgcoord_idempotency_keys k
WHERE (k.scope, k.key) > (@after_scope::text, @after_key::text)
  AND k.scope >= @scope_prefix::text AND starts_with(k.scope, @scope_prefix::text)
  AND (NOT @in_flight_only::boolean OR k.state = 'in_flight')
  AND (NOT @stuck_only::boolean OR (k.state = 'in_flight' AND NOT pgcoord_idempotency_held(k.scope, k.key)))
ORDER BY k.scope, k.key
LIMIT @max_rows::int;
