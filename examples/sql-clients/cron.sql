-- pgcoord from pg_cron: retention, and a job that runs once per tick, scheduled inside the
-- database. Run it with psql, as the role that owns pgcoord's schema, in the database named
-- by cron.database_name, with pgcoord's schema on that role's search_path (see README.md).

-- 1. Retention: what `pgcoord gc` does. pgcoord_gc deletes at most p_batch rows of each kind
-- per call; call it, one short transaction each, until every kind had fewer left.
CREATE PROCEDURE coord_gc(p_older_than interval, p_batch integer DEFAULT 10000)
LANGUAGE plpgsql AS $$
DECLARE
    v_most bigint;
BEGIN
    LOOP
        SELECT max(removed) INTO v_most FROM pgcoord_gc(p_older_than, p_batch);
        COMMIT;
        EXIT WHEN v_most < p_batch;
    END LOOP;
END
$$;

SELECT cron.schedule('pgcoord-gc', '17 * * * *', $$CALL coord_gc(interval '30 days')$$);

-- 2. A job that runs once per tick however many schedules fire: it claims the minute's tick
-- with pgcoord_job_claim, the function behind pgcoord's Go singleton package, and records the
-- run's outcome with pgcoord_job_finish. Its work here: note the outbox backlog of the minute.
CREATE TABLE minute_reports (
    scheduled_for  timestamptz NOT NULL, -- the tick
    fence_token    bigint      NOT NULL, -- the token of the run that wrote it
    holder         text        NOT NULL,
    outbox_backlog bigint      NOT NULL
);

CREATE PROCEDURE minute_report() LANGUAGE plpgsql AS $$
DECLARE
    v_run pgcoord_job_runs;
BEGIN
    SELECT * INTO v_run
      FROM pgcoord_job_claim('minute-report', interval '1 minute', NULL, 'forbid',
                             'pg_cron/' || pg_backend_pid(), interval '5 minutes');
    IF v_run.job IS NULL THEN
        RAISE NOTICE 'minute-report: this tick is claimed already';
        RETURN;
    END IF;
    COMMIT; -- the claim is durable and visible before the work starts

    INSERT INTO minute_reports (scheduled_for, fence_token, holder, outbox_backlog)
    SELECT v_run.scheduled_for, v_run.fence_token, v_run.holder, count(*)
      FROM pgcoord_outbox WHERE state = 'pending';
    PERFORM pgcoord_job_finish(v_run.job, v_run.scheduled_for, v_run.fence_token, NULL);
END
$$;

SELECT cron.schedule('minute-report', '* * * * *', 'CALL minute_report()');
