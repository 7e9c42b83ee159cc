-- Schedules as rows: cron expressions in a time zone, created, changed, paused and deleted at
-- runtime, each tick run once across replicas on the ledger of 00003_jobs.sql.
--
-- A schedule is a job of kind 'cron' (pgcoord_jobs; the jobs singleton.Schedule registers
-- from code are of kind 'interval') with its definition in pgcoord_schedules: expression,
-- zone, handler name, JSON arguments, catch-up window and policy, overlap policy, jitter,
-- deadline, start and end. Its runs are rows of pgcoord_job_runs like every job's, with the
-- same fence tokens, heartbeats (pgcoord_job_heartbeat) and outcomes (pgcoord_job_finish).
--
-- Which instants are ticks is computed by the Go library (package schedules, on its
-- expression engine internal/cronspec): the database cannot evaluate a cron expression in
-- a zone. The database decides everything else by its own clock: whether a tick is due,
-- whether it is older than the catch-up window, who runs it (the first claim of the tick
-- advances the schedule's next_at; every other claim of it finds next_at moved and writes
-- nothing), and whether the claimer still has the schedule's current definition (every
-- change bumps version; a claim made with an older version changes nothing). A change
-- applies from the first tick after it: it sets arm_from, and the first scheduler (or the
-- Go call that made the change) computes the new next_at from it (pgcoord_schedule_arm).
--
-- Runs that do not start at their tick are rows in state 'pending', started in tick order
-- by pgcoord_schedule_start, one at a time per schedule: a tick buffered behind a running
-- one (overlap 'buffer'), a tick that came while no live process had registered the
-- schedule's handler, a manual trigger, and the ticks of a backfill. A tick older than the
-- catch-up window is recorded as 'missed' instead (one row for a run of them, with their
-- count in ticks).
--
-- Every change (create, update, pause, resume, delete, trigger, backfill) writes a row of
-- pgcoord_audit in its own transaction, and notifies pgcoord_channel('schedules') with
-- the schedule's wake tag, so running schedulers look again within a round trip.

-- +goose Up
ALTER TABLE pgcoord_jobs ADD COLUMN kind text NOT NULL DEFAULT 'interval';
ALTER TABLE pgcoord_jobs ALTER COLUMN every DROP NOT NULL, ALTER COLUMN origin DROP NOT NULL;
ALTER TABLE pgcoord_jobs ADD CONSTRAINT pgcoord_jobs_kind_check
    CHECK (kind = 'interval' AND every IS NOT NULL AND origin IS NOT NULL OR kind = 'cron' AND every IS NULL AND origin IS NULL);
ALTER TABLE pgcoord_jobs DROP CONSTRAINT pgcoord_jobs_overlap_check;
ALTER TABLE pgcoord_jobs ADD CONSTRAINT pgcoord_jobs_overlap_check CHECK (overlap IN ('allow', 'forbid', 'replace', 'buffer'));

ALTER TABLE pgcoord_job_runs DROP CONSTRAINT pgcoord_job_runs_state_check;
ALTER TABLE pgcoord_job_runs ADD CONSTRAINT pgcoord_job_runs_state_check
    CHECK (state IN ('running', 'succeeded', 'failed', 'skipped', 'replaced', 'pending', 'missed'));
-- Why the run exists: its tick came ('schedule'), it is a due tick queued behind another by
-- the catch-up policy 'all' ('catch-up'), it was triggered by hand ('trigger') or by a
-- backfill ('backfill'). A 'missed' or 'skipped' row may stand for several ticks.
ALTER TABLE pgcoord_job_runs ADD COLUMN cause text NOT NULL DEFAULT 'schedule'
    CHECK (cause IN ('schedule', 'catch-up', 'trigger', 'backfill'));
ALTER TABLE pgcoord_job_runs ADD COLUMN ticks bigint NOT NULL DEFAULT 1 CHECK (ticks >= 1);
CREATE INDEX pgcoord_job_runs_pending ON pgcoord_job_runs (job, scheduled_for) WHERE state = 'pending';

CREATE TABLE pgcoord_schedules (
    name            text        PRIMARY KEY REFERENCES pgcoord_jobs (name) ON DELETE CASCADE,
    -- The expression (pgcoord_cron_check) and its IANA zone (pgcoord_zone_check).
    expr            text        NOT NULL,
    zone            text        NOT NULL,
    -- The handler a process registers by name, and the JSON it is called with.
    handler         text        NOT NULL CHECK (octet_length(handler) BETWEEN 1 AND 255),
    args            jsonb       NOT NULL DEFAULT '{}' CHECK (octet_length(args::text) <= 65536),
    -- A tick older than catch_up when it is claimed is missed; within it, 'latest' runs the
    -- newest due tick only (the others are skipped), 'all' runs each in order.
    catch_up        interval    NOT NULL,
    catch_up_policy text        NOT NULL CHECK (catch_up_policy IN ('latest', 'all')),
    -- Each tick is claimed jitter × a fraction fixed by (name, tick) after it, the same on
    -- every replica; a run longer than deadline is cancelled and recorded as failed.
    jitter          interval    NOT NULL,
    deadline        interval,
    -- Ticks before starts_at or after ends_at do not run.
    starts_at       timestamptz,
    ends_at         timestamptz,
    paused_at       timestamptz,
    paused_by       text,
    paused_note     text,
    -- Bumped by every change of the definition (and by pause and resume).
    version         bigint      NOT NULL DEFAULT 1,
    -- The next tick to claim and when to claim it (next_at + jitter); NULL when the schedule
    -- is not armed yet (arm_from set) or has no tick left.
    next_at         timestamptz,
    due_at          timestamptz,
    -- Set by a change: the next tick is the first one after it.
    arm_from        timestamptz,
    created_at      timestamptz NOT NULL DEFAULT pgcoord_now(),
    updated_at      timestamptz NOT NULL DEFAULT pgcoord_now(),
    updated_by      text        NOT NULL
);

-- The due scan: the armed, unpaused schedules by when their next tick is due.
CREATE INDEX pgcoord_schedules_due ON pgcoord_schedules (due_at) WHERE paused_at IS NULL AND due_at IS NOT NULL;
CREATE INDEX pgcoord_schedules_unarmed ON pgcoord_schedules (name) WHERE arm_from IS NOT NULL;

COMMENT ON TABLE pgcoord_schedules IS 'pgcoord: schedules as rows (cron expressions in a zone); their runs are job runs';

-- The handlers live processes run: a scheduler registers each of its handlers until a
-- deadline it keeps extending, and deletes them when it stops.
CREATE TABLE pgcoord_schedule_handlers (
    handler text        NOT NULL CHECK (octet_length(handler) BETWEEN 1 AND 255),
    holder  text        NOT NULL CHECK (octet_length(holder) BETWEEN 1 AND 255),
    until   timestamptz NOT NULL,
    PRIMARY KEY (handler, holder)
);

COMMENT ON TABLE pgcoord_schedule_handlers IS 'pgcoord: schedule handlers registered by live processes';

-- pgcoord_schedule_jitter is the delay of a tick's claim after the tick: a fraction of
-- p_jitter fixed by (name, tick), so that every replica computes the same.
CREATE FUNCTION pgcoord_schedule_jitter(p_name text, p_tick timestamptz, p_jitter interval) RETURNS interval
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ SELECT CASE WHEN p_jitter <= interval '0' THEN interval '0' ELSE
                 p_jitter * ((pgcoord_lock_key('jitter:' || p_name || '@' || extract(epoch FROM p_tick)::text) & 65535) / 65536.0)
                 END $$;

-- pgcoord_schedule_live_handler tells whether a live process has registered p_handler.
CREATE FUNCTION pgcoord_schedule_live_handler(p_handler text) RETURNS boolean
    LANGUAGE sql STABLE PARALLEL SAFE
    AS $$ SELECT EXISTS (SELECT FROM pgcoord_schedule_handlers h WHERE h.handler = p_handler AND h.until > pgcoord_now()) $$;

-- pgcoord_schedule_changed audits a change made at p_at (NULL: the transaction's now) and
-- wakes the schedulers.
-- +goose StatementBegin
CREATE FUNCTION pgcoord_schedule_changed(p_name text, p_action text, p_actor text, p_details jsonb, p_at timestamptz DEFAULT NULL)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO pgcoord_audit (at, actor, action, target, details)
    VALUES (coalesce(p_at, pgcoord_now()), p_actor, 'schedule.' || p_action, p_name, coalesce(p_details, '{}'));
    PERFORM pg_notify(pgcoord_channel('schedules'), pgcoord_wake_tag(p_name));
END
$$;
-- +goose StatementEnd

-- pgcoord_schedule_args refuses a bad definition (22004 or 22023), before anything is written.
-- +goose StatementBegin
CREATE FUNCTION pgcoord_schedule_args(
    p_name text, p_expr text, p_zone text, p_handler text, p_args jsonb, p_catch_up interval,
    p_catch_up_policy text, p_overlap text, p_jitter interval, p_deadline interval,
    p_starts_at timestamptz, p_ends_at timestamptz, p_actor text
) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF NOT pgcoord_name_ok(p_name) THEN
        PERFORM pgcoord_refuse_name('schedule name', p_name);
    END IF;
    PERFORM pgcoord_cron_check(p_expr);
    PERFORM pgcoord_zone_check(p_zone);
    IF NOT pgcoord_name_ok(p_handler) THEN
        PERFORM pgcoord_refuse_name('schedule handler', p_handler);
    END IF;
    IF p_args IS NULL OR octet_length(p_args::text) > 65536 THEN
        PERFORM pgcoord_refuse('schedule args', 'JSON of at most 65536 bytes', octet_length(p_args::text) || ' bytes');
    END IF;
    IF p_catch_up IS NULL OR p_catch_up < interval '1 second' OR p_catch_up > interval '366 days'
       OR date_part('month', p_catch_up) <> 0 OR date_part('year', p_catch_up) <> 0 THEN
        PERFORM pgcoord_refuse('schedule catch-up window', 'between 1 second and 366 days, without months', p_catch_up::text);
    END IF;
    IF p_catch_up_policy IS NULL OR p_catch_up_policy NOT IN ('latest', 'all') THEN
        PERFORM pgcoord_refuse('schedule catch-up policy', 'latest or all', p_catch_up_policy);
    END IF;
    IF p_overlap IS NULL OR p_overlap NOT IN ('allow', 'forbid', 'replace', 'buffer') THEN
        PERFORM pgcoord_refuse('schedule overlap', 'forbid, buffer, allow or replace', p_overlap);
    END IF;
    IF p_jitter IS NULL OR p_jitter < interval '0' OR p_jitter > interval '24 hours'
       OR date_part('month', p_jitter) <> 0 OR date_part('year', p_jitter) <> 0 THEN
        PERFORM pgcoord_refuse('schedule jitter', 'between 0 and 24 hours', p_jitter::text);
    END IF;
    IF p_deadline IS NOT NULL AND NOT pgcoord_ttl_ok(p_deadline) THEN
        PERFORM pgcoord_refuse('schedule deadline', 'positive and at most 24 hours, or NULL', p_deadline::text);
    END IF;
    IF NOT isfinite(p_starts_at) THEN
        PERFORM pgcoord_refuse('schedule start', 'a finite time or NULL', p_starts_at::text);
    END IF;
    IF NOT isfinite(p_ends_at) THEN
        PERFORM pgcoord_refuse('schedule end', 'a finite time or NULL', p_ends_at::text);
    END IF;
    IF p_ends_at <= p_starts_at THEN
        PERFORM pgcoord_refuse('schedule end', 'after its start ' || p_starts_at, p_ends_at::text);
    END IF;
    IF NOT pgcoord_name_ok(p_actor) THEN
        PERFORM pgcoord_refuse_name('actor', p_actor);
    END IF;
    IF pg_is_in_recovery() THEN
        PERFORM pgcoord_refuse_on_standby();
    END IF;
END
$$;
-- +goose StatementEnd

-- pgcoord_schedule_create creates a schedule and returns it. Its first tick is the first one
-- after now (and not before p_starts_at). A name taken by any job raises 23505.
-- p_actor (default: the session user) is recorded in pgcoord_audit.
-- +goose StatementBegin
CREATE FUNCTION pgcoord_schedule_create(
    p_name text, p_expr text, p_zone text, p_handler text, p_args jsonb DEFAULT '{}',
    p_catch_up interval DEFAULT '1 hour', p_catch_up_policy text DEFAULT 'latest',
    p_overlap text DEFAULT 'forbid', p_jitter interval DEFAULT '0', p_deadline interval DEFAULT NULL,
    p_starts_at timestamptz DEFAULT NULL, p_ends_at timestamptz DEFAULT NULL, p_actor text DEFAULT NULL
) RETURNS SETOF pgcoord_schedules LANGUAGE plpgsql AS $$
DECLARE
    v_actor text := coalesce(p_actor, session_user);
    r pgcoord_schedules;
BEGIN
    PERFORM pgcoord_schedule_args(p_name, p_expr, p_zone, p_handler, p_args, p_catch_up, p_catch_up_policy,
                                  p_overlap, p_jitter, p_deadline, p_starts_at, p_ends_at, v_actor);
    INSERT INTO pgcoord_jobs (name, kind, every, origin, overlap) VALUES (p_name, 'cron', NULL, NULL, p_overlap)
    ON CONFLICT (name) DO NOTHING;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'pgcoord: a job or schedule named % exists', quote_literal(p_name) USING ERRCODE = '23505';
    END IF;
    INSERT INTO pgcoord_schedules (name, expr, zone, handler, args, catch_up, catch_up_policy, jitter, deadline,
                                   starts_at, ends_at, arm_from, updated_by)
    VALUES (p_name, btrim(p_expr), p_zone, p_handler, p_args, p_catch_up, p_catch_up_policy, p_jitter, p_deadline,
            p_starts_at, p_ends_at, pgcoord_now(), v_actor)
    RETURNING * INTO r;
    PERFORM pgcoord_schedule_changed(p_name, 'create', v_actor, to_jsonb(r) - 'next_at' - 'due_at' - 'arm_from');
    RETURN NEXT r;
END
$$;
-- +goose StatementEnd

-- pgcoord_schedule_lock takes a schedule's row lock, which its claims take too, and returns
-- the database clock once it holds it: a change is dated after every claim that committed
-- before it, so "after the change" means after every claim made with the old definition.
-- +goose StatementBegin
CREATE FUNCTION pgcoord_schedule_lock(p_name text) RETURNS timestamptz LANGUAGE plpgsql AS $$
BEGIN
    PERFORM FROM pgcoord_schedules s WHERE s.name = p_name FOR NO KEY UPDATE;
    RETURN pgcoord_clock();
END
$$;
-- +goose StatementEnd

-- pgcoord_schedule_update replaces a schedule's definition (every argument, as in
-- pgcoord_schedule_create) and returns it; no row when there is no such schedule, or when
-- p_version is given and the schedule's version is another (it changed since it was read).
-- The change applies from the first tick after it: a tick of the old definition that was
-- not claimed before the change never runs.
-- +goose StatementBegin
CREATE FUNCTION pgcoord_schedule_update(
    p_name text, p_expr text, p_zone text, p_handler text, p_args jsonb,
    p_catch_up interval, p_catch_up_policy text, p_overlap text, p_jitter interval, p_deadline interval,
    p_starts_at timestamptz, p_ends_at timestamptz, p_version bigint DEFAULT NULL, p_actor text DEFAULT NULL
) RETURNS SETOF pgcoord_schedules LANGUAGE plpgsql AS $$
DECLARE
    v_actor text := coalesce(p_actor, session_user);
    v_at timestamptz;
    r pgcoord_schedules;
BEGIN
    PERFORM pgcoord_schedule_args(p_name, p_expr, p_zone, p_handler, p_args, p_catch_up, p_catch_up_policy,
                                  p_overlap, p_jitter, p_deadline, p_starts_at, p_ends_at, v_actor);
    -- The change is dated once it holds the schedule's row (see pgcoord_schedule_lock).
    v_at := pgcoord_schedule_lock(p_name);
    UPDATE pgcoord_schedules s
       SET expr = btrim(p_expr), zone = p_zone, handler = p_handler, args = p_args, catch_up = p_catch_up,
           catch_up_policy = p_catch_up_policy, jitter = p_jitter, deadline = p_deadline,
           starts_at = p_starts_at, ends_at = p_ends_at, version = s.version + 1,
           next_at = NULL, due_at = NULL, arm_from = v_at, updated_at = v_at, updated_by = v_actor
     WHERE s.name = p_name AND (p_version IS NULL OR s.version = p_version)
    RETURNING * INTO r;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    UPDATE pgcoord_jobs SET overlap = p_overlap WHERE name = p_name;
    PERFORM pgcoord_schedule_changed(p_name, 'update', v_actor,
                                     to_jsonb(r) - 'next_at' - 'due_at' - 'arm_from' || jsonb_build_object('overlap', p_overlap), v_at);
    RETURN NEXT r;
END
$$;
-- +goose StatementEnd

-- pgcoord_schedule_pause pauses a schedule (no tick runs while it is paused; runs already
-- running go on) and returns it; pgcoord_schedule_resume resumes it from the first tick
-- after now. No row when there is no such schedule; pausing a paused schedule (or
-- resuming an active one) changes nothing and writes no audit row.
-- +goose StatementBegin
CREATE FUNCTION pgcoord_schedule_pause(p_name text, p_note text DEFAULT NULL, p_actor text DEFAULT NULL)
RETURNS SETOF pgcoord_schedules LANGUAGE plpgsql AS $$
DECLARE
    v_actor text := coalesce(p_actor, session_user);
    v_at timestamptz;
    r pgcoord_schedules;
BEGIN
    IF NOT pgcoord_name_ok(p_name) THEN
        PERFORM pgcoord_refuse_name('schedule name', p_name);
    END IF;
    IF NOT pgcoord_name_ok(v_actor) THEN
        PERFORM pgcoord_refuse_name('actor', v_actor);
    END IF;
    IF octet_length(p_note) > 1000 THEN
        PERFORM pgcoord_refuse('pause note', 'at most 1000 bytes', octet_length(p_note) || ' bytes');
    END IF;
    v_at := pgcoord_schedule_lock(p_name);
    SELECT * INTO r FROM pgcoord_schedules s WHERE s.name = p_name;
    IF NOT FOUND OR r.paused_at IS NOT NULL THEN
        IF FOUND THEN
            RETURN NEXT r; -- paused already: nothing changes, nothing is audited
        END IF;
        RETURN;
    END IF;
    UPDATE pgcoord_schedules s
       SET paused_at = v_at, paused_by = v_actor, paused_note = p_note, version = s.version + 1
     WHERE s.name = p_name
    RETURNING * INTO r;
    PERFORM pgcoord_schedule_changed(p_name, 'pause', v_actor, jsonb_build_object('note', p_note), v_at);
    RETURN NEXT r;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION pgcoord_schedule_resume(p_name text, p_actor text DEFAULT NULL)
RETURNS SETOF pgcoord_schedules LANGUAGE plpgsql AS $$
DECLARE
    v_actor text := coalesce(p_actor, session_user);
    v_at timestamptz;
    r pgcoord_schedules;
BEGIN
    IF NOT pgcoord_name_ok(p_name) THEN
        PERFORM pgcoord_refuse_name('schedule name', p_name);
    END IF;
    IF NOT pgcoord_name_ok(v_actor) THEN
        PERFORM pgcoord_refuse_name('actor', v_actor);
    END IF;
    v_at := pgcoord_schedule_lock(p_name);
    UPDATE pgcoord_schedules s
       SET paused_at = NULL, paused_by = NULL, paused_note = NULL, version = s.version + 1,
           next_at = NULL, due_at = NULL, arm_from = v_at
     WHERE s.name = p_name AND s.paused_at IS NOT NULL
    RETURNING * INTO r;
    IF NOT FOUND THEN
        RETURN QUERY SELECT * FROM pgcoord_schedules s WHERE s.name = p_name;
        RETURN;
    END IF;
    PERFORM pgcoord_schedule_changed(p_name, 'resume', v_actor, '{}', v_at);
    RETURN NEXT r;
END
$$;
-- +goose StatementEnd

-- pgcoord_schedule_delete deletes a schedule with its job row and run history; false when
-- there was none. A run still running finds its heartbeats and finish refused (lost).
-- +goose StatementBegin
CREATE FUNCTION pgcoord_schedule_delete(p_name text, p_actor text DEFAULT NULL) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    v_actor text := coalesce(p_actor, session_user);
BEGIN
    IF NOT pgcoord_name_ok(p_name) THEN
        PERFORM pgcoord_refuse_name('schedule name', p_name);
    END IF;
    IF NOT pgcoord_name_ok(v_actor) THEN
        PERFORM pgcoord_refuse_name('actor', v_actor);
    END IF;
    DELETE FROM pgcoord_jobs j WHERE j.name = p_name AND j.kind = 'cron';
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM pgcoord_schedule_changed(p_name, 'delete', v_actor, '{}');
    RETURN true;
END
$$;
-- +goose StatementEnd

-- pgcoord_schedule_arm sets the next tick of a schedule that a change left unarmed:
-- p_next is the first tick of version p_version after its arm_from (NULL: it has none, the
-- schedule has ended), computed by the caller from the expression. Returns the schedule;
-- no row when it is not that version, or already armed.
-- +goose StatementBegin
CREATE FUNCTION pgcoord_schedule_arm(p_name text, p_version bigint, p_next timestamptz)
RETURNS SETOF pgcoord_schedules LANGUAGE plpgsql AS $$
BEGIN
    IF NOT pgcoord_name_ok(p_name) THEN
        PERFORM pgcoord_refuse_name('schedule name', p_name);
    END IF;
    IF p_version IS NULL OR p_version < 1 THEN
        PERFORM pgcoord_refuse('schedule version', 'positive', p_version::text);
    END IF;
    IF p_next IS NOT NULL AND NOT isfinite(p_next) THEN
        PERFORM pgcoord_refuse('next tick', 'a finite time or NULL', p_next::text);
    END IF;
    RETURN QUERY
    UPDATE pgcoord_schedules s
       SET next_at = p_next, due_at = p_next + pgcoord_schedule_jitter(s.name, p_next, s.jitter), arm_from = NULL
     WHERE s.name = p_name AND s.version = p_version AND s.arm_from IS NOT NULL
       AND (p_next IS NULL OR p_next > s.arm_from)
    RETURNING s.*;
END
$$;
-- +goose StatementEnd

-- pgcoord_schedule_handlers_args refuses the handlers a scheduler runs (22004 or 22023):
-- an array of at most 1000 names of 1 to 255 bytes.
-- +goose StatementBegin
CREATE FUNCTION pgcoord_schedule_handlers_args(p_handlers text[]) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF p_handlers IS NULL OR cardinality(p_handlers) > 1000 THEN
        PERFORM pgcoord_refuse('schedule handlers', 'an array of at most 1000 names', cardinality(p_handlers) || ' names');
    END IF;
    IF EXISTS (SELECT FROM unnest(p_handlers) h WHERE NOT pgcoord_name_ok(h)) THEN
        PERFORM pgcoord_refuse('schedule handlers', 'names of 1 to 255 bytes without control characters',
                               'a NULL, empty, longer or control-character name');
    END IF;
END
$$;
-- +goose StatementEnd

-- pgcoord_schedule_claim claims the due ticks of a schedule, whose version p_version the
-- caller read, starting at its next_at p_from:
--   p_missed  ticks from p_from on that the caller found older than the catch-up window
--             (recorded as one 'missed' row, at p_from);
--   p_ticks   the due ticks after those, ascending (at most 1000), each at most now;
--   p_next    the tick after the last of p_ticks (NULL: none, the schedule ends).
-- The database judges each tick of p_ticks again by its clock: one older than the window
-- counts as missed too, one in the future is refused (22023). By the catch-up policy,
-- 'latest' runs the last of p_ticks and records the others as one 'skipped' row; 'all'
-- runs the first and queues the others as 'pending' runs (cause 'catch-up'), which start
-- in order, each once the run before it finished. The tick to run is then started (when
-- p_handlers has the schedule's handler) under the overlap policy, or recorded 'pending'
-- (when no live process registered the handler: it starts when one does), or skipped
-- (overlap 'forbid', or 'buffer' with one pending already).
-- Returns the claimed run (state 'running': run it, heartbeat it, finish it) or a run
-- recorded otherwise; no row when the claim came too late — another claimer advanced
-- next_at, or the schedule changed — in which case nothing was written.
-- +goose StatementBegin
CREATE FUNCTION pgcoord_schedule_claim(
    p_name text, p_version bigint, p_from timestamptz, p_missed bigint, p_ticks timestamptz[],
    p_next timestamptz, p_holder text, p_handlers text[], p_ttl interval
) RETURNS SETOF pgcoord_job_runs LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := pgcoord_now();
    s pgcoord_schedules;
    v_ticks timestamptz[];
    v_run timestamptz;
    v_missed bigint := p_missed;
BEGIN
    IF NOT pgcoord_name_ok(p_name) THEN
        PERFORM pgcoord_refuse_name('schedule name', p_name);
    END IF;
    IF p_version IS NULL OR p_version < 1 THEN
        PERFORM pgcoord_refuse('schedule version', 'positive', p_version::text);
    END IF;
    IF p_from IS NULL OR NOT isfinite(p_from) OR p_from > v_now THEN
        PERFORM pgcoord_refuse('first claimed tick', 'the schedule''s next tick, at most now (' || v_now || ')', p_from::text);
    END IF;
    IF p_missed IS NULL OR p_missed < 0 THEN
        PERFORM pgcoord_refuse('missed ticks', 'zero or more', p_missed::text);
    END IF;
    IF p_ticks IS NULL OR cardinality(p_ticks) > 1000 THEN
        PERFORM pgcoord_refuse('due ticks', 'an array of at most 1000', cardinality(p_ticks)::text);
    END IF;
    -- (One due tick, the usual claim, is judged without a query.)
    IF (CASE cardinality(p_ticks) WHEN 0 THEN false
            WHEN 1 THEN p_ticks[1] IS NULL OR p_ticks[1] > v_now OR p_ticks[1] < p_from
            ELSE EXISTS (SELECT FROM unnest(p_ticks) WITH ORDINALITY t(at, n)
                          WHERE t.at IS NULL OR t.at > v_now OR t.at < p_from
                             OR t.at <= (SELECT u.at FROM unnest(p_ticks) WITH ORDINALITY u(at, m) WHERE u.m = t.n - 1)) END) THEN
        PERFORM pgcoord_refuse('due ticks', 'ascending, from the next tick on, none after now (' || v_now || ')',
                               p_ticks::text);
    END IF;
    IF v_missed = 0 AND cardinality(p_ticks) = 0 THEN
        PERFORM pgcoord_refuse('due ticks', 'at least one when no tick is missed', '0');
    END IF;
    IF p_next IS NOT NULL AND (NOT isfinite(p_next) OR p_next <= coalesce(p_ticks[cardinality(p_ticks)], p_from)) THEN
        PERFORM pgcoord_refuse('next tick', 'after the due ticks', p_next::text);
    END IF;
    IF NOT pgcoord_name_ok(p_holder) THEN
        PERFORM pgcoord_refuse_name('schedule holder', p_holder);
    END IF;
    PERFORM pgcoord_schedule_handlers_args(p_handlers);
    IF NOT pgcoord_ttl_ok(p_ttl) THEN
        PERFORM pgcoord_refuse('schedule run ttl', 'positive, at most 24 hours and without months', p_ttl::text);
    END IF;
    -- Most claims lose (every replica claims every tick): decide them by a plain read.
    SELECT * INTO s FROM pgcoord_schedules x WHERE x.name = p_name;
    IF NOT FOUND OR s.version <> p_version OR s.next_at IS DISTINCT FROM p_from OR s.paused_at IS NOT NULL THEN
        RETURN;
    END IF;
    IF pg_is_in_recovery() THEN
        PERFORM pgcoord_refuse_on_standby();
    END IF;
    -- The schedule's row serializes its claims, starts and changes: a claim that read the
    -- definition before a change (or a pause) committed finds it changed here. A claim
    -- does not wait for the row: another replica holding it is claiming the same tick (or
    -- a change is under way), and this one would find it taken; it writes nothing, and the
    -- next look tries again if the tick is still due. (Replicas then never queue behind
    -- each other's claims, and batches of claims in name order cannot deadlock.)
    SELECT * INTO s FROM pgcoord_schedules x WHERE x.name = p_name FOR NO KEY UPDATE SKIP LOCKED;
    IF NOT FOUND OR s.version <> p_version OR s.next_at IS DISTINCT FROM p_from OR s.paused_at IS NOT NULL THEN
        RETURN;
    END IF;

    -- The database's verdict on each due tick: older than the window is missed.
    IF cardinality(p_ticks) <= 1 THEN
        v_ticks := CASE WHEN p_ticks[1] < v_now - s.catch_up THEN '{}' ELSE p_ticks END;
        v_missed := v_missed + cardinality(p_ticks) - cardinality(v_ticks);
    ELSE
        v_missed := v_missed + (SELECT count(*) FROM unnest(p_ticks) t(at) WHERE t.at < v_now - s.catch_up);
        v_ticks := ARRAY(SELECT t.at FROM unnest(p_ticks) t(at) WHERE t.at >= v_now - s.catch_up ORDER BY t.at);
    END IF;
    IF v_missed > 0 THEN
        INSERT INTO pgcoord_job_runs (job, scheduled_for, state, fence_token, holder, started_at, finished_at, error, ticks)
        VALUES (p_name, p_from, 'missed', 0, p_holder, v_now, v_now,
                format('%s tick(s) from %s older than the catch-up window (%s) when claimed', v_missed, p_from, s.catch_up),
                v_missed)
        ON CONFLICT (job, scheduled_for) DO NOTHING;
    END IF;
    IF cardinality(v_ticks) = 0 THEN
        v_run := NULL;
    ELSIF s.catch_up_policy = 'latest' THEN
        v_run := v_ticks[cardinality(v_ticks)];
        IF cardinality(v_ticks) > 1 THEN
            INSERT INTO pgcoord_job_runs (job, scheduled_for, state, fence_token, holder, started_at, finished_at, error, ticks)
            VALUES (p_name, v_ticks[1], 'skipped', 0, p_holder, v_now, v_now,
                    format('%s tick(s) from %s skipped by the catch-up policy latest', cardinality(v_ticks) - 1, v_ticks[1]),
                    cardinality(v_ticks) - 1)
            ON CONFLICT (job, scheduled_for) DO NOTHING;
        END IF;
    ELSE
        v_run := v_ticks[1];
    END IF;
    -- Advance to p_next, unless it is after the end.
    s.next_at := p_next;
    IF s.next_at > s.ends_at THEN
        s.next_at := NULL;
    END IF;
    UPDATE pgcoord_schedules x
       SET next_at = s.next_at, due_at = s.next_at + pgcoord_schedule_jitter(x.name, s.next_at, x.jitter)
     WHERE x.name = p_name;
    IF v_run IS NULL THEN
        RETURN QUERY SELECT * FROM pgcoord_job_runs r WHERE r.job = p_name AND r.scheduled_for = p_from;
        RETURN;
    END IF;
    RETURN QUERY SELECT * FROM pgcoord_schedule_begin(p_name, v_run, 'schedule', p_holder, p_handlers, p_ttl, false);
    -- The catch-up policy 'all' queues the other due ticks, in order, behind the first.
    IF s.catch_up_policy = 'all' AND cardinality(v_ticks) > 1 THEN
        INSERT INTO pgcoord_job_runs (job, scheduled_for, state, fence_token, holder, started_at, cause, error)
        SELECT p_name, t.at, 'pending', 0, p_holder, v_now, 'catch-up', 'queued by the catch-up policy all'
          FROM unnest(v_ticks[2:]) t(at)
        ON CONFLICT (job, scheduled_for) DO NOTHING;
    END IF;
END
$$;
-- +goose StatementEnd

-- pgcoord_schedule_begin starts a run of a schedule for p_tick (with the schedule's row
-- locked by the caller), by the handler's presence and the overlap policy; p_pending says the run
-- exists as a 'pending' row already. Internal to pgcoord_schedule_claim and _start.
-- +goose StatementBegin
CREATE FUNCTION pgcoord_schedule_begin(
    p_name text, p_tick timestamptz, p_cause text, p_holder text, p_handlers text[], p_ttl interval, p_pending boolean
) RETURNS SETOF pgcoord_job_runs LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := pgcoord_now();
    v_job pgcoord_jobs;
    v_handler text;
    v_busy boolean;
    v_state text;
    v_error text;
    r pgcoord_job_runs;
BEGIN
    SELECT * INTO v_job FROM pgcoord_jobs j WHERE j.name = p_name;
    SELECT s.handler INTO v_handler FROM pgcoord_schedules s WHERE s.name = p_name;
    v_busy := EXISTS (SELECT FROM pgcoord_job_runs x WHERE x.job = p_name AND x.state = 'running' AND x.expires_at > v_now);
    IF NOT (v_handler = ANY (coalesce(p_handlers, '{}'))) THEN
        IF p_pending THEN
            RETURN; -- still waiting for its handler
        END IF;
        v_state := 'pending';
        v_error := CASE WHEN pgcoord_schedule_live_handler(v_handler) THEN NULL
                        ELSE format('waiting for a process that runs the handler %s', quote_literal(v_handler)) END;
    ELSIF v_busy AND p_pending AND p_cause IN ('catch-up', 'backfill', 'trigger') THEN
        RETURN; -- queued ticks, a backfill's ticks and a trigger wait for the run in their way, whatever the overlap policy
    ELSIF v_busy AND v_job.overlap = 'forbid' THEN
        v_state := 'skipped';
        v_error := 'previous run still running';
    ELSIF v_busy AND v_job.overlap = 'buffer' THEN
        IF p_pending THEN
            RETURN; -- still buffered behind the running one
        END IF;
        IF EXISTS (SELECT FROM pgcoord_job_runs x WHERE x.job = p_name AND x.state = 'pending' AND x.cause = 'schedule') THEN
            v_state := 'skipped';
            v_error := 'previous run still running, and one tick is buffered already';
        ELSE
            v_state := 'pending';
            v_error := 'buffered: previous run still running';
        END IF;
    ELSE
        IF v_busy AND v_job.overlap = 'replace' THEN
            UPDATE pgcoord_job_runs x
               SET state = 'replaced', finished_at = v_now, expires_at = NULL, error = 'replaced by the run for ' || p_tick
             WHERE x.job = p_name AND x.state = 'running';
        END IF;
        UPDATE pgcoord_jobs SET fence_token = pgcoord_next_token(), last_started_at = v_now
         WHERE name = p_name RETURNING * INTO v_job;
        INSERT INTO pgcoord_job_runs AS jr (job, scheduled_for, state, fence_token, holder, started_at, expires_at, cause)
        VALUES (p_name, p_tick, 'running', v_job.fence_token, p_holder, v_now, v_now + p_ttl, p_cause)
        ON CONFLICT (job, scheduled_for) DO UPDATE
           SET state = 'running', fence_token = excluded.fence_token,
               attempt = jr.attempt + CASE WHEN jr.state = 'pending' THEN 0 ELSE 1 END,
               holder = excluded.holder, started_at = excluded.started_at,
               expires_at = excluded.expires_at, finished_at = NULL, error = NULL
        RETURNING * INTO r;
        RETURN NEXT r;
        RETURN;
    END IF;
    IF p_pending THEN
        UPDATE pgcoord_job_runs x SET state = v_state, error = v_error,
                                      finished_at = CASE WHEN v_state = 'pending' THEN NULL ELSE v_now END
         WHERE x.job = p_name AND x.scheduled_for = p_tick
        RETURNING * INTO r;
    ELSE
        INSERT INTO pgcoord_job_runs (job, scheduled_for, state, fence_token, holder, started_at, finished_at, error, cause)
        VALUES (p_name, p_tick, v_state, v_job.fence_token, p_holder, v_now,
                CASE WHEN v_state = 'pending' THEN NULL ELSE v_now END, v_error, p_cause)
        ON CONFLICT (job, scheduled_for) DO NOTHING
        RETURNING * INTO r;
    END IF;
    IF r.job IS NOT NULL THEN
        RETURN NEXT r;
    END IF;
END
$$;
-- +goose StatementEnd

-- pgcoord_schedule_start starts the oldest run of a schedule that is waiting — pending
-- (buffered, waiting for a handler, triggered, backfilled) or running with an expired lease
-- (its runner died: taken over as the next attempt, with a new token) — when p_handlers has
-- the schedule's handler and the overlap policy lets it start now. A pending tick of the
-- schedule's own (not a trigger or backfill) older than the catch-up window is recorded
-- missed instead, and the next one looked at. Returns the started run; no row when none can
-- start now.
-- +goose StatementBegin
CREATE FUNCTION pgcoord_schedule_start(p_name text, p_holder text, p_handlers text[], p_ttl interval)
RETURNS SETOF pgcoord_job_runs LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := pgcoord_now();
    s pgcoord_schedules;
    r pgcoord_job_runs;
BEGIN
    IF NOT pgcoord_name_ok(p_name) THEN
        PERFORM pgcoord_refuse_name('schedule name', p_name);
    END IF;
    IF NOT pgcoord_name_ok(p_holder) THEN
        PERFORM pgcoord_refuse_name('schedule holder', p_holder);
    END IF;
    PERFORM pgcoord_schedule_handlers_args(p_handlers);
    IF NOT pgcoord_ttl_ok(p_ttl) THEN
        PERFORM pgcoord_refuse('schedule run ttl', 'positive, at most 24 hours and without months', p_ttl::text);
    END IF;
    SELECT * INTO s FROM pgcoord_schedules x WHERE x.name = p_name;
    IF NOT FOUND OR s.paused_at IS NOT NULL OR NOT (s.handler = ANY (p_handlers)) THEN
        RETURN;
    END IF;
    IF pg_is_in_recovery() THEN
        PERFORM pgcoord_refuse_on_standby();
    END IF;
    SELECT * INTO s FROM pgcoord_schedules x WHERE x.name = p_name FOR NO KEY UPDATE;
    IF NOT FOUND OR s.paused_at IS NOT NULL THEN
        RETURN;
    END IF;
    -- A run whose runner died: taken over (a run with a live lease blocks the others).
    SELECT * INTO r FROM pgcoord_job_runs x
     WHERE x.job = p_name AND x.state = 'running' AND x.expires_at <= v_now
     ORDER BY x.scheduled_for LIMIT 1;
    IF FOUND THEN
        IF r.cause IN ('schedule', 'catch-up') AND r.scheduled_for < v_now - s.catch_up THEN
            UPDATE pgcoord_job_runs x
               SET state = 'failed', finished_at = v_now, expires_at = NULL,
                   error = 'abandoned: its runner stopped heartbeating, and the tick is older than the catch-up window'
             WHERE x.job = p_name AND x.scheduled_for = r.scheduled_for;
            UPDATE pgcoord_jobs SET last_failure_at = v_now, consecutive_failures = consecutive_failures + 1,
                                    last_error = 'abandoned: its runner stopped heartbeating'
             WHERE name = p_name;
        ELSE
            UPDATE pgcoord_jobs SET fence_token = pgcoord_next_token(), last_started_at = v_now WHERE name = p_name;
            RETURN QUERY
            UPDATE pgcoord_job_runs x
               SET fence_token = (SELECT j.fence_token FROM pgcoord_jobs j WHERE j.name = p_name),
                   attempt = x.attempt + 1, holder = p_holder, started_at = v_now, expires_at = v_now + p_ttl
             WHERE x.job = p_name AND x.scheduled_for = r.scheduled_for
            RETURNING x.*;
            RETURN;
        END IF;
    END IF;
    FOR r IN SELECT * FROM pgcoord_job_runs x WHERE x.job = p_name AND x.state = 'pending'
              ORDER BY x.scheduled_for LIMIT 100 LOOP
        IF r.cause IN ('schedule', 'catch-up') AND r.scheduled_for < v_now - s.catch_up THEN
            UPDATE pgcoord_job_runs x
               SET state = 'missed', finished_at = v_now,
                   error = coalesce(x.error || '; ', '') || 'older than the catch-up window (' || s.catch_up || ') when it could start'
             WHERE x.job = p_name AND x.scheduled_for = r.scheduled_for;
            CONTINUE;
        END IF;
        RETURN QUERY SELECT * FROM pgcoord_schedule_begin(p_name, r.scheduled_for, r.cause, p_holder, p_handlers, p_ttl, true);
        RETURN;
    END LOOP;
END
$$;
-- +goose StatementEnd

-- pgcoord_schedule_trigger asks for a run now, beside the scheduled ones: a 'pending' run
-- (cause 'trigger') for the database's now, started by a scheduler that runs the handler as
-- soon as no run of the schedule is running (whatever the overlap policy). Returns the pending run; no row when there is no
-- such schedule. Audited.
-- +goose StatementBegin
CREATE FUNCTION pgcoord_schedule_trigger(p_name text, p_actor text DEFAULT NULL)
RETURNS SETOF pgcoord_job_runs LANGUAGE plpgsql AS $$
DECLARE
    v_actor text := coalesce(p_actor, session_user);
    r pgcoord_job_runs;
BEGIN
    IF NOT pgcoord_name_ok(p_name) THEN
        PERFORM pgcoord_refuse_name('schedule name', p_name);
    END IF;
    IF NOT pgcoord_name_ok(v_actor) THEN
        PERFORM pgcoord_refuse_name('actor', v_actor);
    END IF;
    IF pg_is_in_recovery() THEN
        PERFORM pgcoord_refuse_on_standby();
    END IF;
    PERFORM FROM pgcoord_schedules x WHERE x.name = p_name FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    -- The run's instant is the database's now; a run recorded for that very microsecond
    -- (another trigger in the same transaction) moves it on by one.
    INSERT INTO pgcoord_job_runs (job, scheduled_for, state, fence_token, holder, started_at, cause, error)
    SELECT p_name, pgcoord_now() + make_interval(secs => n / 1e6), 'pending', 0, v_actor, pgcoord_now(), 'trigger',
           'triggered by ' || v_actor
      FROM generate_series(0, 1000) n
     WHERE NOT EXISTS (SELECT FROM pgcoord_job_runs x WHERE x.job = p_name
                          AND x.scheduled_for = pgcoord_now() + make_interval(secs => n / 1e6))
     LIMIT 1
    RETURNING * INTO r;
    PERFORM pgcoord_schedule_changed(p_name, 'trigger', v_actor, jsonb_build_object('run', r.scheduled_for));
    RETURN NEXT r;
END
$$;
-- +goose StatementEnd

-- pgcoord_schedule_backfill records past ticks of a schedule as 'pending' runs (cause
-- 'backfill'), each at most once: a tick that has a run already (of any state) is left as
-- it is, so a backfill can be repeated or resumed. p_ticks (at most 10,000, none after now)
-- are the caller's: the Go library computes them from the expression (schedules.Backfill).
-- Schedulers that run the handler start them in tick order, one at a time. Returns how
-- many runs it recorded; NULL when there is no such schedule. Audited.
-- +goose StatementBegin
CREATE FUNCTION pgcoord_schedule_backfill(p_name text, p_ticks timestamptz[], p_actor text DEFAULT NULL)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    v_actor text := coalesce(p_actor, session_user);
    v_n bigint;
BEGIN
    IF NOT pgcoord_name_ok(p_name) THEN
        PERFORM pgcoord_refuse_name('schedule name', p_name);
    END IF;
    IF NOT pgcoord_name_ok(v_actor) THEN
        PERFORM pgcoord_refuse_name('actor', v_actor);
    END IF;
    IF p_ticks IS NULL OR cardinality(p_ticks) NOT BETWEEN 1 AND 10000 THEN
        PERFORM pgcoord_refuse('backfill ticks', 'between 1 and 10000', cardinality(p_ticks)::text);
    END IF;
    IF EXISTS (SELECT FROM unnest(p_ticks) t(at) WHERE t.at IS NULL OR NOT isfinite(t.at) OR t.at > pgcoord_now()) THEN
        PERFORM pgcoord_refuse('backfill ticks', 'finite and none after now (' || pgcoord_now() || ')', 'a later or NULL tick');
    END IF;
    IF pg_is_in_recovery() THEN
        PERFORM pgcoord_refuse_on_standby();
    END IF;
    PERFORM FROM pgcoord_schedules x WHERE x.name = p_name FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    INSERT INTO pgcoord_job_runs (job, scheduled_for, state, fence_token, holder, started_at, cause, error)
    SELECT DISTINCT p_name, t.at, 'pending', 0, v_actor, pgcoord_now(), 'backfill', 'backfilled by ' || v_actor
      FROM unnest(p_ticks) t(at)
    ON CONFLICT (job, scheduled_for) DO NOTHING;
    GET DIAGNOSTICS v_n = ROW_COUNT;
    PERFORM pgcoord_schedule_changed(p_name, 'backfill', v_actor,
                                     jsonb_build_object('from', (SELECT min(t) FROM unnest(p_ticks) t),
                                                        'to', (SELECT max(t) FROM unnest(p_ticks) t),
                                                        'ticks', cardinality(p_ticks), 'recorded', v_n));
    RETURN v_n;
END
$$;
-- +goose StatementEnd

-- pgcoord_schedule_register registers p_handlers for p_holder until now + p_ttl (and
-- deletes registrations that ran out); pgcoord_schedule_unregister deletes p_holder's.
-- +goose StatementBegin
CREATE FUNCTION pgcoord_schedule_register(p_holder text, p_handlers text[], p_ttl interval) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF NOT pgcoord_name_ok(p_holder) THEN
        PERFORM pgcoord_refuse_name('schedule holder', p_holder);
    END IF;
    PERFORM pgcoord_schedule_handlers_args(p_handlers);
    IF NOT pgcoord_ttl_ok(p_ttl) THEN
        PERFORM pgcoord_refuse('handler registration ttl', 'positive, at most 24 hours and without months', p_ttl::text);
    END IF;
    PERFORM set_config('synchronous_commit', 'off', true);
    DELETE FROM pgcoord_schedule_handlers h
     WHERE (h.handler, h.holder) IN (SELECT x.handler, x.holder FROM pgcoord_schedule_handlers x
                                      WHERE x.until <= pgcoord_now() FOR UPDATE SKIP LOCKED);
    DELETE FROM pgcoord_schedule_handlers h WHERE h.holder = p_holder AND NOT (h.handler = ANY (p_handlers));
    INSERT INTO pgcoord_schedule_handlers (handler, holder, until)
    SELECT DISTINCT h, p_holder, pgcoord_now() + p_ttl FROM unnest(p_handlers) h
    ON CONFLICT (handler, holder) DO UPDATE SET until = excluded.until;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION pgcoord_schedule_unregister(p_holder text) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF NOT pgcoord_name_ok(p_holder) THEN
        PERFORM pgcoord_refuse_name('schedule holder', p_holder);
    END IF;
    DELETE FROM pgcoord_schedule_handlers h WHERE h.holder = p_holder;
END
$$;
-- +goose StatementEnd

-- Retention: pgcoord_gc lists one kind more, schedule_handlers, after those of 00013. A
-- scheduler that stops deletes its registrations, and every registration deletes those
-- that ran out; the registrations of schedulers that were killed, when no other registers
-- since, are left. pgcoord_gc_schedule_handlers deletes, by the database clock, up to
-- p_batch registrations that ran out longer than p_older_than ago, skipping rows a
-- scheduler holds; with p_dry_run it counts them. Until then they say which process ran
-- which handler until when (pgcoord_schedule_handlers).
-- +goose StatementBegin
CREATE FUNCTION pgcoord_gc_schedule_handlers(p_older_than interval, p_batch integer, p_dry_run boolean)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    v_cutoff timestamptz := pgcoord_now() - p_older_than;
    v_n bigint;
BEGIN
    IF p_dry_run THEN
        SELECT count(*) INTO v_n FROM pgcoord_schedule_handlers h WHERE h.until < v_cutoff;
        RETURN v_n;
    END IF;
    DELETE FROM pgcoord_schedule_handlers h
     WHERE (h.handler, h.holder) IN (SELECT x.handler, x.holder FROM pgcoord_schedule_handlers x
                                      WHERE x.until < v_cutoff LIMIT p_batch FOR UPDATE SKIP LOCKED)
       AND h.until < v_cutoff;
    GET DIAGNOSTICS v_n = ROW_COUNT;
    RETURN v_n;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pgcoord_gc(p_older_than interval, p_batch integer DEFAULT 10000, p_dry_run boolean DEFAULT false)
RETURNS TABLE (kind text, removed bigint) LANGUAGE plpgsql AS $$
BEGIN
    -- The core checks the arguments first.
    RETURN QUERY SELECT g.kind, g.removed FROM pgcoord_gc_core(p_older_than, p_batch, p_dry_run) g;
    kind := 'ratelimit'; removed := pgcoord_gc_ratelimit(p_batch, p_dry_run); RETURN NEXT;
    kind := 'schedule_handlers'; removed := pgcoord_gc_schedule_handlers(p_older_than, p_batch, p_dry_run); RETURN NEXT;
END
$$;
-- +goose StatementEnd

-- +goose Down
-- pgcoord_gc as 00013 made it.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pgcoord_gc(p_older_than interval, p_batch integer DEFAULT 10000, p_dry_run boolean DEFAULT false)
RETURNS TABLE (kind text, removed bigint) LANGUAGE plpgsql AS $$
BEGIN
    -- The core checks the arguments first.
    RETURN QUERY SELECT g.kind, g.removed FROM pgcoord_gc_core(p_older_than, p_batch, p_dry_run) g;
    kind := 'ratelimit'; removed := pgcoord_gc_ratelimit(p_batch, p_dry_run); RETURN NEXT;
END
$$;
-- +goose StatementEnd
DROP FUNCTION pgcoord_gc_schedule_handlers(interval, integer, boolean);
DROP FUNCTION pgcoord_schedule_unregister(text);
DROP FUNCTION pgcoord_schedule_register(text, text[], interval);
DROP FUNCTION pgcoord_schedule_backfill(text, timestamptz[], text);
DROP FUNCTION pgcoord_schedule_trigger(text, text);
DROP FUNCTION pgcoord_schedule_start(text, text, text[], interval);
DROP FUNCTION pgcoord_schedule_begin(text, timestamptz, text, text, text[], interval, boolean);
DROP FUNCTION pgcoord_schedule_claim(text, bigint, timestamptz, bigint, timestamptz[], timestamptz, text, text[], interval);
DROP FUNCTION pgcoord_schedule_handlers_args(text[]);
DROP FUNCTION pgcoord_schedule_arm(text, bigint, timestamptz);
DROP FUNCTION pgcoord_schedule_delete(text, text);
DROP FUNCTION pgcoord_schedule_resume(text, text);
DROP FUNCTION pgcoord_schedule_pause(text, text, text);
DROP FUNCTION pgcoord_schedule_lock(text);
DROP FUNCTION pgcoord_schedule_update(text, text, text, text, jsonb, interval, text, text, interval, interval,
                                      timestamptz, timestamptz, bigint, text);
DROP FUNCTION pgcoord_schedule_create(text, text, text, text, jsonb, interval, text, text, interval, interval,
                                      timestamptz, timestamptz, text);
DROP FUNCTION pgcoord_schedule_args(text, text, text, text, jsonb, interval, text, text, interval, interval,
                                    timestamptz, timestamptz, text);
DROP FUNCTION pgcoord_schedule_changed(text, text, text, jsonb, timestamptz);
DROP FUNCTION pgcoord_schedule_live_handler(text);
DROP FUNCTION pgcoord_schedule_jitter(text, timestamptz, interval);
DROP TABLE pgcoord_schedule_handlers;
DROP TABLE pgcoord_schedules;
DELETE FROM pgcoord_jobs WHERE kind = 'cron';
DROP INDEX pgcoord_job_runs_pending;
DELETE FROM pgcoord_job_runs WHERE state IN ('pending', 'missed');
ALTER TABLE pgcoord_job_runs DROP COLUMN ticks;
ALTER TABLE pgcoord_job_runs DROP COLUMN cause;
ALTER TABLE pgcoord_job_runs DROP CONSTRAINT pgcoord_job_runs_state_check;
ALTER TABLE pgcoord_job_runs ADD CONSTRAINT pgcoord_job_runs_state_check
    CHECK (state IN ('running', 'succeeded', 'failed', 'skipped', 'replaced'));
ALTER TABLE pgcoord_jobs DROP CONSTRAINT pgcoord_jobs_overlap_check;
ALTER TABLE pgcoord_jobs ADD CONSTRAINT pgcoord_jobs_overlap_check CHECK (overlap IN ('allow', 'forbid', 'replace'));
ALTER TABLE pgcoord_jobs DROP CONSTRAINT pgcoord_jobs_kind_check;
ALTER TABLE pgcoord_jobs ALTER COLUMN every SET NOT NULL, ALTER COLUMN origin SET NOT NULL;
ALTER TABLE pgcoord_jobs DROP COLUMN kind;
