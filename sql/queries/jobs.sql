-- name: ClaimTick :one
SELECT r.*, pgcoord_now()::timestamptz AS db_now
FROM pgcoord_job_claim(@job::text, @every::interval, @origin::timestamptz, @overlap::text,
                       @holder::text, @ttl::interval, nullif(@sync_commit::text, '')) r;

-- name: HeartbeatTick :one
SELECT r.*, pgcoord_now()::timestamptz AS db_now
FROM pgcoord_job_heartbeat(@job::text, @scheduled_for::timestamptz, @fence_token::bigint,
                           @ttl::interval) r;

-- name: FinishTick :execrows
SELECT 1 FROM pgcoord_job_finish(@job::text, @scheduled_for::timestamptz, @fence_token::bigint,
                                 sqlc.narg('error')::text);

-- name: TrySessionLock :one
-- RunSession's lock: pgcoord_singleton_try (00010_no_stranger_locks.sql) takes the
-- session-level advisory lock of the job's current generation, whose key is secret and used
-- once, and records this session as the job's holder. It refuses on a standby (SQLSTATE
-- 25006), like every grant. RunOnce's transaction-level lock is singleton/once.go's
-- tryLockSQL, sent with BEGIN.
SELECT t.locked::boolean AS locked, coalesce(t.gen, 0)::bigint AS gen, coalesce(t.lock_key, 0)::bigint AS lock_key,
       pg_backend_pid()::int AS backend_pid
FROM pgcoord_singleton_try(@job::text, true) t;

-- name: SessionUnlock :one
-- Moves the job to a new generation (its key is never used again) and unlocks.
SELECT pgcoord_singleton_release(@job::text, @gen::bigint, @lock_key::bigint)::boolean AS unlocked;

-- name: DBNow :one
SELECT pgcoord_now()::timestamptz AS db_now;

-- name: ListJobs :many
-- prefix ('' for all) as in ListLeases.
SELECT j.*, pgcoord_now()::timestamptz AS db_now,
       coalesce((SELECT r.state FROM pgcoord_job_runs r WHERE r.job = j.name AND r.state NOT IN ('skipped', 'pending')
         ORDER BY r.scheduled_for DESC LIMIT 1), '')::text AS last_state,
       (SELECT count(*) FROM pgcoord_job_runs r WHERE r.job = j.name AND r.state = 'running'
           AND r.expires_at > pgcoord_now())::bigint AS running,
       coalesce((SELECT min(r.scheduled_for) FROM pgcoord_job_runs r WHERE r.job = j.name),
                CASE WHEN j.kind = 'interval' THEN date_bin(j.every, j.created_at, j.origin) ELSE j.created_at END
               )::timestamptz AS first_tick,
       (SELECT count(*) FROM pgcoord_job_runs r WHERE r.job = j.name)::bigint AS ticks_recorded,
       -- Schedules (kind 'cron') record their missed ticks, and know their next one.
       (SELECT coalesce(sum(r.ticks), 0) FROM pgcoord_job_runs r WHERE r.job = j.name AND r.state = 'missed')::bigint AS ticks_missed,
       (SELECT s.next_at FROM pgcoord_schedules s WHERE s.name = j.name) AS schedule_next_at,
       coalesce((SELECT s.expr || ' (' || s.zone || ')' FROM pgcoord_schedules s WHERE s.name = j.name), '')::text AS schedule_expr
FROM pgcoord_jobs j
WHERE j.name > @after::text
  AND j.name >= @prefix::text AND starts_with(j.name, @prefix::text)
ORDER BY j.name
LIMIT @max_rows::int;

-- name: ListRuns :many
SELECT r.* FROM pgcoord_job_runs r
WHERE r.job = @job::text AND r.scheduled_for < coalesce(sqlc.narg('before')::timestamptz, 'infinity')
ORDER BY r.scheduled_for DESC
LIMIT @max_rows::int;
