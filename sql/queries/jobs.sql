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
-- Advisory locks work on a standby too, but lock nothing the primary's sessions see: the
-- lock queries refuse there (pgcoord_token_floor raises SQLSTATE 25006), like every grant.
-- RunOnce's transaction-level lock is singleton/once.go's tryLockSQL, sent with BEGIN.
SELECT pg_try_advisory_lock(pgcoord_lock_key(@name::text)) AS locked, pg_backend_pid()::int AS backend_pid
FROM (SELECT pgcoord_token_floor() AS floor) p WHERE p.floor IS NOT NULL;

-- name: SessionUnlock :one
SELECT pg_advisory_unlock(pgcoord_lock_key(@name::text)) AS unlocked;

-- name: DBNow :one
SELECT pgcoord_now()::timestamptz AS db_now;

-- name: ListJobs :many
-- prefix ('' for all) as in ListLeases.
SELECT j.*, pgcoord_now()::timestamptz AS db_now,
       coalesce((SELECT r.state FROM pgcoord_job_runs r WHERE r.job = j.name AND r.state <> 'skipped'
         ORDER BY r.scheduled_for DESC LIMIT 1), '')::text AS last_state,
       (SELECT count(*) FROM pgcoord_job_runs r WHERE r.job = j.name AND r.state = 'running'
           AND r.expires_at > pgcoord_now())::bigint AS running,
       coalesce((SELECT min(r.scheduled_for) FROM pgcoord_job_runs r WHERE r.job = j.name),
                date_bin(j.every, j.created_at, j.origin))::timestamptz AS first_tick,
       (SELECT count(*) FROM pgcoord_job_runs r WHERE r.job = j.name)::bigint AS ticks_recorded
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
