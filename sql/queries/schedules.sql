-- name: ScheduleCreate :one
SELECT * FROM pgcoord_schedule_create(@name::text, @expr::text, @zone::text, @handler::text, @args::jsonb,
    @catch_up::interval, @catch_up_policy::text, @overlap::text, @jitter::interval, sqlc.narg('deadline')::interval,
    sqlc.narg('starts_at')::timestamptz, sqlc.narg('ends_at')::timestamptz, nullif(@actor::text, ''));

-- name: ScheduleUpdate :many
SELECT * FROM pgcoord_schedule_update(@name::text, @expr::text, @zone::text, @handler::text, @args::jsonb,
    @catch_up::interval, @catch_up_policy::text, @overlap::text, @jitter::interval, sqlc.narg('deadline')::interval,
    sqlc.narg('starts_at')::timestamptz, sqlc.narg('ends_at')::timestamptz, sqlc.narg('version')::bigint,
    nullif(@actor::text, ''));

-- name: SchedulePause :many
SELECT * FROM pgcoord_schedule_pause(@name::text, sqlc.narg('note')::text, nullif(@actor::text, ''));

-- name: ScheduleResume :many
SELECT * FROM pgcoord_schedule_resume(@name::text, nullif(@actor::text, ''));

-- name: ScheduleDelete :one
SELECT pgcoord_schedule_delete(@name::text, nullif(@actor::text, ''))::boolean AS deleted;

-- name: ScheduleTrigger :many
SELECT * FROM pgcoord_schedule_trigger(@name::text, nullif(@actor::text, ''));

-- name: ScheduleBackfill :one
SELECT pgcoord_schedule_backfill(@name::text, @ticks::timestamptz[], nullif(@actor::text, ''))::bigint AS recorded;

-- name: ScheduleArm :many
SELECT * FROM pgcoord_schedule_arm(@name::text, @version::bigint, sqlc.narg('next')::timestamptz);

-- name: ScheduleClaim :many
SELECT r.*, s.handler, s.args, s.deadline, pgcoord_now()::timestamptz AS db_now
FROM pgcoord_schedule_claim(@name::text, @version::bigint, @from_tick::timestamptz, @missed::bigint,
    @ticks::timestamptz[], sqlc.narg('next')::timestamptz, @holder::text, @handlers::text[], @ttl::interval) r
JOIN pgcoord_schedules s ON s.name = r.job;

-- name: ScheduleClaimMany :many
-- ScheduleClaim of several schedules in one call (pgcoord_schedule_claim_many): entry i
-- claims names[i] with ticks[firsts[i] : firsts[i] + counts[i] - 1] (1-based), and nexts[i]
-- when has_next[i]. The rows name their schedule (job), in no order.
SELECT r.*, s.handler, s.args, s.deadline, pgcoord_now()::timestamptz AS db_now
FROM pgcoord_schedule_claim_many(@names::text[], @versions::bigint[], @froms::timestamptz[], @missed::bigint[],
    @firsts::int[], @counts::int[], @ticks::timestamptz[],
    ARRAY(SELECT CASE WHEN (@has_next::boolean[])[i] THEN (@nexts::timestamptz[])[i] END
          FROM generate_subscripts(@has_next::boolean[], 1) i ORDER BY i),
    @holder::text, @handlers::text[], @ttl::interval) r
JOIN pgcoord_schedules s ON s.name = r.job;

-- name: ScheduleStart :many
SELECT r.*, s.handler, s.args, s.deadline, pgcoord_now()::timestamptz AS db_now
FROM pgcoord_schedule_start(@name::text, @holder::text, @handlers::text[], @ttl::interval) r
JOIN pgcoord_schedules s ON s.name = r.job;

-- name: ScheduleRegister :exec
SELECT pgcoord_schedule_register(@holder::text, @handlers::text[], @ttl::interval);

-- name: ScheduleUnregister :exec
SELECT pgcoord_schedule_unregister(@holder::text);

-- name: ScheduleGet :many
SELECT s.*, j.overlap, j.fence_token, j.last_started_at, j.last_success_at, j.last_failure_at, j.last_error,
       j.consecutive_failures, pgcoord_now()::timestamptz AS db_now,
       (SELECT count(*) FROM pgcoord_job_runs r WHERE r.job = s.name AND r.state = 'pending')::bigint AS pending,
       pgcoord_schedule_live_handler(s.handler)::boolean AS handler_live
FROM pgcoord_schedules s JOIN pgcoord_jobs j ON j.name = s.name
WHERE s.name = @name::text;

-- name: ScheduleList :many
-- prefix ('' for all) as in ListLeases.
SELECT s.*, j.overlap, j.fence_token, j.last_started_at, j.last_success_at, j.last_failure_at, j.last_error,
       j.consecutive_failures, pgcoord_now()::timestamptz AS db_now,
       (SELECT count(*) FROM pgcoord_job_runs r WHERE r.job = s.name AND r.state = 'pending')::bigint AS pending,
       pgcoord_schedule_live_handler(s.handler)::boolean AS handler_live
FROM pgcoord_schedules s JOIN pgcoord_jobs j ON j.name = s.name
WHERE s.name > @after::text
  AND s.name >= @prefix::text AND starts_with(s.name, @prefix::text)
ORDER BY s.name
LIMIT @max_rows::int;

-- name: ScheduleDue :many
-- The schedules whose next tick is due, for a scheduler with these handlers (or with no
-- live process for their handler: the claim records the tick as waiting for one), but for
-- those in skip (the pass's earlier looks found them).
SELECT s.name, s.expr, s.zone, s.version, s.next_at::timestamptz AS next_at, s.catch_up, s.catch_up_policy,
       s.starts_at, s.ends_at,
       pgcoord_now()::timestamptz AS db_now
FROM pgcoord_schedules s
WHERE s.paused_at IS NULL AND s.due_at <= pgcoord_now()
  AND (s.handler = ANY (@handlers::text[]) OR NOT pgcoord_schedule_live_handler(s.handler))
  AND s.name <> ALL (coalesce(@skip::text[], '{}'))
ORDER BY s.due_at
LIMIT @max_rows::int;

-- name: ScheduleNextDue :many
-- When the next tick of those schedules is due (no row: none), and the database's now.
SELECT s.due_at::timestamptz AS due_at, pgcoord_now()::timestamptz AS db_now
FROM pgcoord_schedules s
WHERE s.paused_at IS NULL AND s.due_at > pgcoord_now()
  AND (s.handler = ANY (@handlers::text[]) OR NOT pgcoord_schedule_live_handler(s.handler))
ORDER BY s.due_at
LIMIT 1;

-- name: ScheduleUnarmed :many
SELECT s.name, s.expr, s.zone, s.version, s.arm_from::timestamptz AS arm_from, s.starts_at, s.ends_at
FROM pgcoord_schedules s
WHERE s.arm_from IS NOT NULL
ORDER BY s.name
LIMIT @max_rows::int;

-- name: ScheduleWaiting :many
-- The schedules of these handlers with a run that may start: pending, or running with an
-- expired lease. Driven by the ledger's partial indexes of pending and running runs (few),
-- not by the schedules (many).
SELECT s.name FROM pgcoord_schedules s
WHERE s.name IN (SELECT r.job FROM pgcoord_job_runs r WHERE r.state = 'pending'
                 UNION
                 SELECT r.job FROM pgcoord_job_runs r WHERE r.state = 'running' AND r.expires_at <= pgcoord_now())
  AND s.handler = ANY (@handlers::text[]) AND s.paused_at IS NULL
ORDER BY s.name
LIMIT @max_rows::int;

-- name: ScheduleChannel :one
SELECT pgcoord_channel('schedules')::text AS channel;
