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

-- The coalesced forms of the claim, the stored response, the renewal and the release of
-- non-Atomic attempts (idempotency/coalesce.go), as the lease queries' (see
-- sql/queries/leases.sql): calls in (scope, key) order, under lock_timeout, i the call's
-- position; a claim that finds nothing, a renewal or release that no longer holds, return
-- no row.

-- name: IdempotencyClaimMany :many
-- Claims commit without waiting for the WAL flush, and a key the claim would answer from its
-- plain read is answered by the statement's own read, the claim not called, as a claim sent
-- alone does (see claimSQL in idempotency/begin.go).
SELECT a.i::int AS i, k.*
FROM generate_series(1, cardinality(@scopes::text[]) + 0 * length(set_config('lock_timeout', @lock_timeout::text, true))
                        + 0 * length(set_config('synchronous_commit', 'off', true))) AS a(i)
CROSS JOIN LATERAL (
    (SELECT r.* FROM pgcoord_idempotency_keys r
      WHERE r.scope = (@scopes::text[])[a.i] AND r.key = (@keys::text[])[a.i]
        AND (r.state <> 'in_flight' OR r.fingerprint <> (@fingerprints::bytea[])[a.i] OR r.lease_expires_at > pgcoord_now()))
    UNION ALL
    (SELECT c.* FROM pgcoord_idempotency_claim((@scopes::text[])[a.i], (@keys::text[])[a.i], (@fingerprints::bytea[])[a.i],
                                               (@holders::text[])[a.i], (@retentions::interval[])[a.i], (@leases::interval[])[a.i]) c)
    LIMIT 1) k;

-- name: IdempotencyCompleteMany :many
SELECT a.i::int AS i
FROM generate_series(1, cardinality(@scopes::text[]) + 0 * length(set_config('lock_timeout', @lock_timeout::text, true))) AS a(i)
CROSS JOIN LATERAL pgcoord_idempotency_complete((@scopes::text[])[a.i], (@keys::text[])[a.i], (@holders::text[])[a.i],
                                                (@statuses::int[])[a.i], (@headers::jsonb[])[a.i], (@bodies::bytea[])[a.i]) k;

-- name: IdempotencyRenewMany :many
SELECT a.i::int AS i
FROM generate_series(1, cardinality(@scopes::text[]) + 0 * length(set_config('lock_timeout', @lock_timeout::text, true))) AS a(i)
WHERE pgcoord_idempotency_renew((@scopes::text[])[a.i], (@keys::text[])[a.i], (@holders::text[])[a.i], (@leases::interval[])[a.i]);

-- name: IdempotencyReleaseMany :many
SELECT a.i::int AS i
FROM generate_series(1, cardinality(@scopes::text[]) + 0 * length(set_config('lock_timeout', @lock_timeout::text, true))) AS a(i)
WHERE pgcoord_idempotency_release((@scopes::text[])[a.i], (@keys::text[])[a.i], (@holders::text[])[a.i]);
