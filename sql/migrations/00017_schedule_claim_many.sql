-- Claims of many schedules at once (issue 30's lateness goal).
--
-- A Scheduler that finds many schedules due at the same instant (a burst: every schedule
-- "at second 0", or 10,000 schedules spread over a minute's seconds) claimed them through
-- pgcoord_schedule_claim, one call per schedule in one statement: about 0.2-0.4 ms of
-- PL/pgSQL each (a dozen statements: checks, two reads, the schedule's update, the job's
-- token, the run's insert), so that the last of 100 claims, and with it every run of the
-- statement, started 25-40 ms after the tick. pgcoord_schedule_claim_many decides the
-- usual claim of all of them in a few statements over the set, and leaves the others to
-- pgcoord_schedule_claim, so both give the same outcomes.

-- +goose Up
-- pgcoord_schedule_claim_many makes the claims of pgcoord_schedule_claim for several
-- schedules in one call: entry i claims p_names[i] (each name at most once, at most 1000)
-- with version p_versions[i], first tick p_froms[i], p_missed[i] missed ticks, the due ticks
-- p_ticks[p_firsts[i] : p_firsts[i] + p_counts[i] - 1] and next tick p_nexts[i] (NULL:
-- none), for p_holder, p_handlers and p_ttl. It returns the rows the claims returned, in no
-- order (each names its schedule in job); outcomes and refusals are pgcoord_schedule_claim's
-- (a refused entry refuses the call: nothing is written).
--
-- The usual claim (one due tick, the schedule's next, nothing missed, the handler among
-- p_handlers, the tick within the catch-up window, no run of the schedule running unless
-- overlap is 'allow': the run starts) is made for all such entries together: their
-- schedules are locked in one statement (skipping, as the single claim does, those another
-- transaction holds, and those changed since the caller read them), judged in a second one
-- (which sees the runs committed before the locks were taken), and advanced, given a token
-- and started in a third. Every other entry is claimed by pgcoord_schedule_claim itself.
-- Bad arrays (NULL, of other lengths, a name twice) raise 22004 or 22023.
-- +goose StatementBegin
CREATE FUNCTION pgcoord_schedule_claim_many(
    p_names text[], p_versions bigint[], p_froms timestamptz[], p_missed bigint[],
    p_firsts integer[], p_counts integer[], p_ticks timestamptz[], p_nexts timestamptz[],
    p_holder text, p_handlers text[], p_ttl interval
) RETURNS SETOF pgcoord_job_runs LANGUAGE plpgsql
-- Its statements find at most 1000 rows each by primary key: a table scan is never the
-- way, even on a table not analyzed yet (and a disabled scan's cost would JIT-compile the
-- statement). Their plans do not depend on the arguments: planned once per connection,
-- not for each of its first five calls.
SET enable_seqscan = off
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    v_now timestamptz := pgcoord_now();
    v_n integer := cardinality(p_names);
    v_what text;
    v_len integer;
    v_usual text[];  -- entries of the usual shape
    v_locked text[]; -- of those, the schedules locked as the caller read them
    v_fast text[];   -- of those, the ones whose run starts now
    c record;        -- an entry claimed on its own
BEGIN
    IF p_names IS NULL OR v_n > 1000 THEN
        PERFORM pgcoord_refuse('schedule names', 'an array of at most 1000', v_n::text);
    END IF;
    IF EXISTS (SELECT FROM unnest(p_names) n GROUP BY n HAVING count(*) > 1) THEN
        PERFORM pgcoord_refuse('schedule names', 'each name at most once', p_names::text);
    END IF;
    SELECT a.what, a.len INTO v_what, v_len
      FROM (VALUES ('schedule versions', cardinality(p_versions)), ('first claimed ticks', cardinality(p_froms)),
                   ('missed ticks', cardinality(p_missed)), ('due tick slices', cardinality(p_firsts)),
                   ('due tick counts', cardinality(p_counts)), ('next ticks', cardinality(p_nexts))) a(what, len)
     WHERE a.len IS DISTINCT FROM v_n
     LIMIT 1;
    IF FOUND THEN
        PERFORM pgcoord_refuse(v_what, 'an array of one per schedule name (' || v_n || ')', v_len::text);
    END IF;
    IF p_ticks IS NULL OR cardinality(p_ticks) > 1000000 THEN
        PERFORM pgcoord_refuse('due ticks', 'an array of at most 1000 per schedule name', cardinality(p_ticks)::text);
    END IF;
    IF EXISTS (SELECT FROM unnest(p_firsts, p_counts) e(first, count)
                WHERE e.first IS NULL OR e.count IS NULL OR e.first < 1 OR e.count < 0
                   OR e.first::bigint + e.count - 1 > cardinality(p_ticks)) THEN
        PERFORM pgcoord_refuse('due tick slices', 'within the due ticks (1 to ' || cardinality(p_ticks) || ')',
                               'firsts ' || p_firsts::text || ' and counts ' || p_counts::text);
    END IF;
    IF NOT pgcoord_name_ok(p_holder) THEN
        PERFORM pgcoord_refuse_name('schedule holder', p_holder);
    END IF;
    PERFORM pgcoord_schedule_handlers_args(p_handlers);
    IF NOT pgcoord_ttl_ok(p_ttl) THEN
        PERFORM pgcoord_refuse('schedule run ttl', 'positive, at most 24 hours and without months', p_ttl::text);
    END IF;
    IF v_n = 0 THEN
        RETURN;
    END IF;
    IF pg_is_in_recovery() THEN
        PERFORM pgcoord_refuse_on_standby();
    END IF;
    -- The entries of the usual shape: one due tick, the first one, nothing missed, well formed.
    v_usual := ARRAY(
        SELECT e.name FROM unnest(p_names, p_versions, p_froms, p_missed, p_firsts, p_counts, p_nexts)
                               e(name, version, from_at, missed, first, count, next_at)
         WHERE pgcoord_name_ok(e.name) AND e.version >= 1 AND e.missed = 0 AND e.count = 1
           AND isfinite(e.from_at) AND e.from_at <= v_now AND p_ticks[e.first] = e.from_at
           AND (e.next_at IS NULL OR (isfinite(e.next_at) AND e.next_at > e.from_at)));
    -- Their schedules, still as the caller read them, locked; skipped when another
    -- transaction holds one (as pgcoord_schedule_claim skips it).
    v_locked := ARRAY(
        SELECT s.name FROM unnest(p_names, p_versions, p_froms) e(name, version, from_at)
          JOIN pgcoord_schedules s ON s.name = e.name
         WHERE e.name = ANY (v_usual)
           AND s.version = e.version AND s.next_at = e.from_at AND s.paused_at IS NULL
         ORDER BY s.name
           FOR NO KEY UPDATE OF s SKIP LOCKED);
    -- Of those, the ones whose run starts now (this statement sees the runs committed before
    -- the locks were taken): the handler is here, the tick within the catch-up window, and
    -- no run of the schedule running, or overlap 'allow'.
    v_fast := ARRAY(
        SELECT s.name FROM pgcoord_schedules s JOIN pgcoord_jobs j ON j.name = s.name
         WHERE s.name = ANY (v_locked) AND s.handler = ANY (p_handlers) AND s.next_at >= v_now - s.catch_up
           AND (j.overlap = 'allow' OR NOT EXISTS (SELECT FROM pgcoord_job_runs x
                                                    WHERE x.job = s.name AND x.state = 'running' AND x.expires_at > v_now)));
    -- Start them: advance each schedule to its next tick (none after its end), take the
    -- job's token, record the run (as pgcoord_schedule_begin does).
    IF cardinality(v_fast) > 0 THEN
        RETURN QUERY
        WITH f AS (
            SELECT s.name, e.from_at AS tick, CASE WHEN e.next_at > s.ends_at THEN NULL ELSE e.next_at END AS next_at
              FROM unnest(p_names, p_froms, p_nexts) e(name, from_at, next_at)
              JOIN pgcoord_schedules s ON s.name = e.name
             WHERE e.name = ANY (v_fast)
        ), advanced AS (
            UPDATE pgcoord_schedules x
               SET next_at = f.next_at,
                   -- (pgcoord_schedule_jitter is a function call per row, even for no jitter.)
                   due_at = f.next_at + CASE WHEN x.jitter > interval '0' THEN pgcoord_schedule_jitter(x.name, f.next_at, x.jitter)
                                             ELSE interval '0' END
              FROM f
             WHERE x.name = f.name
        ), j AS (
            UPDATE pgcoord_jobs x SET fence_token = pgcoord_next_token(), last_started_at = v_now
              FROM f
             WHERE x.name = f.name
            RETURNING x.name, x.fence_token
        )
        INSERT INTO pgcoord_job_runs AS jr (job, scheduled_for, state, fence_token, holder, started_at, expires_at, cause)
        SELECT f.name, f.tick, 'running', j.fence_token, p_holder, v_now, v_now + p_ttl, 'schedule'
          FROM f JOIN j ON j.name = f.name
        ON CONFLICT (job, scheduled_for) DO UPDATE
           SET state = 'running', fence_token = excluded.fence_token,
               attempt = jr.attempt + CASE WHEN jr.state = 'pending' THEN 0 ELSE 1 END,
               holder = excluded.holder, started_at = excluded.started_at,
               expires_at = excluded.expires_at, finished_at = NULL, error = NULL
        RETURNING jr.*;
    END IF;
    -- Every other entry claims on its own; a usual one that was not locked (changed since
    -- read, paused, or held by another transaction) would write nothing, and is left.
    FOR c IN SELECT * FROM unnest(p_names, p_versions, p_froms, p_missed, p_firsts, p_counts, p_nexts)
                           u(name, version, from_at, missed, first, count, next_at) LOOP
        CONTINUE WHEN c.name = ANY (v_usual) AND NOT (c.name = ANY (v_locked) AND NOT c.name = ANY (v_fast));
        RETURN QUERY SELECT * FROM pgcoord_schedule_claim(c.name, c.version, c.from_at, c.missed,
            p_ticks[c.first : c.first + c.count - 1], c.next_at, p_holder, p_handlers, p_ttl);
    END LOOP;
END
$$;
-- +goose StatementEnd

-- +goose Down
DROP FUNCTION pgcoord_schedule_claim_many(text[], bigint[], timestamptz[], bigint[], integer[], integer[],
                                          timestamptz[], timestamptz[], text, text[], interval);
