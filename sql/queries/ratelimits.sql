-- Rate limit operations go through the SQL API functions of 00013_ratelimits.sql.

-- name: RatelimitTakeEach :many
-- One row per cost, in order: pgcoord_ratelimit_take_each (one call: a batch of one).
SELECT t.call_no::int AS call_no, t.granted::bigint AS granted, t.policy::text AS policy,
       t.retry_after::interval AS retry_after, t.delay::interval AS delay, t.slot::timestamptz AS slot,
       t.remaining::bigint AS remaining, t.reset_after::interval AS reset_after, t.rate::bigint AS rate,
       t.period::interval AS period, t.burst::bigint AS burst, t.tats::timestamptz[] AS tats,
       t.bases::timestamptz[] AS bases
FROM pgcoord_ratelimit_take_each(@policies::text[], @keys::text[], @costs::bigint[], @at_most::boolean,
                                 sqlc.narg('max_wait')::interval) t;

-- name: RatelimitTakeOne :many
-- One call of one pair (not AllowAtMost), in one statement: an UPDATE charges the key when
-- its row is there, its policy enforcing and the call admitted — the usual case, with no
-- PL/pgSQL at all (one UPDATE for each table of keys: the policy's mode picks the one that
-- can match); otherwise (a key at rest, a refusal, a shadow policy, an error to raise)
-- pgcoord_ratelimit_take_each decides it, which the one-time NOT EXISTS filter runs only
-- then. The clock is read as the row is updated, so a call that waited for the row's lock
-- is judged when it has it; each reading is later than the one before, so the key is never
-- charged beyond its tolerance at the instant of the charge.
WITH charged_logged AS (
    UPDATE pgcoord_ratelimit_state s
       SET tat = greatest(s.tat, pgcoord_clock()) + sqlc.arg('cost')::bigint * p.interval_us * interval '1 microsecond'
      FROM pgcoord_ratelimit_policies p
     WHERE s.policy = sqlc.arg('policy')::text AND s.key = sqlc.arg('key')::text AND p.name = sqlc.arg('policy')::text AND NOT p.shadow AND NOT p.unlogged
       AND sqlc.arg('cost')::bigint <= p.burst
       AND greatest(s.tat, pgcoord_clock()) - pgcoord_clock()
           + (sqlc.arg('cost')::bigint - p.burst) * p.interval_us * interval '1 microsecond'
           <= coalesce(sqlc.narg('max_wait')::interval, interval '0')
    RETURNING p.name, p.rate, p.period, p.burst, s.tat,
              s.tat - p.burst * p.interval_us * interval '1 microsecond' AS slot,
              p.interval_us, pgcoord_clock() AS now
), charged_unlogged AS (
    UPDATE pgcoord_ratelimit_state_unlogged s
       SET tat = greatest(s.tat, pgcoord_clock()) + sqlc.arg('cost')::bigint * p.interval_us * interval '1 microsecond'
      FROM pgcoord_ratelimit_policies p
     WHERE s.policy = sqlc.arg('policy')::text AND s.key = sqlc.arg('key')::text AND p.name = sqlc.arg('policy')::text AND NOT p.shadow AND p.unlogged
       AND sqlc.arg('cost')::bigint <= p.burst
       AND greatest(s.tat, pgcoord_clock()) - pgcoord_clock()
           + (sqlc.arg('cost')::bigint - p.burst) * p.interval_us * interval '1 microsecond'
           <= coalesce(sqlc.narg('max_wait')::interval, interval '0')
    RETURNING p.name, p.rate, p.period, p.burst, s.tat,
              s.tat - p.burst * p.interval_us * interval '1 microsecond' AS slot,
              p.interval_us, pgcoord_clock() AS now
), charged AS (
    SELECT * FROM charged_logged UNION ALL SELECT * FROM charged_unlogged
)
SELECT 1::int AS call_no, sqlc.arg('cost')::bigint AS granted, c.name::text AS policy, interval '0' AS retry_after,
       greatest(c.slot - c.now, interval '0')::interval AS delay, c.slot::timestamptz AS slot,
       (CASE WHEN c.slot > c.now THEN 0
             ELSE greatest(floor((c.burst * c.interval_us - extract(epoch FROM c.tat - c.now) * 1000000)
                                 / c.interval_us), 0) END)::bigint AS remaining,
       greatest(c.tat - c.now, interval '0')::interval AS reset_after, c.rate::bigint AS rate,
       c.period::interval AS period, c.burst::bigint AS burst, ARRAY[c.tat]::timestamptz[] AS tats,
       ARRAY[c.tat - sqlc.arg('cost')::bigint * c.interval_us * interval '1 microsecond']::timestamptz[] AS bases
  FROM charged c
UNION ALL
SELECT t.call_no, t.granted, t.policy, t.retry_after, t.delay, t.slot, t.remaining, t.reset_after, t.rate,
       t.period, t.burst, t.tats, t.bases
  FROM pgcoord_ratelimit_take_each(ARRAY[sqlc.arg('policy')::text], ARRAY[sqlc.arg('key')::text], ARRAY[sqlc.arg('cost')::bigint], false,
                                   sqlc.narg('max_wait')::interval) t
 WHERE NOT EXISTS (SELECT FROM charged);

-- name: RatelimitCancel :one
SELECT pgcoord_ratelimit_cancel(@policies::text[], @keys::text[], @tats::timestamptz[], @bases::timestamptz[])::int AS given_back;

-- name: RatelimitSet :one
SELECT p.* FROM pgcoord_ratelimit_set(@name::text, @rate::bigint, @period::interval, @burst::bigint,
                                      @shadow::boolean, @unlogged::boolean) p;

-- name: RatelimitDelete :one
SELECT pgcoord_ratelimit_delete(@name::text)::boolean AS deleted;

-- name: RatelimitReset :one
SELECT pgcoord_ratelimit_reset(@policy::text, @key::text)::boolean AS reset;

-- name: RatelimitPolicies :many
-- (shadow_refused: the policy's count and its keys', pgcoord_ratelimit_shadow_refused)
SELECT p.name, p.rate, p.period, p.burst, p.shadow, p.unlogged, p.interval_us,
       pgcoord_ratelimit_shadow_refused(p.name)::bigint AS shadow_refused, p.created_at, p.updated_at
FROM pgcoord_ratelimit_policies p ORDER BY p.name LIMIT @max_rows::int;

-- name: RatelimitPolicy :one
SELECT p.name, p.rate, p.period, p.burst, p.shadow, p.unlogged, p.interval_us,
       pgcoord_ratelimit_shadow_refused(p.name)::bigint AS shadow_refused, p.created_at, p.updated_at
FROM pgcoord_ratelimit_policies p WHERE p.name = @name::text;

-- name: RatelimitKey :one
-- A key's state, judged at one instant of the clock: the units it admits and how long until
-- it is at rest. (An unlogged policy's key is read through pgcoord_ratelimit_unlogged_tat,
-- NULL on a standby, which has none of those keys.)
SELECT k.policy, k.key,
       greatest(floor((extract(epoch FROM (k.now - greatest(coalesce(k.tat, '-infinity'), k.now))) * 1000000
                       + k.interval_us * k.burst) / k.interval_us), 0)::bigint AS remaining,
       (greatest(coalesce(k.tat, '-infinity'), k.now) - k.now)::interval AS reset_after
FROM (SELECT p.name AS policy, @key::text AS key, p.interval_us, p.burst, c.now,
             CASE WHEN p.unlogged THEN pgcoord_ratelimit_unlogged_tat(p.name, @key::text) ELSE s.tat END AS tat
        FROM (SELECT pgcoord_clock() AS now) c
        JOIN pgcoord_ratelimit_policies p ON p.name = @policy::text
        LEFT JOIN pgcoord_ratelimit_state s ON s.policy = p.name AND s.key = @key::text) k;
