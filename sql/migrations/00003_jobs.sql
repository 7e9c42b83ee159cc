-- Cron singletons: the per-tick run ledger, and dedupe claims.
--
-- A job runs on many replicas, each on its own timer. Each schedule slot (a "tick") is
-- computed from the database clock — date_bin(every, now, origin) — and claimed once in
-- pgcoord_job_runs, keyed by (job, scheduled_for): replicas whose timers fire at different
-- moments, or whose clocks disagree, still run each tick once. A running tick is a lease: its
-- runner heartbeats it, and a tick whose runner died (expires_at passed) is taken over by the
-- next replica, with a higher fence token (pgcoord_next_token()), so late writes of the
-- stalled runner can be fenced. pgcoord_jobs keeps each job's schedule and the summary
-- operators and probes read; pgcoord_gc collects finished runs older than its retention
-- (keeping each job's latest).

-- +goose Up
CREATE TABLE pgcoord_jobs (
    name                 text        PRIMARY KEY CHECK (octet_length(name) BETWEEN 1 AND 255),
    every                interval    NOT NULL CHECK (every > interval '0'),
    origin               timestamptz NOT NULL,
    overlap              text        NOT NULL CHECK (overlap IN ('allow', 'forbid', 'replace')),
    -- The token of the job's newest run (0 before the first).
    fence_token          bigint      NOT NULL DEFAULT 0,
    last_started_at      timestamptz,
    last_success_at      timestamptz,
    last_failure_at      timestamptz,
    last_error           text,
    consecutive_failures integer     NOT NULL DEFAULT 0,
    created_at           timestamptz NOT NULL DEFAULT pgcoord_now()
);

COMMENT ON TABLE pgcoord_jobs IS 'pgcoord: scheduled jobs, their schedule and last outcomes';

CREATE TABLE pgcoord_job_runs (
    job           text        NOT NULL REFERENCES pgcoord_jobs (name) ON DELETE CASCADE,
    scheduled_for timestamptz NOT NULL,
    state         text        NOT NULL CHECK (state IN ('running', 'succeeded', 'failed', 'skipped', 'replaced')),
    fence_token   bigint      NOT NULL,
    attempt       integer     NOT NULL DEFAULT 1,
    holder        text        NOT NULL,
    started_at    timestamptz NOT NULL,
    expires_at    timestamptz,
    finished_at   timestamptz,
    error         text,
    PRIMARY KEY (job, scheduled_for)
);

CREATE INDEX pgcoord_job_runs_running ON pgcoord_job_runs (job) WHERE state = 'running';

COMMENT ON TABLE pgcoord_job_runs IS 'pgcoord: one row per claimed tick of a job';

-- pgcoord_job_claim claims the current tick of p_job for p_holder and returns the claimed
-- run, whose fence_token is higher than every earlier run's of the job; no row if the tick
-- needs no run here: it already ran or is running, or the overlap policy says to skip.
-- It registers (or updates) the job's schedule: p_every in (0, 366 days], p_origin (NULL:
-- the epoch) and p_overlap 'allow', 'forbid' or 'replace'; intervals with months, which have
-- no fixed length, are refused. A tick whose runner stopped
-- heartbeating (expires_at passed) is taken over, as attempt + 1. p_ttl is in (0, 24 hours].
-- p_sync_commit is as in pgcoord_lease_acquire; on a standby it raises 25006.
-- +goose StatementBegin
CREATE FUNCTION pgcoord_job_claim(
    p_job text, p_every interval, p_origin timestamptz, p_overlap text,
    p_holder text, p_ttl interval, p_sync_commit text DEFAULT NULL
) RETURNS SETOF pgcoord_job_runs LANGUAGE plpgsql AS $$
DECLARE
    v_now  timestamptz := pgcoord_now();
    v_slot timestamptz;
    v_job  pgcoord_jobs;
    r      pgcoord_job_runs;
BEGIN
    IF NOT pgcoord_name_ok(p_job) THEN
        PERFORM pgcoord_refuse_name('job name', p_job);
    END IF;
    IF NOT pgcoord_name_ok(p_holder) THEN
        PERFORM pgcoord_refuse_name('job holder', p_holder);
    END IF;
    IF p_every IS NULL OR p_every <= interval '0' OR p_every > interval '366 days'
       OR date_part('month', p_every) <> 0 OR date_part('year', p_every) <> 0 THEN
        PERFORM pgcoord_refuse('job interval', 'positive, at most 366 days and without months', p_every::text);
    END IF;
    IF NOT isfinite(p_origin) THEN
        PERFORM pgcoord_refuse('job origin', 'a finite time or NULL', p_origin::text);
    END IF;
    IF p_overlap IS NULL OR p_overlap NOT IN ('allow', 'forbid', 'replace') THEN
        PERFORM pgcoord_refuse('job overlap', 'allow, forbid or replace', p_overlap);
    END IF;
    IF NOT pgcoord_ttl_ok(p_ttl) THEN
        PERFORM pgcoord_refuse('job ttl', 'positive, at most 24 hours and without months', p_ttl::text);
    END IF;
    IF p_sync_commit IS NOT NULL OR pg_is_in_recovery() THEN
        PERFORM pgcoord_grant_prepare(p_sync_commit);
    END IF;
    -- Most claims lose: every replica asks at every tick. Decide those from plain reads, so
    -- a losing claim writes nothing and waits for no commit.
    SELECT * INTO v_job FROM pgcoord_jobs WHERE name = p_job;
    IF FOUND AND (v_job.every, v_job.origin, v_job.overlap) = (p_every, coalesce(p_origin, 'epoch'), p_overlap) THEN
        SELECT * INTO r FROM pgcoord_job_runs
         WHERE job = p_job AND scheduled_for = date_bin(v_job.every, v_now, v_job.origin);
        IF FOUND AND NOT (r.state = 'running' AND r.expires_at <= v_now) THEN
            RETURN;
        END IF;
    END IF;
    INSERT INTO pgcoord_jobs (name, every, origin, overlap)
    VALUES (p_job, p_every, coalesce(p_origin, 'epoch'), p_overlap)
    ON CONFLICT (name) DO UPDATE
       SET every = excluded.every, origin = excluded.origin, overlap = excluded.overlap
     WHERE (pgcoord_jobs.every, pgcoord_jobs.origin, pgcoord_jobs.overlap)
           IS DISTINCT FROM (excluded.every, excluded.origin, excluded.overlap);
    -- The job row serializes claims of one job: one claimer at a time decides.
    SELECT * INTO v_job FROM pgcoord_jobs WHERE name = p_job FOR UPDATE;
    v_slot := date_bin(v_job.every, v_now, v_job.origin);

    SELECT * INTO r FROM pgcoord_job_runs WHERE job = p_job AND scheduled_for = v_slot;
    IF FOUND AND NOT (r.state = 'running' AND r.expires_at <= v_now) THEN
        RETURN; -- done, failed, skipped, replaced, or running with a live runner
    END IF;

    -- A run of an earlier tick whose runner stopped heartbeating is over: nobody will
    -- finish it, and no claim takes over a past tick. Record it as failed, so the job's
    -- status shows it and `pgcoord jobs check` alerts.
    WITH abandoned AS (
        UPDATE pgcoord_job_runs
           SET state = 'failed', finished_at = v_now, expires_at = NULL,
               error = 'abandoned: its runner stopped heartbeating'
         WHERE job = p_job AND state = 'running' AND expires_at <= v_now AND scheduled_for < v_slot
        RETURNING 1)
    UPDATE pgcoord_jobs
       SET last_failure_at = v_now, last_error = 'abandoned: its runner stopped heartbeating',
           consecutive_failures = consecutive_failures + (SELECT count(*) FROM abandoned)
     WHERE name = p_job AND EXISTS (SELECT FROM abandoned);

    IF NOT FOUND THEN
        IF v_job.overlap <> 'allow' AND EXISTS (
            SELECT 1 FROM pgcoord_job_runs
             WHERE job = p_job AND state = 'running' AND expires_at > v_now) THEN
            IF v_job.overlap = 'forbid' THEN
                INSERT INTO pgcoord_job_runs (job, scheduled_for, state, fence_token, holder, started_at, finished_at, error)
                VALUES (p_job, v_slot, 'skipped', v_job.fence_token, p_holder, v_now, v_now, 'previous run still running');
                RETURN;
            END IF;
            UPDATE pgcoord_job_runs
               SET state = 'replaced', finished_at = v_now, expires_at = NULL,
                   error = 'replaced by the run for ' || v_slot
             WHERE job = p_job AND state = 'running';
        END IF;
    END IF;

    UPDATE pgcoord_jobs SET fence_token = pgcoord_next_token(), last_started_at = v_now
     WHERE name = p_job RETURNING fence_token INTO v_job.fence_token;
    INSERT INTO pgcoord_job_runs AS jr (job, scheduled_for, state, fence_token, holder, started_at, expires_at)
    VALUES (p_job, v_slot, 'running', v_job.fence_token, p_holder, v_now, v_now + p_ttl)
    ON CONFLICT (job, scheduled_for) DO UPDATE
       SET state = 'running', fence_token = excluded.fence_token, attempt = jr.attempt + 1,
           holder = excluded.holder, started_at = excluded.started_at,
           expires_at = excluded.expires_at, finished_at = NULL, error = NULL
    RETURNING * INTO r;
    RETURN NEXT r;
END
$$;
-- +goose StatementEnd

-- pgcoord_job_run_args refuses the bad arguments of a call that names one run (job + slot
-- + token).
-- +goose StatementBegin
CREATE FUNCTION pgcoord_job_run_args(p_job text, p_scheduled_for timestamptz, p_fence_token bigint)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF NOT pgcoord_name_ok(p_job) THEN
        PERFORM pgcoord_refuse_name('job name', p_job);
    END IF;
    IF p_scheduled_for IS NULL OR NOT isfinite(p_scheduled_for) THEN
        PERFORM pgcoord_refuse('scheduled_for', 'a finite time', p_scheduled_for::text);
    END IF;
    IF p_fence_token IS NULL OR p_fence_token < 1 THEN
        PERFORM pgcoord_refuse('fence token', 'positive', p_fence_token::text);
    END IF;
END
$$;
-- +goose StatementEnd

-- pgcoord_job_heartbeat extends a running tick (job + slot + token) to now + p_ttl (at most
-- 24 hours) and returns it; no row if the run is no longer current (taken over, replaced,
-- finished). It commits asynchronously — it turns synchronous_commit off for the rest of
-- the caller's transaction, so call it in a transaction of its own: losing a heartbeat only
-- shortens the run's lease. Like lease renewals it judges expiry by pgcoord_clock(), so a
-- heartbeat that waited on a lock past the run's expiry does not revive it.
-- +goose StatementBegin
CREATE FUNCTION pgcoord_job_heartbeat(
    p_job text, p_scheduled_for timestamptz, p_fence_token bigint, p_ttl interval
) RETURNS SETOF pgcoord_job_runs LANGUAGE plpgsql AS $$
BEGIN
    IF NOT pgcoord_name_ok(p_job) OR p_scheduled_for IS NULL OR NOT isfinite(p_scheduled_for)
       OR p_fence_token IS NULL OR p_fence_token < 1 THEN
        PERFORM pgcoord_job_run_args(p_job, p_scheduled_for, p_fence_token);
    END IF;
    IF NOT pgcoord_ttl_ok(p_ttl) THEN
        PERFORM pgcoord_refuse('job ttl', 'positive, at most 24 hours and without months', p_ttl::text);
    END IF;
    PERFORM set_config('synchronous_commit', 'off', true);
    -- Lock first, then judge expiry: see pgcoord_lease_renew.
    PERFORM FROM pgcoord_job_runs
     WHERE job = p_job AND scheduled_for = p_scheduled_for AND fence_token = p_fence_token
       FOR NO KEY UPDATE;
    RETURN QUERY
    UPDATE pgcoord_job_runs SET expires_at = pgcoord_clock() + p_ttl
     WHERE job = p_job AND scheduled_for = p_scheduled_for AND fence_token = p_fence_token
       AND state = 'running' AND expires_at > pgcoord_clock()
    RETURNING *;
END
$$;
-- +goose StatementEnd

-- pgcoord_job_finish records the outcome of a run (p_error NULL means success; an error is
-- kept to its first 8192 bytes) and returns the finished run; no row if the run was no
-- longer current, in which case nothing changed.
-- +goose StatementBegin
CREATE FUNCTION pgcoord_job_finish(
    p_job text, p_scheduled_for timestamptz, p_fence_token bigint, p_error text
) RETURNS SETOF pgcoord_job_runs LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := pgcoord_now();
    v_error text := left(p_error, 8192); -- at most 8192 characters: 32 kB at most
    r pgcoord_job_runs;
BEGIN
    IF NOT pgcoord_name_ok(p_job) OR p_scheduled_for IS NULL OR NOT isfinite(p_scheduled_for)
       OR p_fence_token IS NULL OR p_fence_token < 1 THEN
        PERFORM pgcoord_job_run_args(p_job, p_scheduled_for, p_fence_token);
    END IF;
    -- Keep the first 8192 bytes, cut at a character boundary: dropping ceil(excess / 4)
    -- characters (of at most 4 bytes each) at a time never drops more than it must.
    WHILE octet_length(v_error) > 8192 LOOP
        v_error := left(v_error, -((octet_length(v_error) - 8192 + 3) / 4));
    END LOOP;
    UPDATE pgcoord_job_runs
       SET state = CASE WHEN p_error IS NULL THEN 'succeeded' ELSE 'failed' END,
           finished_at = v_now, expires_at = NULL, error = v_error
     WHERE job = p_job AND scheduled_for = p_scheduled_for AND fence_token = p_fence_token
       AND state = 'running'
    RETURNING * INTO r;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF p_error IS NULL THEN
        UPDATE pgcoord_jobs SET last_success_at = greatest(last_success_at, v_now), consecutive_failures = 0
         WHERE name = p_job;
    ELSE
        UPDATE pgcoord_jobs
           SET last_failure_at = greatest(last_failure_at, v_now), last_error = v_error,
               consecutive_failures = consecutive_failures + 1
         WHERE name = p_job;
    END IF;
    RETURN NEXT r;
END
$$;
-- +goose StatementEnd

-- Dedupe claims: the first claim of (scope, key) wins, permanently once its transaction
-- commits; expires_at, if set, lets `pgcoord dedupe gc` remove it afterwards.
CREATE TABLE pgcoord_dedupe (
    scope      text        NOT NULL CHECK (octet_length(scope) BETWEEN 1 AND 255),
    key        text        NOT NULL CHECK (octet_length(key) BETWEEN 1 AND 1024),
    claimed_at timestamptz NOT NULL DEFAULT pgcoord_now(),
    expires_at timestamptz,
    PRIMARY KEY (scope, key)
);

CREATE INDEX pgcoord_dedupe_expires ON pgcoord_dedupe (expires_at) WHERE expires_at IS NOT NULL;

COMMENT ON TABLE pgcoord_dedupe IS 'pgcoord: dedupe claims; a row means (scope, key) was done';

-- +goose Down
DROP TABLE pgcoord_dedupe;
DROP FUNCTION pgcoord_job_finish(text, timestamptz, bigint, text);
DROP FUNCTION pgcoord_job_heartbeat(text, timestamptz, bigint, interval);
DROP FUNCTION pgcoord_job_run_args(text, timestamptz, bigint);
DROP FUNCTION pgcoord_job_claim(text, interval, timestamptz, text, text, interval, text);
DROP TABLE pgcoord_job_runs;
DROP TABLE pgcoord_jobs;
