-- A RunOnce no longer moves its job to a new generation when it commits: it writes no row
-- version, where it wrote one per run. The job's row in pgcoord_singletons was updated by
-- every run (a new generation, so that a run's key, seen in pg_locks, was never used again),
-- and beside a transaction that keeps vacuum from removing old versions
-- (`pgcoord bench --soak 10m --pin-xmin --floors`) each run walked every version left by
-- the runs before it: singleton.run_once fell to 0.374 of its first minute's rate while its
-- floor, the same advisory lock without the row, held at 1.056.
--
-- Exclusion does not rest on the moving generation. A run holds its key and its job's row,
-- locked FOR UPDATE, until its transaction ends; a replica that finds the key held and the
-- row locked knows a run is under way and gives up. A key held by someone who is not a run
-- of the job (the row not locked, no live session recorded in it) is squatted — after a
-- run that rolled back, as before, or now after one that committed — and moves the job to
-- a new generation, whose key nobody can have seen, which the call tries. The row's used_at
-- is refreshed at most once a minute, for pgcoord gc's retention. A RunOnce that finds a
-- dead session's record in the row clears it and moves the job on, as before. RunSession
-- and pgcoord_singleton_release are unchanged: a session's run moves the job on when it
-- ends.

-- +goose Up
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pgcoord_singleton_try(p_job text, p_session boolean)
RETURNS TABLE (locked boolean, gen bigint, lock_key bigint) LANGUAGE plpgsql AS $$
DECLARE
    v_gen bigint;
    v_key bigint;
    v_got boolean;
    v_lock_timeout text;
    r pgcoord_singletons;
BEGIN
    IF NOT pgcoord_name_ok(p_job) THEN
        PERFORM pgcoord_refuse_name('job', p_job);
    END IF;
    IF p_session IS NULL THEN
        PERFORM pgcoord_refuse('p_session', 'true or false', NULL);
    END IF;
    IF pg_is_in_recovery() THEN
        PERFORM pgcoord_refuse_on_standby();
    END IF;
    locked := false;
    FOR v_try IN 1..3 LOOP
        SELECT s.gen INTO v_gen FROM pgcoord_singletons s WHERE s.job = p_job;
        IF NOT FOUND THEN
            -- The job's first run. A concurrent first run's row, not committed yet, makes
            -- the INSERT wait for that run's end: that run holds the job, so give up
            -- instead of waiting (lock_timeout, for this INSERT only).
            v_lock_timeout := current_setting('lock_timeout');
            PERFORM set_config('lock_timeout', '10ms', true);
            BEGIN
                INSERT INTO pgcoord_singletons (job, gen) VALUES (p_job, nextval('pgcoord_singleton_gen_seq'))
                ON CONFLICT (job) DO NOTHING;
            EXCEPTION WHEN lock_not_available THEN
                PERFORM set_config('lock_timeout', v_lock_timeout, true);
                RETURN NEXT;
                RETURN;
            END;
            PERFORM set_config('lock_timeout', v_lock_timeout, true);
            SELECT s.gen INTO v_gen FROM pgcoord_singletons s WHERE s.job = p_job;
            CONTINUE WHEN NOT FOUND; -- collected in between
        END IF;
        v_key := pgcoord_singleton_key(p_job, v_gen);
        IF v_key IS NULL THEN
            RAISE EXCEPTION 'pgcoord: pgcoord_secret holds no secret' USING ERRCODE = '55000',
                HINT = 'INSERT INTO pgcoord_secret (secret) VALUES (replace(gen_random_uuid()::text || gen_random_uuid()::text, ''-'', ''''))';
        END IF;
        IF p_session THEN
            v_got := pg_try_advisory_lock(v_key);
        ELSE
            v_got := pg_try_advisory_xact_lock(v_key);
        END IF;
        IF v_got THEN
            SELECT * INTO r FROM pgcoord_singletons s WHERE s.job = p_job AND s.gen = v_gen FOR UPDATE SKIP LOCKED;
            IF FOUND AND (r.pid IS NULL OR NOT pgcoord_singleton_held(r.pid, r.lock_key)) THEN
                IF p_session THEN
                    UPDATE pgcoord_singletons s SET pid = pg_backend_pid(), lock_key = v_key, used_at = pgcoord_now()
                     WHERE s.job = p_job;
                ELSIF r.pid IS NOT NULL THEN
                    -- A dead session's record: cleared, and the job moves on from its key.
                    UPDATE pgcoord_singletons s
                       SET gen = nextval('pgcoord_singleton_gen_seq'), pid = NULL, lock_key = NULL, used_at = pgcoord_now()
                     WHERE s.job = p_job;
                ELSIF r.used_at < pgcoord_now() - interval '1 minute' THEN
                    -- The row stays locked (FOR UPDATE above) until the run's transaction
                    -- ends, and the generation stays: a run writes no row version, but to
                    -- note, at most once a minute, that the job is in use (pgcoord gc).
                    UPDATE pgcoord_singletons s SET used_at = pgcoord_now() WHERE s.job = p_job;
                END IF;
                locked := true;
                gen := v_gen;
                lock_key := v_key;
                RETURN NEXT;
                RETURN;
            END IF;
            IF p_session THEN
                PERFORM pg_advisory_unlock(v_key);
            END IF;
            RETURN NEXT;
            RETURN;
        END IF;
        SELECT * INTO r FROM pgcoord_singletons s WHERE s.job = p_job AND s.gen = v_gen FOR UPDATE SKIP LOCKED;
        IF NOT FOUND OR (r.pid IS NOT NULL AND pgcoord_singleton_held(r.pid, r.lock_key)) THEN
            RETURN NEXT; -- a run of the job holds it
            RETURN;
        END IF;
        UPDATE pgcoord_singletons s SET gen = nextval('pgcoord_singleton_gen_seq'), pid = NULL, lock_key = NULL
         WHERE s.job = p_job;
    END LOOP;
    RETURN NEXT;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
DO $body$
BEGIN
    EXECUTE format('ALTER FUNCTION pgcoord_singleton_try(text, boolean) SET search_path = %I, pg_temp', current_schema());
END
$body$;
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pgcoord_singleton_try(p_job text, p_session boolean)
RETURNS TABLE (locked boolean, gen bigint, lock_key bigint) LANGUAGE plpgsql AS $$
DECLARE
    v_gen bigint;
    v_key bigint;
    v_got boolean;
    v_lock_timeout text;
    r pgcoord_singletons;
BEGIN
    IF NOT pgcoord_name_ok(p_job) THEN
        PERFORM pgcoord_refuse_name('job', p_job);
    END IF;
    IF p_session IS NULL THEN
        PERFORM pgcoord_refuse('p_session', 'true or false', NULL);
    END IF;
    IF pg_is_in_recovery() THEN
        PERFORM pgcoord_refuse_on_standby();
    END IF;
    locked := false;
    FOR v_try IN 1..3 LOOP
        SELECT s.gen INTO v_gen FROM pgcoord_singletons s WHERE s.job = p_job;
        IF NOT FOUND THEN
            -- The job's first run. A concurrent first run's row, not committed yet, makes
            -- the INSERT wait for that run's end: that run holds the job, so give up
            -- instead of waiting (lock_timeout, for this INSERT only).
            v_lock_timeout := current_setting('lock_timeout');
            PERFORM set_config('lock_timeout', '10ms', true);
            BEGIN
                INSERT INTO pgcoord_singletons (job, gen) VALUES (p_job, nextval('pgcoord_singleton_gen_seq'))
                ON CONFLICT (job) DO NOTHING;
            EXCEPTION WHEN lock_not_available THEN
                PERFORM set_config('lock_timeout', v_lock_timeout, true);
                RETURN NEXT;
                RETURN;
            END;
            PERFORM set_config('lock_timeout', v_lock_timeout, true);
            SELECT s.gen INTO v_gen FROM pgcoord_singletons s WHERE s.job = p_job;
            CONTINUE WHEN NOT FOUND; -- collected in between
        END IF;
        v_key := pgcoord_singleton_key(p_job, v_gen);
        IF v_key IS NULL THEN
            RAISE EXCEPTION 'pgcoord: pgcoord_secret holds no secret' USING ERRCODE = '55000',
                HINT = 'INSERT INTO pgcoord_secret (secret) VALUES (replace(gen_random_uuid()::text || gen_random_uuid()::text, ''-'', ''''))';
        END IF;
        IF p_session THEN
            v_got := pg_try_advisory_lock(v_key);
        ELSE
            v_got := pg_try_advisory_xact_lock(v_key);
        END IF;
        IF v_got THEN
            SELECT * INTO r FROM pgcoord_singletons s WHERE s.job = p_job AND s.gen = v_gen FOR UPDATE SKIP LOCKED;
            IF FOUND AND (r.pid IS NULL OR NOT pgcoord_singleton_held(r.pid, r.lock_key)) THEN
                IF p_session THEN
                    UPDATE pgcoord_singletons s SET pid = pg_backend_pid(), lock_key = v_key, used_at = pgcoord_now()
                     WHERE s.job = p_job;
                ELSE
                    UPDATE pgcoord_singletons s
                       SET gen = nextval('pgcoord_singleton_gen_seq'), pid = NULL, lock_key = NULL, used_at = pgcoord_now()
                     WHERE s.job = p_job;
                END IF;
                locked := true;
                gen := v_gen;
                lock_key := v_key;
                RETURN NEXT;
                RETURN;
            END IF;
            IF p_session THEN
                PERFORM pg_advisory_unlock(v_key);
            END IF;
            RETURN NEXT;
            RETURN;
        END IF;
        SELECT * INTO r FROM pgcoord_singletons s WHERE s.job = p_job AND s.gen = v_gen FOR UPDATE SKIP LOCKED;
        IF NOT FOUND OR (r.pid IS NOT NULL AND pgcoord_singleton_held(r.pid, r.lock_key)) THEN
            RETURN NEXT; -- a run of the job holds it
            RETURN;
        END IF;
        UPDATE pgcoord_singletons s SET gen = nextval('pgcoord_singleton_gen_seq'), pid = NULL, lock_key = NULL
         WHERE s.job = p_job;
    END LOOP;
    RETURN NEXT;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
DO $body$
BEGIN
    EXECUTE format('ALTER FUNCTION pgcoord_singleton_try(text, boolean) SET search_path = %I, pg_temp', current_schema());
END
$body$;
-- +goose StatementEnd
