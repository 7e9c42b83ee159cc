-- Rate limit operations go through the SQL API functions of 00013_ratelimits.sql.

-- name: RatelimitTakeEach :many
-- One row per cost, in order: pgcoord_ratelimit_take_each (one call: a batch of one).
SELECT t.call_no::int AS call_no, t.granted::bigint AS granted, t.policy::text AS policy,
       t.retry_after::interval AS retry_after, t.delay::interval AS delay, t.slot::timestamptz AS slot,
       t.remaining::bigint AS remaining, t.reset_after::interval AS reset_after, t.rate::bigint AS rate,
       t.period::interval AS period, t.burst::bigint AS burst, t.tats::timestamptz[] AS tats
FROM pgcoord_ratelimit_take_each(@policies::text[], @keys::text[], @costs::bigint[], @at_most::boolean,
                                 sqlc.narg('max_wait')::interval) t;

-- name: RatelimitCancel :one
SELECT pgcoord_ratelimit_cancel(@policies::text[], @keys::text[], @tats::timestamptz[], @cost::bigint)::int AS given_back;

-- name: RatelimitSet :one
SELECT p.* FROM pgcoord_ratelimit_set(@name::text, @rate::bigint, @period::interval, @burst::bigint,
                                      @shadow::boolean) p;

-- name: RatelimitDelete :one
SELECT pgcoord_ratelimit_delete(@name::text)::boolean AS deleted;

-- name: RatelimitReset :one
SELECT pgcoord_ratelimit_reset(@policy::text, @key::text)::boolean AS reset;

-- name: RatelimitPolicies :many
-- (shadow_refused: the policy's count and its keys', pgcoord_ratelimit_shadow_refused)
SELECT p.name, p.rate, p.period, p.burst, p.shadow, p.interval_us,
       pgcoord_ratelimit_shadow_refused(p.name)::bigint AS shadow_refused, p.created_at, p.updated_at
FROM pgcoord_ratelimit_policies p ORDER BY p.name LIMIT @max_rows::int;

-- name: RatelimitPolicy :one
SELECT p.name, p.rate, p.period, p.burst, p.shadow, p.interval_us,
       pgcoord_ratelimit_shadow_refused(p.name)::bigint AS shadow_refused, p.created_at, p.updated_at
FROM pgcoord_ratelimit_policies p WHERE p.name = @name::text;

-- name: RatelimitKey :one
-- A key's state, judged at one instant of the clock: the units it admits and how long until
-- it is at rest.
SELECT p.name AS policy, @key::text AS key,
       greatest(floor((extract(epoch FROM (c.now - greatest(coalesce(s.tat, '-infinity'), c.now))) * 1000000
                       + p.interval_us * p.burst) / p.interval_us), 0)::bigint AS remaining,
       (greatest(coalesce(s.tat, '-infinity'), c.now) - c.now)::interval AS reset_after,
       s.tat
FROM (SELECT pgcoord_clock() AS now) c
JOIN pgcoord_ratelimit_policies p ON p.name = @policy::text
LEFT JOIN pgcoord_ratelimit_state s ON s.policy = p.name AND s.key = @key::text;
