-- No stranger can stall pgcoord through advisory locks.
--
-- Advisory locks are database-wide and need no privilege: any login can take any key, and
-- pg_locks shows every held key to every login. pgcoord's keys were hashes of names a
-- stranger can read in these migrations ('outbox:wakeup', 'semaphore:next', 'singleton:' ||
-- job, 'outbox:' || topic || key), so a login with no grant at all could hold them and
-- stall outbox.Enqueue, semaphore.Next and singleton.RunOnce/RunSession. This migration:
--
--   * replaces the outbox's per-key order lock with a row lock on pgcoord_outbox_keys, its
--     wake-up lock with table locks on pgcoord_outbox_wakeup, and semaphore.Next's turn
--     with a row lock on pgcoord_semaphore_turn: taking any of them needs a grant on the
--     table, which a stranger lacks (LOCK TABLE ... IN ROW EXCLUSIVE MODE needs INSERT,
--     UPDATE, DELETE or TRUNCATE on it; IN EXCLUSIVE MODE needs UPDATE, DELETE or TRUNCATE;
--     SELECT ... FOR UPDATE needs SELECT and UPDATE);
--   * keeps advisory locks for singletons, but their key is a hash of a per-install secret
--     (pgcoord_secret, readable only by roles granted SELECT on it), the job and the job's
--     generation (pgcoord_singletons), which changes after every run: a key seen in
--     pg_locks is never used again, and a key held by someone who is not a run of the job
--     moves the job to a new generation;
--   * counts the headers in the outbox claim's byte cap;
--   * adds the gc kinds singletons and outbox_keys, so the new rows stay bounded.
--
-- Every function created or replaced here has its search_path pinned to the install schema,
-- then pg_temp (set at the end of each section).

-- +goose Up

-- The outbox's per-key order rows: one per (topic, key) that a writer is writing or wrote
-- and that still has a pending message (pgcoord_gc's outbox_keys deletes the others).
CREATE TABLE pgcoord_outbox_keys (
    topic text NOT NULL,
    key   text NOT NULL,
    PRIMARY KEY (topic, key)
);

COMMENT ON TABLE pgcoord_outbox_keys IS 'pgcoord: outbox keys whose writers take turns (row locks, per-key commit order)';

-- The outbox's wake-up lock: a table with no rows, only locked (see pgcoord_outbox_wake).
CREATE TABLE pgcoord_outbox_wakeup ();

COMMENT ON TABLE pgcoord_outbox_wakeup IS 'pgcoord: outbox wake-up lock (producers ROW EXCLUSIVE, an idle relay EXCLUSIVE NOWAIT); no rows';

-- semaphore.Next's turn: one row, locked FOR UPDATE by the caller whose turn it is.
CREATE TABLE pgcoord_semaphore_turn (
    id boolean PRIMARY KEY DEFAULT true CHECK (id)
);
INSERT INTO pgcoord_semaphore_turn VALUES (true);

COMMENT ON TABLE pgcoord_semaphore_turn IS 'pgcoord: one row, locked by the pgcoord_semaphore_next call whose turn it is';

-- The install's secret, mixed into every singleton key. Grant SELECT on it only to roles
-- that run pgcoord (a role that can read it can compute keys). Rotate it with
--   UPDATE pgcoord_secret SET secret = replace(gen_random_uuid()::text || gen_random_uuid()::text, '-', '')
-- at any time: runs under way keep their keys and still exclude new ones (see
-- pgcoord_singleton_try).
CREATE TABLE pgcoord_secret (
    id     boolean PRIMARY KEY DEFAULT true CHECK (id),
    secret text    NOT NULL CHECK (octet_length(secret) >= 32)
);
INSERT INTO pgcoord_secret (secret) VALUES (replace(gen_random_uuid()::text || gen_random_uuid()::text, '-', ''));

COMMENT ON TABLE pgcoord_secret IS 'pgcoord: per-install secret of the singleton advisory-lock keys; grant SELECT only to pgcoord''s roles';

-- Default privileges (ALTER DEFAULT PRIVILEGES ... GRANT SELECT ON TABLES, as
-- docs/security.md's grants give a read-only role) handed SELECT on the secret to every
-- role they name: keep it only for the roles that may also change it (pgcoord's writers),
-- for a role that can read the secret can compute the current singleton keys.
-- +goose StatementBegin
DO $body$
DECLARE
    v_role text;
BEGIN
    FOR v_role IN
        SELECT DISTINCT g.grantee FROM information_schema.role_table_grants g
         WHERE g.table_schema = current_schema() AND g.table_name = 'pgcoord_secret' AND g.privilege_type = 'SELECT'
           AND g.grantee <> 'PUBLIC'
           AND NOT has_table_privilege(g.grantee, format('%I.pgcoord_secret', current_schema()), 'UPDATE')
    LOOP
        EXECUTE format('REVOKE SELECT ON pgcoord_secret FROM %I', v_role);
    END LOOP;
    REVOKE SELECT ON pgcoord_secret FROM PUBLIC;
END
$body$;
-- +goose StatementEnd

-- Singleton generations: a job's key is pgcoord_singleton_key(job, gen), and gen changes
-- (to a new value of pgcoord_singleton_gen_seq, never used before) at the end of every run.
CREATE SEQUENCE pgcoord_singleton_gen_seq AS bigint;

CREATE TABLE pgcoord_singletons (
    job      text        PRIMARY KEY,
    gen      bigint      NOT NULL,
    -- The backend of the RunSession that holds the job, and the key it locked (NULL: no
    -- session holds it; a RunOnce under way holds the row's lock instead).
    pid      integer,
    lock_key bigint,
    used_at  timestamptz NOT NULL DEFAULT pgcoord_now()
);

COMMENT ON TABLE pgcoord_singletons IS 'pgcoord: singleton jobs'' lock generations (RunOnce, RunSession)';

-- pgcoord_singleton_key is the advisory-lock key of a job's generation: 64 bits of
-- sha256(secret:job:gen). No part of it repeats across runs, and without the secret no one
-- can compute it.
CREATE FUNCTION pgcoord_singleton_key(p_job text, p_gen bigint) RETURNS bigint
    LANGUAGE sql STABLE STRICT
    AS $$ SELECT ('x' || left(encode(sha256(convert_to(s.secret || ':' || p_job || ':' || p_gen, 'UTF8')), 'hex'), 16))::bit(64)::bigint
            FROM pgcoord_secret s $$;

-- pgcoord_singleton_held tells whether backend p_pid holds the advisory lock p_key in this
-- database (a pure read of pg_locks).
CREATE FUNCTION pgcoord_singleton_held(p_pid integer, p_key bigint) RETURNS boolean
    LANGUAGE sql STABLE STRICT
    AS $$
    SELECT EXISTS (
        SELECT FROM pg_locks l
         WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 AND l.pid = p_pid
           AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
           AND l.classid = ((p_key >> 32) & 4294967295)::oid
           AND l.objid = (p_key & 4294967295)::oid)
    $$;

-- pgcoord_singleton_try tries job p_job's advisory lock — transaction-level (RunOnce), or
-- session-level with p_session (RunSession) — without waiting, and returns whether the
-- caller got the job (locked), with the generation and key it locked. It reads the job's
-- generation g and tries key(g). The caller gets the job only if, after locking, g is still
-- the generation (re-read under the row's lock, which nothing else holds: a RunOnce under
-- way holds it until it ends) and no live session holds the job (its pid and key are in the
-- row). A RunOnce then moves the job to a new generation in its own transaction (so a
-- RunOnce that commits leaves its key behind for good; one that rolls back leaves g); a
-- RunSession records itself in the row, and pgcoord_singleton_release moves the job on.
--
-- If key(g) is held, and not by a run of the job (the row is not locked, and no live
-- session recorded in it holds its key), someone squats on a key seen in pg_locks: the
-- job moves to a new generation, whose key nobody can have seen, and the call tries that.
-- A secret rotated mid-run changes the key of g, not the outcome: the row decides.
-- On a standby it raises 25006; a bad job name raises 22023; an empty pgcoord_secret 55000.
-- +goose StatementBegin
CREATE FUNCTION pgcoord_singleton_try(p_job text, p_session boolean)
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

-- pgcoord_singleton_release ends a RunSession's hold of p_job (generation p_gen, key
-- p_key): it moves the job to a new generation if this session still holds the row, then
-- unlocks p_key, and returns whether this session held the lock (pg_advisory_unlock).
-- +goose StatementBegin
CREATE FUNCTION pgcoord_singleton_release(p_job text, p_gen bigint, p_key bigint) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE pgcoord_singletons s
       SET gen = nextval('pgcoord_singleton_gen_seq'), pid = NULL, lock_key = NULL, used_at = pgcoord_now()
     WHERE s.job = p_job AND s.gen = p_gen AND s.pid = pg_backend_pid();
    RETURN pg_advisory_unlock(p_key);
END
$$;
-- +goose StatementEnd

-- The outbox's bucket no longer derives from an advisory-lock key: the same hash of the
-- same text (so every stored bucket stays right), without pgcoord_outbox_lock_key.
CREATE OR REPLACE FUNCTION pgcoord_outbox_bucket(p_topic text, p_key text) RETURNS integer
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    AS $$ SELECT (pgcoord_lock_key('outbox:' || octet_length(p_topic)::text || ':' || p_topic || ':' || p_key) & 1023)::integer $$;

DROP FUNCTION pgcoord_outbox_lock_key(text, text);

-- A producer takes pgcoord_outbox_wakeup in ROW EXCLUSIVE mode (held until it commits)
-- before it checks for idle relays; a registering relay tries EXCLUSIVE mode without
-- waiting (pgcoord_outbox_idle). The two conflict, ROW EXCLUSIVE does not conflict with
-- itself: the protocol of 00006_outbox.sql, with table locks a stranger cannot take.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pgcoord_outbox_wake() RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting(pgcoord_outbox_wake_flag(), true) = 'on' THEN
        RETURN true;
    END IF;
    PERFORM set_config(pgcoord_outbox_wake_flag(), 'on', true);
    -- The lock first, then the check: each statement of this (volatile) function reads a
    -- new snapshot, so the check sees every registration that committed before the lock.
    LOCK TABLE pgcoord_outbox_wakeup IN ROW EXCLUSIVE MODE;
    IF EXISTS (SELECT FROM pgcoord_outbox_idle WHERE until > pgcoord_clock()) THEN
        PERFORM pg_notify(pgcoord_channel('outbox'), '');
    END IF;
    RETURN true;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pgcoord_outbox_idle(p_claimant text, p_ttl interval) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    IF NOT pgcoord_name_ok(p_claimant) THEN
        PERFORM pgcoord_refuse_name('outbox claimant', p_claimant);
    END IF;
    IF p_ttl IS NOT NULL AND NOT pgcoord_ttl_ok(p_ttl) THEN
        PERFORM pgcoord_refuse('idle ttl', 'positive, at most 24 hours and without months, or NULL', p_ttl::text);
    END IF;
    IF p_ttl IS NULL THEN
        DELETE FROM pgcoord_outbox_idle WHERE claimant = p_claimant;
        RETURN true;
    END IF;
    PERFORM set_config('synchronous_commit', 'off', true); -- losing it only delays a wake-up
    INSERT INTO pgcoord_outbox_idle (claimant, until) VALUES (p_claimant, pgcoord_clock() + p_ttl)
    ON CONFLICT (claimant) DO UPDATE SET until = excluded.until;
    BEGIN
        LOCK TABLE pgcoord_outbox_wakeup IN EXCLUSIVE MODE NOWAIT;
    EXCEPTION WHEN lock_not_available THEN
        RETURN false;
    END;
    RETURN true;
END
$$;
-- +goose StatementEnd

-- pgcoord_outbox_lock is the enqueue protocol (see 00006_outbox.sql): the wake-up check
-- first, then the row lock of (topic, key) in pgcoord_outbox_keys, created if missing,
-- held until the caller's transaction ends: writers of one key are serialized, so the
-- key's ids are in commit order. It returns true. In a REPEATABLE READ or SERIALIZABLE
-- transaction it raises 40001 (retry) when another transaction created or collected the
-- key's row after the snapshot.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pgcoord_outbox_lock(p_topic text, p_key text) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting(pgcoord_outbox_wake_flag(), true) IS DISTINCT FROM 'on' THEN
        PERFORM pgcoord_outbox_wake();
    END IF;
    PERFORM FROM pgcoord_outbox_keys k WHERE k.topic = p_topic AND k.key = p_key FOR UPDATE;
    IF NOT FOUND THEN
        -- Waits for a concurrent creator of the row to end; then the row is there (or not).
        INSERT INTO pgcoord_outbox_keys (topic, key) VALUES (p_topic, p_key) ON CONFLICT DO NOTHING;
        PERFORM FROM pgcoord_outbox_keys k WHERE k.topic = p_topic AND k.key = p_key FOR UPDATE;
    END IF;
    RETURN true;
END
$$;
-- +goose StatementEnd

-- pgcoord_outbox_claim as in 00006_outbox.sql, except that p_max_bytes counts each
-- message's headers (as JSON text) with its payload.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pgcoord_outbox_claim(
    p_claimant text, p_limit integer, p_key_limit integer, p_max_bytes bigint, p_ttl interval,
    p_topics text[] DEFAULT NULL, p_after_topic text DEFAULT '', p_after_key text DEFAULT ''
) RETURNS SETOF pgcoord_outbox LANGUAGE plpgsql
-- The batch's rows are found by primary key (see pgcoord_outbox_settle), the keys through
-- the pending index: a table scan is never the way, even on a table not analyzed yet.
-- The few relays' rows have no index to use, so their scan then costs "disabled" (1e10),
-- which without jit = off would JIT-compile that statement on every claim (60-140 ms).
SET enable_seqscan = off
SET jit = off
AS $$
DECLARE
    v_now timestamptz := pgcoord_now();
    v_token bigint;
    v_group text[];
    v_n integer;            -- live relays of the topic set
    v_i integer;            -- this relay's place among them
    v_lo integer;           -- its range of buckets: v_lo <= bucket < v_hi
    v_hi integer;
    v_from integer;         -- the bucket of the key to resume after
    v_heads bigint[] := '{}'; -- the ready heads, in walk order
    v_total bigint := 0;    -- the messages they would give
    v_idle boolean[];       -- per relay, in claimant order: nothing taken for a second
    v_seg integer;
    v_j integer;            -- the relay whose range a segment walks
    v_lb integer;           -- the segment: after (v_lb, v_lt, v_lk), before (v_ub, v_ut, v_uk)
    v_lt text;
    v_lk text;
    v_ub integer;
    v_ut text;
    v_uk text;
    v_ids bigint[];
BEGIN
    IF NOT pgcoord_name_ok(p_claimant) THEN
        PERFORM pgcoord_refuse_name('outbox claimant', p_claimant);
    END IF;
    IF p_limit IS NULL OR p_limit NOT BETWEEN 1 AND 10000 THEN
        PERFORM pgcoord_refuse('outbox claim limit', 'between 1 and 10000', p_limit::text);
    END IF;
    IF p_key_limit IS NULL OR p_key_limit NOT BETWEEN 1 AND p_limit THEN
        PERFORM pgcoord_refuse('outbox claim key limit', 'between 1 and the claim limit ' || p_limit, p_key_limit::text);
    END IF;
    IF p_max_bytes IS NULL OR p_max_bytes < 1 THEN
        PERFORM pgcoord_refuse('outbox claim byte limit', 'positive', p_max_bytes::text);
    END IF;
    IF NOT pgcoord_ttl_ok(p_ttl) THEN
        PERFORM pgcoord_refuse('outbox claim ttl', 'positive, at most 24 hours and without months', p_ttl::text);
    END IF;
    IF EXISTS (SELECT FROM unnest(p_topics) t WHERE NOT pgcoord_name_ok(t)) THEN
        PERFORM pgcoord_refuse('outbox claim topics', 'topics of 1 to 255 bytes', 'a NULL, empty or longer topic');
    END IF;
    v_token := pgcoord_next_token();

    -- The relays of the topic set, this one among them: how many, this one's place, and
    -- which have not taken anything for a second. This claim's own registration is written
    -- at the end, with what it took.
    IF p_topics IS NOT NULL THEN
        v_group := ARRAY(SELECT DISTINCT t FROM unnest(p_topics) t ORDER BY 1);
    END IF;
    SELECT count(*), count(*) FILTER (WHERE r.claimant COLLATE "C" < p_claimant COLLATE "C"),
           array_agg(r.claimed_at < v_now - interval '1 second' ORDER BY r.claimant COLLATE "C")
      INTO v_n, v_i, v_idle
      FROM (SELECT x.claimant, x.claimed_at FROM pgcoord_outbox_relays x
             WHERE x.until > v_now AND x.topics IS NOT DISTINCT FROM v_group AND x.claimant <> p_claimant
            UNION ALL
            SELECT p_claimant, v_now) r;
    v_n := greatest(v_n, 1);
    v_i := least(v_i, v_n - 1);
    v_lo := v_i * 1024 / v_n;
    v_hi := (v_i + 1) * 1024 / v_n;
    v_from := pgcoord_outbox_bucket(p_after_topic, p_after_key);
    IF coalesce(p_after_topic, '') = '' OR coalesce(p_after_key, '') = '' OR v_from NOT BETWEEN v_lo AND v_hi - 1 THEN
        v_from := v_lo;
        p_after_topic := '';
        p_after_key := '';
    END IF;

    -- The walk, in segments of (bucket, topic, key) order, each from after its first bound
    -- to before its second (no key or topic is ''): 1 and 2 the own range from the cursor
    -- round to it, then, from the next relay's on, the ranges of the relays that took nothing
    -- for a second (dead, idle, or slow to deliver: a relay that takes messages takes its
    -- own range, and taking it too would bring the collisions back). It stops once the
    -- ready keys give p_limit, and after the own range if that gave any.
    FOR v_seg IN 1..v_n + 1 LOOP
        EXIT WHEN v_total >= p_limit OR (v_seg = 3 AND v_total > 0);
        CONTINUE WHEN v_seg = 2 AND p_after_key = '';
        IF v_seg = 1 THEN
            v_lb := v_from; v_lt := p_after_topic; v_lk := p_after_key; v_ub := v_hi; v_ut := ''; v_uk := '';
        ELSIF v_seg = 2 THEN
            v_lb := v_lo; v_lt := ''; v_lk := ''; v_ub := v_from; v_ut := p_after_topic; v_uk := p_after_key;
        ELSE
            v_j := (v_i + v_seg - 2) % v_n;
            CONTINUE WHEN NOT coalesce(v_idle[v_j + 1], true);
            v_lb := v_j * 1024 / v_n; v_lt := ''; v_lk := ''; v_ub := (v_j + 1) * 1024 / v_n; v_ut := ''; v_uk := '';
        END IF;
        WITH RECURSIVE heads (bucket, topic, key, id, ready, total, step) AS (
            SELECT v_lb, v_lt, v_lk, 0::bigint, false, v_total, 0
            UNION ALL
            -- The next key's head, whether it is ready, and how many messages it would give.
            SELECT n.bucket, n.topic, n.key, n.id, x.ready,
                   h.total + CASE WHEN x.ready THEN
                       (SELECT count(*) FROM (SELECT FROM pgcoord_outbox p
                                               WHERE p.state = 'pending' AND p.bucket = n.bucket
                                                 AND p.topic = n.topic AND p.key = n.key
                                               ORDER BY p.id LIMIT p_key_limit) c)
                   ELSE 0 END,
                   h.step + 1
              FROM heads h
             CROSS JOIN LATERAL (
                SELECT o.bucket, o.topic, o.key, o.id, o.available_at, o.claim_expires_at
                  FROM pgcoord_outbox o
                 WHERE o.state = 'pending' AND (o.bucket, o.topic, o.key) > (h.bucket, h.topic, h.key)
                   AND (o.bucket, o.topic, o.key) < (v_ub, v_ut, v_uk)
                 ORDER BY o.bucket, o.topic, o.key, o.id LIMIT 1) n
             CROSS JOIN LATERAL (
                SELECT n.available_at <= v_now
                       AND (n.claim_expires_at IS NULL OR n.claim_expires_at <= v_now)
                       AND (p_topics IS NULL OR n.topic = ANY (p_topics)) AS ready) x
             WHERE h.total < p_limit
        )
        SELECT v_heads || ARRAY(SELECT h.id FROM heads h WHERE h.ready ORDER BY h.step), coalesce(max(h.total), v_total)
          INTO v_heads, v_total FROM heads h;
    END LOOP;

    WITH locked AS (
        -- Each ready head by primary key (a plan that scans the pending rows instead costs
        -- O(pending) per claim), locked unless a concurrent claim holds it.
        SELECT o.id, o.bucket, o.topic, o.key, h.step
          FROM unnest(v_heads) WITH ORDINALITY h(id, step)
         CROSS JOIN LATERAL (
            SELECT o.id, o.bucket, o.topic, o.key FROM pgcoord_outbox o
             WHERE o.id = h.id AND o.state = 'pending' AND o.available_at <= v_now
               AND (o.claim_expires_at IS NULL OR o.claim_expires_at <= v_now)
               FOR UPDATE SKIP LOCKED) o
    ),
    picked AS (
        -- In walk order: whatever LIMIT and the byte cap below cut off lies after every
        -- message claimed, so the caller's cursor skips none of it.
        SELECT m.id, m.bytes, row_number() OVER (ORDER BY l.step, m.id) AS n FROM locked l CROSS JOIN LATERAL (
            SELECT s.id, s.bytes FROM (
                SELECT o.id, octet_length(o.payload) + octet_length(o.headers::text) AS bytes,
                       bool_and(o.available_at <= v_now AND (o.claim_expires_at IS NULL OR o.claim_expires_at <= v_now))
                                OVER (ORDER BY o.id) AS ok
                  FROM pgcoord_outbox o
                 WHERE o.state = 'pending' AND o.bucket = l.bucket AND o.topic = l.topic AND o.key = l.key
                   AND o.id >= l.id
                 ORDER BY o.id LIMIT p_key_limit) s
             WHERE s.ok) m
         ORDER BY l.step, m.id
         LIMIT p_limit
    )
    -- The messages, in claim order, while their bytes so far (payload, and headers as JSON
    -- text) fit p_max_bytes (the first one always: octet_length reads the payload's stored
    -- size, not the payload).
    SELECT ARRAY(SELECT c.id FROM (SELECT p.id, p.n, sum(p.bytes) OVER (ORDER BY p.n) AS upto FROM picked p) c
                  WHERE c.n = 1 OR c.upto <= p_max_bytes ORDER BY c.n)
      INTO v_ids;

    -- Membership, until this claim expires, and when it last took messages. A relay that
    -- joins also deletes the registrations that ran out, skipping those another relay is
    -- deleting (so no claim waits for another's in a cycle).
    UPDATE pgcoord_outbox_relays r
       SET topics = v_group, until = v_now + p_ttl,
           claimed_at = CASE WHEN cardinality(v_ids) > 0 THEN v_now ELSE r.claimed_at END
     WHERE r.claimant = p_claimant;
    IF NOT FOUND THEN
        DELETE FROM pgcoord_outbox_relays r
         WHERE r.claimant = ANY (ARRAY(SELECT x.claimant FROM pgcoord_outbox_relays x
                                        WHERE x.until <= v_now FOR UPDATE SKIP LOCKED));
        INSERT INTO pgcoord_outbox_relays AS r (claimant, topics, claimed_at, until)
        VALUES (p_claimant, v_group, CASE WHEN cardinality(v_ids) > 0 THEN v_now ELSE '-infinity' END, v_now + p_ttl)
        ON CONFLICT (claimant) DO UPDATE SET topics = excluded.topics, until = excluded.until,
                                             claimed_at = greatest(r.claimed_at, excluded.claimed_at);
    END IF;

    -- The rows by primary key only, as in pgcoord_outbox_settle (which says why), returned
    -- in claim order.
    RETURN QUERY
    WITH claimed AS (
        UPDATE pgcoord_outbox o
           SET claim_token = v_token, claimed_by = p_claimant, claim_expires_at = v_now + p_ttl
         WHERE o.id = ANY (v_ids) AND o.state NOT IN ('delivered', 'dead')
        RETURNING o.*)
    SELECT c.* FROM claimed c JOIN unnest(v_ids) WITH ORDINALITY k(id, n) ON k.id = c.id ORDER BY k.n;
END
$$;
-- +goose StatementEnd

-- pgcoord_semaphore_next as in 00004_semaphores.sql, except that callers take turns by the
-- row lock of pgcoord_semaphore_turn instead of an advisory lock.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pgcoord_semaphore_next(
    p_holder text, p_ttl interval, p_keys text[] DEFAULT NULL, p_sync_commit text DEFAULT NULL
) RETURNS SETOF pgcoord_semaphore_permits LANGUAGE plpgsql SET jit = off AS $$
DECLARE
    v_now timestamptz := pgcoord_now();
    v_key text;
    r pgcoord_semaphore_permits;
    candidates refcursor;
BEGIN
    IF NOT pgcoord_name_ok(p_holder) THEN
        PERFORM pgcoord_refuse_name('permit holder', p_holder);
    END IF;
    IF NOT pgcoord_ttl_ok(p_ttl) THEN
        PERFORM pgcoord_refuse('permit ttl', 'positive, at most 24 hours and without months', p_ttl::text);
    END IF;
    IF cardinality(p_keys) > 10000 OR EXISTS (SELECT FROM unnest(p_keys) k WHERE NOT pgcoord_name_ok(k)) THEN
        PERFORM pgcoord_refuse('p_keys', 'at most 10000 keys, each of 1 to 255 bytes',
                               cardinality(p_keys) || ' keys');
    END IF;
    IF p_sync_commit IS NOT NULL OR pg_is_in_recovery() THEN
        PERFORM pgcoord_grant_prepare(p_sync_commit);
    END IF;
    -- A holder that already holds a permit (a retry after a lost reply) gets it back.
    SELECT * INTO r FROM pgcoord_semaphore_permits
     WHERE holder = p_holder AND (p_keys IS NULL OR key = ANY (p_keys)) AND expires_at > v_now;
    IF FOUND THEN
        RETURN NEXT r;
        RETURN;
    END IF;
    -- The turn: the row lock of pgcoord_semaphore_turn (taking it needs a grant on it).
    PERFORM FROM pgcoord_semaphore_turn FOR UPDATE;
    IF NOT FOUND THEN
        INSERT INTO pgcoord_semaphore_turn VALUES (true) ON CONFLICT DO NOTHING;
        PERFORM FROM pgcoord_semaphore_turn FOR UPDATE;
    END IF;
    -- Candidates in virtual-time order, one at a time: keys with a unit of demand that no
    -- live permit of Next holds (read without locking), of which a key at its limit is
    -- passed over. Two statements, so that each has a plan of its own.
    IF p_keys IS NULL THEN
        OPEN candidates FOR
            SELECT k.key FROM pgcoord_semaphores k
             WHERE k.demand > 0 AND k.demand > (SELECT count(*) FROM pgcoord_semaphore_permits p
                                                 WHERE p.key = k.key AND p.reserved AND p.expires_at > v_now)
             ORDER BY k.vtime, k.key;
    ELSE
        OPEN candidates FOR
            SELECT k.key FROM pgcoord_semaphores k
             WHERE k.key = ANY (p_keys) AND k.demand > 0
               AND k.demand > (SELECT count(*) FROM pgcoord_semaphore_permits p
                                WHERE p.key = k.key AND p.reserved AND p.expires_at > v_now)
             ORDER BY k.vtime, k.key;
    END IF;
    LOOP
        FETCH candidates INTO v_key;
        EXIT WHEN NOT FOUND;
        SELECT * INTO r FROM pgcoord_semaphore_admit(v_key, p_holder, p_ttl, true);
        IF FOUND THEN
            UPDATE pgcoord_semaphores
               SET vtime = vtime + 1.0 / weight, served_at = pgcoord_clock()
             WHERE key = v_key;
            RETURN NEXT r;
            RETURN;
        END IF;
    END LOOP;
END
$$;
-- +goose StatementEnd

-- pgcoord_gc as in 00008_gc.sql, with two kinds more, at the end:
--   singletons   generation rows of RunOnce/RunSession jobs not run for longer than
--                p_older_than and not held (a job run again starts a new generation)
--   outbox_keys  per-key order rows of outbox keys with no pending message (of any age),
--                skipping those a writer holds
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pgcoord_gc(p_older_than interval, p_batch integer DEFAULT 10000, p_dry_run boolean DEFAULT false)
RETURNS TABLE (kind text, removed bigint) LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := pgcoord_now();
    v_cutoff timestamptz;
    v_n bigint;
BEGIN
    IF p_older_than IS NULL OR p_older_than < interval '1 second' OR p_older_than > interval '36500 days' THEN
        PERFORM pgcoord_refuse('gc retention', 'between 1 second and 36500 days', p_older_than::text);
    END IF;
    IF p_batch IS NULL OR p_batch NOT BETWEEN 1 AND 100000 THEN
        PERFORM pgcoord_refuse('gc batch', 'between 1 and 100000', p_batch::text);
    END IF;
    IF p_dry_run IS NULL THEN
        PERFORM pgcoord_refuse('p_dry_run', 'true or false', NULL);
    END IF;
    v_cutoff := v_now - p_older_than;

    -- leases
    IF p_dry_run THEN
        SELECT count(*) INTO v_n FROM pgcoord_leases l
         WHERE (l.holder IS NULL AND l.released_at < v_cutoff) OR (l.holder IS NOT NULL AND l.expires_at < v_cutoff);
    ELSE
        DELETE FROM pgcoord_leases l
         WHERE l.name = ANY (ARRAY(
                SELECT c.name FROM pgcoord_leases c
                 WHERE (c.holder IS NULL AND c.released_at < v_cutoff) OR (c.holder IS NOT NULL AND c.expires_at < v_cutoff)
                 LIMIT p_batch FOR UPDATE SKIP LOCKED))
           AND ((l.holder IS NULL AND l.released_at < v_cutoff) OR (l.holder IS NOT NULL AND l.expires_at < v_cutoff));
        GET DIAGNOSTICS v_n = ROW_COUNT;
    END IF;
    kind := 'leases'; removed := v_n; RETURN NEXT;

    -- fences
    IF p_dry_run THEN
        SELECT count(*) INTO v_n FROM pgcoord_fences f WHERE f.updated_at < v_cutoff;
    ELSE
        DELETE FROM pgcoord_fences f
         WHERE f.resource = ANY (ARRAY(
                SELECT c.resource FROM pgcoord_fences c WHERE c.updated_at < v_cutoff
                 LIMIT p_batch FOR UPDATE SKIP LOCKED))
           AND f.updated_at < v_cutoff;
        GET DIAGNOSTICS v_n = ROW_COUNT;
    END IF;
    kind := 'fences'; removed := v_n; RETURN NEXT;

    -- permits (and waiters)
    IF p_dry_run THEN
        SELECT (SELECT count(*) FROM pgcoord_semaphore_permits p WHERE p.expires_at < v_cutoff)
             + (SELECT count(*) FROM pgcoord_semaphore_waiters w WHERE w.wanted_until < v_cutoff) INTO v_n;
    ELSE
        DELETE FROM pgcoord_semaphore_permits p
         WHERE (p.key, p.holder) IN (
                SELECT c.key, c.holder FROM pgcoord_semaphore_permits c WHERE c.expires_at < v_cutoff
                 LIMIT p_batch FOR UPDATE SKIP LOCKED)
           AND p.expires_at < v_cutoff;
        GET DIAGNOSTICS v_n = ROW_COUNT;
        WITH gone AS (
            DELETE FROM pgcoord_semaphore_waiters w
             WHERE (w.key, w.holder) IN (
                    SELECT c.key, c.holder FROM pgcoord_semaphore_waiters c WHERE c.wanted_until < v_cutoff
                     LIMIT p_batch FOR UPDATE SKIP LOCKED)
               AND w.wanted_until < v_cutoff
            RETURNING 1)
        SELECT v_n + count(*) INTO v_n FROM gone;
    END IF;
    kind := 'permits'; removed := v_n; RETURN NEXT;

    -- semaphores: a key is taken for deletion under its row lock, so that an admission or
    -- AddDemand that locked it first keeps it, and one that comes after finds it gone and
    -- creates it again.
    IF p_dry_run THEN
        -- (counting the keys whose permits and waiters this run collects first)
        SELECT count(*) INTO v_n FROM pgcoord_semaphores s
         WHERE NOT s.configured AND s.demand = 0 AND s.updated_at < v_cutoff
           AND NOT EXISTS (SELECT FROM pgcoord_semaphore_permits p WHERE p.key = s.key AND p.expires_at >= v_cutoff)
           AND NOT EXISTS (SELECT FROM pgcoord_semaphore_waiters w WHERE w.key = s.key AND w.wanted_until >= v_cutoff);
    ELSE
        DELETE FROM pgcoord_semaphores s
         WHERE s.key = ANY (ARRAY(
                SELECT c.key FROM pgcoord_semaphores c
                 WHERE NOT c.configured AND c.demand = 0 AND c.updated_at < v_cutoff
                   AND NOT EXISTS (SELECT FROM pgcoord_semaphore_permits p WHERE p.key = c.key)
                   AND NOT EXISTS (SELECT FROM pgcoord_semaphore_waiters w WHERE w.key = c.key)
                 LIMIT p_batch FOR UPDATE SKIP LOCKED))
           AND NOT s.configured AND s.demand = 0 AND s.updated_at < v_cutoff
           AND NOT EXISTS (SELECT FROM pgcoord_semaphore_permits p WHERE p.key = s.key)
           AND NOT EXISTS (SELECT FROM pgcoord_semaphore_waiters w WHERE w.key = s.key);
        GET DIAGNOSTICS v_n = ROW_COUNT;
    END IF;
    kind := 'semaphores'; removed := v_n; RETURN NEXT;

    -- job runs
    IF p_dry_run THEN
        SELECT count(*) INTO v_n FROM pgcoord_job_runs r
         WHERE coalesce(r.finished_at, r.expires_at) < v_cutoff
           AND r.scheduled_for < (SELECT max(x.scheduled_for) FROM pgcoord_job_runs x WHERE x.job = r.job);
    ELSE
        DELETE FROM pgcoord_job_runs r
         WHERE (r.job, r.scheduled_for) IN (
                SELECT c.job, c.scheduled_for FROM pgcoord_job_runs c
                 WHERE coalesce(c.finished_at, c.expires_at) < v_cutoff
                   AND c.scheduled_for < (SELECT max(x.scheduled_for) FROM pgcoord_job_runs x WHERE x.job = c.job)
                 LIMIT p_batch FOR UPDATE SKIP LOCKED)
           AND coalesce(r.finished_at, r.expires_at) < v_cutoff;
        GET DIAGNOSTICS v_n = ROW_COUNT;
    END IF;
    kind := 'job_runs'; removed := v_n; RETURN NEXT;

    -- dedupe
    IF p_dry_run THEN
        SELECT count(*) INTO v_n FROM pgcoord_dedupe d WHERE d.expires_at <= v_now;
    ELSE
        DELETE FROM pgcoord_dedupe d
         WHERE d.ctid = ANY (ARRAY(
                SELECT c.ctid FROM pgcoord_dedupe c WHERE c.expires_at <= v_now
                 LIMIT p_batch FOR UPDATE SKIP LOCKED))
           AND d.expires_at <= v_now;
        GET DIAGNOSTICS v_n = ROW_COUNT;
    END IF;
    kind := 'dedupe'; removed := v_n; RETURN NEXT;

    -- idempotency: keys, and the tombstones pgcoord_idempotency_gc deletes with them (it
    -- returns only the keys: the tombstones are counted, and locked, first — it picks the
    -- same number, as no other transaction holds the ones locked here).
    IF p_dry_run THEN
        SELECT (SELECT count(*) FROM pgcoord_idempotency_keys k WHERE k.expires_at <= v_now)
             + (SELECT count(*) FROM pgcoord_idempotency_tombstones t WHERE t.expires_at <= v_now) INTO v_n;
    ELSE
        SELECT count(*) INTO v_n FROM (
            SELECT FROM pgcoord_idempotency_tombstones t WHERE t.expires_at <= v_now
             LIMIT p_batch FOR UPDATE SKIP LOCKED) t;
        v_n := v_n + pgcoord_idempotency_gc(p_batch, p_older_than);
    END IF;
    kind := 'idempotency'; removed := v_n; RETURN NEXT;

    -- outbox
    IF p_dry_run THEN
        SELECT count(*) INTO v_n FROM pgcoord_outbox o WHERE o.state = 'delivered' AND o.delivered_at < v_cutoff;
    ELSE
        DELETE FROM pgcoord_outbox o
         WHERE o.id = ANY (ARRAY(
                SELECT c.id FROM pgcoord_outbox c WHERE c.state = 'delivered' AND c.delivered_at < v_cutoff
                 ORDER BY c.id LIMIT p_batch FOR UPDATE SKIP LOCKED))
           AND o.state = 'delivered' AND o.delivered_at < v_cutoff;
        GET DIAGNOSTICS v_n = ROW_COUNT;
    END IF;
    kind := 'outbox'; removed := v_n; RETURN NEXT;

    -- inbox
    IF p_dry_run THEN
        SELECT count(*) INTO v_n FROM pgcoord_outbox_inbox i WHERE i.applied_at < v_cutoff;
    ELSE
        DELETE FROM pgcoord_outbox_inbox i
         WHERE i.ctid = ANY (ARRAY(
                SELECT c.ctid FROM pgcoord_outbox_inbox c WHERE c.applied_at < v_cutoff
                 LIMIT p_batch FOR UPDATE SKIP LOCKED))
           AND i.applied_at < v_cutoff;
        GET DIAGNOSTICS v_n = ROW_COUNT;
    END IF;
    kind := 'inbox'; removed := v_n; RETURN NEXT;

    -- singletons: the generation rows of RunOnce/RunSession jobs not run for longer, that no
    -- session holds (pid NULL) and no transaction has locked. A job run again gets a new
    -- row with a new generation (from a sequence), so no key is ever used twice.
    IF p_dry_run THEN
        SELECT count(*) INTO v_n FROM pgcoord_singletons s WHERE s.pid IS NULL AND s.used_at < v_cutoff;
    ELSE
        DELETE FROM pgcoord_singletons s
         WHERE s.job = ANY (ARRAY(
                SELECT c.job FROM pgcoord_singletons c WHERE c.pid IS NULL AND c.used_at < v_cutoff
                 LIMIT p_batch FOR UPDATE SKIP LOCKED))
           AND s.pid IS NULL AND s.used_at < v_cutoff;
        GET DIAGNOSTICS v_n = ROW_COUNT;
    END IF;
    kind := 'singletons'; removed := v_n; RETURN NEXT;

    -- outbox_keys: the per-key order rows of keys with no pending message, skipping rows a
    -- writer has locked (its message is not committed yet). Last, because an enqueue of a
    -- key deleted here waits for this transaction's commit.
    IF p_dry_run THEN
        SELECT count(*) INTO v_n FROM pgcoord_outbox_keys k
         WHERE NOT EXISTS (SELECT FROM pgcoord_outbox o
                            WHERE o.state = 'pending' AND o.bucket = pgcoord_outbox_bucket(k.topic, k.key)
                              AND o.topic = k.topic AND o.key = k.key);
    ELSE
        DELETE FROM pgcoord_outbox_keys k
         WHERE (k.topic, k.key) IN (
                SELECT c.topic, c.key FROM pgcoord_outbox_keys c
                 WHERE NOT EXISTS (SELECT FROM pgcoord_outbox o
                                    WHERE o.state = 'pending' AND o.bucket = pgcoord_outbox_bucket(c.topic, c.key)
                                      AND o.topic = c.topic AND o.key = c.key)
                 LIMIT p_batch FOR UPDATE SKIP LOCKED)
           AND NOT EXISTS (SELECT FROM pgcoord_outbox o
                            WHERE o.state = 'pending' AND o.bucket = pgcoord_outbox_bucket(k.topic, k.key)
                              AND o.topic = k.topic AND o.key = k.key);
        GET DIAGNOSTICS v_n = ROW_COUNT;
    END IF;
    kind := 'outbox_keys'; removed := v_n; RETURN NEXT;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
DO $body$
DECLARE
    f text;
BEGIN
    FOREACH f IN ARRAY ARRAY[
        'pgcoord_singleton_key(text, bigint)', 'pgcoord_singleton_held(integer, bigint)',
        'pgcoord_singleton_try(text, boolean)', 'pgcoord_singleton_release(text, bigint, bigint)',
        'pgcoord_outbox_bucket(text, text)', 'pgcoord_outbox_wake()', 'pgcoord_outbox_idle(text, interval)',
        'pgcoord_outbox_lock(text, text)',
        'pgcoord_outbox_claim(text, integer, integer, bigint, interval, text[], text, text)',
        'pgcoord_semaphore_next(text, interval, text[], text)', 'pgcoord_gc(interval, integer, boolean)']
    LOOP
        EXECUTE format('ALTER FUNCTION %s SET search_path = %I, pg_temp', f, current_schema());
    END LOOP;
END
$body$;
-- +goose StatementEnd

-- +goose Down
-- The functions as 00004, 00006 and 00008 made them (no search_path of their own).
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pgcoord_gc(p_older_than interval, p_batch integer DEFAULT 10000, p_dry_run boolean DEFAULT false)
RETURNS TABLE (kind text, removed bigint) LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := pgcoord_now();
    v_cutoff timestamptz;
    v_n bigint;
BEGIN
    IF p_older_than IS NULL OR p_older_than < interval '1 second' OR p_older_than > interval '36500 days' THEN
        PERFORM pgcoord_refuse('gc retention', 'between 1 second and 36500 days', p_older_than::text);
    END IF;
    IF p_batch IS NULL OR p_batch NOT BETWEEN 1 AND 100000 THEN
        PERFORM pgcoord_refuse('gc batch', 'between 1 and 100000', p_batch::text);
    END IF;
    IF p_dry_run IS NULL THEN
        PERFORM pgcoord_refuse('p_dry_run', 'true or false', NULL);
    END IF;
    v_cutoff := v_now - p_older_than;

    -- leases
    IF p_dry_run THEN
        SELECT count(*) INTO v_n FROM pgcoord_leases l
         WHERE (l.holder IS NULL AND l.released_at < v_cutoff) OR (l.holder IS NOT NULL AND l.expires_at < v_cutoff);
    ELSE
        DELETE FROM pgcoord_leases l
         WHERE l.name = ANY (ARRAY(
                SELECT c.name FROM pgcoord_leases c
                 WHERE (c.holder IS NULL AND c.released_at < v_cutoff) OR (c.holder IS NOT NULL AND c.expires_at < v_cutoff)
                 LIMIT p_batch FOR UPDATE SKIP LOCKED))
           AND ((l.holder IS NULL AND l.released_at < v_cutoff) OR (l.holder IS NOT NULL AND l.expires_at < v_cutoff));
        GET DIAGNOSTICS v_n = ROW_COUNT;
    END IF;
    kind := 'leases'; removed := v_n; RETURN NEXT;

    -- fences
    IF p_dry_run THEN
        SELECT count(*) INTO v_n FROM pgcoord_fences f WHERE f.updated_at < v_cutoff;
    ELSE
        DELETE FROM pgcoord_fences f
         WHERE f.resource = ANY (ARRAY(
                SELECT c.resource FROM pgcoord_fences c WHERE c.updated_at < v_cutoff
                 LIMIT p_batch FOR UPDATE SKIP LOCKED))
           AND f.updated_at < v_cutoff;
        GET DIAGNOSTICS v_n = ROW_COUNT;
    END IF;
    kind := 'fences'; removed := v_n; RETURN NEXT;

    -- permits (and waiters)
    IF p_dry_run THEN
        SELECT (SELECT count(*) FROM pgcoord_semaphore_permits p WHERE p.expires_at < v_cutoff)
             + (SELECT count(*) FROM pgcoord_semaphore_waiters w WHERE w.wanted_until < v_cutoff) INTO v_n;
    ELSE
        DELETE FROM pgcoord_semaphore_permits p
         WHERE (p.key, p.holder) IN (
                SELECT c.key, c.holder FROM pgcoord_semaphore_permits c WHERE c.expires_at < v_cutoff
                 LIMIT p_batch FOR UPDATE SKIP LOCKED)
           AND p.expires_at < v_cutoff;
        GET DIAGNOSTICS v_n = ROW_COUNT;
        WITH gone AS (
            DELETE FROM pgcoord_semaphore_waiters w
             WHERE (w.key, w.holder) IN (
                    SELECT c.key, c.holder FROM pgcoord_semaphore_waiters c WHERE c.wanted_until < v_cutoff
                     LIMIT p_batch FOR UPDATE SKIP LOCKED)
               AND w.wanted_until < v_cutoff
            RETURNING 1)
        SELECT v_n + count(*) INTO v_n FROM gone;
    END IF;
    kind := 'permits'; removed := v_n; RETURN NEXT;

    -- semaphores: a key is taken for deletion under its row lock, so that an admission or
    -- AddDemand that locked it first keeps it, and one that comes after finds it gone and
    -- creates it again.
    IF p_dry_run THEN
        -- (counting the keys whose permits and waiters this run collects first)
        SELECT count(*) INTO v_n FROM pgcoord_semaphores s
         WHERE NOT s.configured AND s.demand = 0 AND s.updated_at < v_cutoff
           AND NOT EXISTS (SELECT FROM pgcoord_semaphore_permits p WHERE p.key = s.key AND p.expires_at >= v_cutoff)
           AND NOT EXISTS (SELECT FROM pgcoord_semaphore_waiters w WHERE w.key = s.key AND w.wanted_until >= v_cutoff);
    ELSE
        DELETE FROM pgcoord_semaphores s
         WHERE s.key = ANY (ARRAY(
                SELECT c.key FROM pgcoord_semaphores c
                 WHERE NOT c.configured AND c.demand = 0 AND c.updated_at < v_cutoff
                   AND NOT EXISTS (SELECT FROM pgcoord_semaphore_permits p WHERE p.key = c.key)
                   AND NOT EXISTS (SELECT FROM pgcoord_semaphore_waiters w WHERE w.key = c.key)
                 LIMIT p_batch FOR UPDATE SKIP LOCKED))
           AND NOT s.configured AND s.demand = 0 AND s.updated_at < v_cutoff
           AND NOT EXISTS (SELECT FROM pgcoord_semaphore_permits p WHERE p.key = s.key)
           AND NOT EXISTS (SELECT FROM pgcoord_semaphore_waiters w WHERE w.key = s.key);
        GET DIAGNOSTICS v_n = ROW_COUNT;
    END IF;
    kind := 'semaphores'; removed := v_n; RETURN NEXT;

    -- job runs
    IF p_dry_run THEN
        SELECT count(*) INTO v_n FROM pgcoord_job_runs r
         WHERE coalesce(r.finished_at, r.expires_at) < v_cutoff
           AND r.scheduled_for < (SELECT max(x.scheduled_for) FROM pgcoord_job_runs x WHERE x.job = r.job);
    ELSE
        DELETE FROM pgcoord_job_runs r
         WHERE (r.job, r.scheduled_for) IN (
                SELECT c.job, c.scheduled_for FROM pgcoord_job_runs c
                 WHERE coalesce(c.finished_at, c.expires_at) < v_cutoff
                   AND c.scheduled_for < (SELECT max(x.scheduled_for) FROM pgcoord_job_runs x WHERE x.job = c.job)
                 LIMIT p_batch FOR UPDATE SKIP LOCKED)
           AND coalesce(r.finished_at, r.expires_at) < v_cutoff;
        GET DIAGNOSTICS v_n = ROW_COUNT;
    END IF;
    kind := 'job_runs'; removed := v_n; RETURN NEXT;

    -- dedupe
    IF p_dry_run THEN
        SELECT count(*) INTO v_n FROM pgcoord_dedupe d WHERE d.expires_at <= v_now;
    ELSE
        DELETE FROM pgcoord_dedupe d
         WHERE d.ctid = ANY (ARRAY(
                SELECT c.ctid FROM pgcoord_dedupe c WHERE c.expires_at <= v_now
                 LIMIT p_batch FOR UPDATE SKIP LOCKED))
           AND d.expires_at <= v_now;
        GET DIAGNOSTICS v_n = ROW_COUNT;
    END IF;
    kind := 'dedupe'; removed := v_n; RETURN NEXT;

    -- idempotency: keys, and the tombstones pgcoord_idempotency_gc deletes with them (it
    -- returns only the keys: the tombstones are counted, and locked, first — it picks the
    -- same number, as no other transaction holds the ones locked here).
    IF p_dry_run THEN
        SELECT (SELECT count(*) FROM pgcoord_idempotency_keys k WHERE k.expires_at <= v_now)
             + (SELECT count(*) FROM pgcoord_idempotency_tombstones t WHERE t.expires_at <= v_now) INTO v_n;
    ELSE
        SELECT count(*) INTO v_n FROM (
            SELECT FROM pgcoord_idempotency_tombstones t WHERE t.expires_at <= v_now
             LIMIT p_batch FOR UPDATE SKIP LOCKED) t;
        v_n := v_n + pgcoord_idempotency_gc(p_batch, p_older_than);
    END IF;
    kind := 'idempotency'; removed := v_n; RETURN NEXT;

    -- outbox
    IF p_dry_run THEN
        SELECT count(*) INTO v_n FROM pgcoord_outbox o WHERE o.state = 'delivered' AND o.delivered_at < v_cutoff;
    ELSE
        DELETE FROM pgcoord_outbox o
         WHERE o.id = ANY (ARRAY(
                SELECT c.id FROM pgcoord_outbox c WHERE c.state = 'delivered' AND c.delivered_at < v_cutoff
                 ORDER BY c.id LIMIT p_batch FOR UPDATE SKIP LOCKED))
           AND o.state = 'delivered' AND o.delivered_at < v_cutoff;
        GET DIAGNOSTICS v_n = ROW_COUNT;
    END IF;
    kind := 'outbox'; removed := v_n; RETURN NEXT;

    -- inbox
    IF p_dry_run THEN
        SELECT count(*) INTO v_n FROM pgcoord_outbox_inbox i WHERE i.applied_at < v_cutoff;
    ELSE
        DELETE FROM pgcoord_outbox_inbox i
         WHERE i.ctid = ANY (ARRAY(
                SELECT c.ctid FROM pgcoord_outbox_inbox c WHERE c.applied_at < v_cutoff
                 LIMIT p_batch FOR UPDATE SKIP LOCKED))
           AND i.applied_at < v_cutoff;
        GET DIAGNOSTICS v_n = ROW_COUNT;
    END IF;
    kind := 'inbox'; removed := v_n; RETURN NEXT;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pgcoord_semaphore_next(
    p_holder text, p_ttl interval, p_keys text[] DEFAULT NULL, p_sync_commit text DEFAULT NULL
) RETURNS SETOF pgcoord_semaphore_permits LANGUAGE plpgsql SET jit = off AS $$
DECLARE
    v_now timestamptz := pgcoord_now();
    v_key text;
    r pgcoord_semaphore_permits;
    candidates refcursor;
BEGIN
    IF NOT pgcoord_name_ok(p_holder) THEN
        PERFORM pgcoord_refuse_name('permit holder', p_holder);
    END IF;
    IF NOT pgcoord_ttl_ok(p_ttl) THEN
        PERFORM pgcoord_refuse('permit ttl', 'positive, at most 24 hours and without months', p_ttl::text);
    END IF;
    IF cardinality(p_keys) > 10000 OR EXISTS (SELECT FROM unnest(p_keys) k WHERE NOT pgcoord_name_ok(k)) THEN
        PERFORM pgcoord_refuse('p_keys', 'at most 10000 keys, each of 1 to 255 bytes',
                               cardinality(p_keys) || ' keys');
    END IF;
    IF p_sync_commit IS NOT NULL OR pg_is_in_recovery() THEN
        PERFORM pgcoord_grant_prepare(p_sync_commit);
    END IF;
    -- A holder that already holds a permit (a retry after a lost reply) gets it back.
    SELECT * INTO r FROM pgcoord_semaphore_permits
     WHERE holder = p_holder AND (p_keys IS NULL OR key = ANY (p_keys)) AND expires_at > v_now;
    IF FOUND THEN
        RETURN NEXT r;
        RETURN;
    END IF;
    PERFORM pg_advisory_xact_lock(pgcoord_lock_key('semaphore:next'));
    -- Candidates in virtual-time order, one at a time: keys with a unit of demand that no
    -- live permit of Next holds (read without locking), of which a key at its limit is
    -- passed over. Two statements, so that each has a plan of its own.
    IF p_keys IS NULL THEN
        OPEN candidates FOR
            SELECT k.key FROM pgcoord_semaphores k
             WHERE k.demand > 0 AND k.demand > (SELECT count(*) FROM pgcoord_semaphore_permits p
                                                 WHERE p.key = k.key AND p.reserved AND p.expires_at > v_now)
             ORDER BY k.vtime, k.key;
    ELSE
        OPEN candidates FOR
            SELECT k.key FROM pgcoord_semaphores k
             WHERE k.key = ANY (p_keys) AND k.demand > 0
               AND k.demand > (SELECT count(*) FROM pgcoord_semaphore_permits p
                                WHERE p.key = k.key AND p.reserved AND p.expires_at > v_now)
             ORDER BY k.vtime, k.key;
    END IF;
    LOOP
        FETCH candidates INTO v_key;
        EXIT WHEN NOT FOUND;
        SELECT * INTO r FROM pgcoord_semaphore_admit(v_key, p_holder, p_ttl, true);
        IF FOUND THEN
            UPDATE pgcoord_semaphores
               SET vtime = vtime + 1.0 / weight, served_at = pgcoord_clock()
             WHERE key = v_key;
            RETURN NEXT r;
            RETURN;
        END IF;
    END LOOP;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pgcoord_outbox_claim(
    p_claimant text, p_limit integer, p_key_limit integer, p_max_bytes bigint, p_ttl interval,
    p_topics text[] DEFAULT NULL, p_after_topic text DEFAULT '', p_after_key text DEFAULT ''
) RETURNS SETOF pgcoord_outbox LANGUAGE plpgsql
-- The batch's rows are found by primary key (see pgcoord_outbox_settle), the keys through
-- the pending index: a table scan is never the way, even on a table not analyzed yet.
-- The few relays' rows have no index to use, so their scan then costs "disabled" (1e10),
-- which without jit = off would JIT-compile that statement on every claim (60-140 ms).
SET enable_seqscan = off
SET jit = off
AS $$
DECLARE
    v_now timestamptz := pgcoord_now();
    v_token bigint;
    v_group text[];
    v_n integer;            -- live relays of the topic set
    v_i integer;            -- this relay's place among them
    v_lo integer;           -- its range of buckets: v_lo <= bucket < v_hi
    v_hi integer;
    v_from integer;         -- the bucket of the key to resume after
    v_heads bigint[] := '{}'; -- the ready heads, in walk order
    v_total bigint := 0;    -- the messages they would give
    v_idle boolean[];       -- per relay, in claimant order: nothing taken for a second
    v_seg integer;
    v_j integer;            -- the relay whose range a segment walks
    v_lb integer;           -- the segment: after (v_lb, v_lt, v_lk), before (v_ub, v_ut, v_uk)
    v_lt text;
    v_lk text;
    v_ub integer;
    v_ut text;
    v_uk text;
    v_ids bigint[];
BEGIN
    IF NOT pgcoord_name_ok(p_claimant) THEN
        PERFORM pgcoord_refuse_name('outbox claimant', p_claimant);
    END IF;
    IF p_limit IS NULL OR p_limit NOT BETWEEN 1 AND 10000 THEN
        PERFORM pgcoord_refuse('outbox claim limit', 'between 1 and 10000', p_limit::text);
    END IF;
    IF p_key_limit IS NULL OR p_key_limit NOT BETWEEN 1 AND p_limit THEN
        PERFORM pgcoord_refuse('outbox claim key limit', 'between 1 and the claim limit ' || p_limit, p_key_limit::text);
    END IF;
    IF p_max_bytes IS NULL OR p_max_bytes < 1 THEN
        PERFORM pgcoord_refuse('outbox claim byte limit', 'positive', p_max_bytes::text);
    END IF;
    IF NOT pgcoord_ttl_ok(p_ttl) THEN
        PERFORM pgcoord_refuse('outbox claim ttl', 'positive, at most 24 hours and without months', p_ttl::text);
    END IF;
    IF EXISTS (SELECT FROM unnest(p_topics) t WHERE NOT pgcoord_name_ok(t)) THEN
        PERFORM pgcoord_refuse('outbox claim topics', 'topics of 1 to 255 bytes', 'a NULL, empty or longer topic');
    END IF;
    v_token := pgcoord_next_token();

    -- The relays of the topic set, this one among them: how many, this one's place, and
    -- which have not taken anything for a second. This claim's own registration is written
    -- at the end, with what it took.
    IF p_topics IS NOT NULL THEN
        v_group := ARRAY(SELECT DISTINCT t FROM unnest(p_topics) t ORDER BY 1);
    END IF;
    SELECT count(*), count(*) FILTER (WHERE r.claimant COLLATE "C" < p_claimant COLLATE "C"),
           array_agg(r.claimed_at < v_now - interval '1 second' ORDER BY r.claimant COLLATE "C")
      INTO v_n, v_i, v_idle
      FROM (SELECT x.claimant, x.claimed_at FROM pgcoord_outbox_relays x
             WHERE x.until > v_now AND x.topics IS NOT DISTINCT FROM v_group AND x.claimant <> p_claimant
            UNION ALL
            SELECT p_claimant, v_now) r;
    v_n := greatest(v_n, 1);
    v_i := least(v_i, v_n - 1);
    v_lo := v_i * 1024 / v_n;
    v_hi := (v_i + 1) * 1024 / v_n;
    v_from := pgcoord_outbox_bucket(p_after_topic, p_after_key);
    IF coalesce(p_after_topic, '') = '' OR coalesce(p_after_key, '') = '' OR v_from NOT BETWEEN v_lo AND v_hi - 1 THEN
        v_from := v_lo;
        p_after_topic := '';
        p_after_key := '';
    END IF;

    -- The walk, in segments of (bucket, topic, key) order, each from after its first bound
    -- to before its second (no key or topic is ''): 1 and 2 the own range from the cursor
    -- round to it, then, from the next relay's on, the ranges of the relays that took nothing
    -- for a second (dead, idle, or slow to deliver: a relay that takes messages takes its
    -- own range, and taking it too would bring the collisions back). It stops once the
    -- ready keys give p_limit, and after the own range if that gave any.
    FOR v_seg IN 1..v_n + 1 LOOP
        EXIT WHEN v_total >= p_limit OR (v_seg = 3 AND v_total > 0);
        CONTINUE WHEN v_seg = 2 AND p_after_key = '';
        IF v_seg = 1 THEN
            v_lb := v_from; v_lt := p_after_topic; v_lk := p_after_key; v_ub := v_hi; v_ut := ''; v_uk := '';
        ELSIF v_seg = 2 THEN
            v_lb := v_lo; v_lt := ''; v_lk := ''; v_ub := v_from; v_ut := p_after_topic; v_uk := p_after_key;
        ELSE
            v_j := (v_i + v_seg - 2) % v_n;
            CONTINUE WHEN NOT coalesce(v_idle[v_j + 1], true);
            v_lb := v_j * 1024 / v_n; v_lt := ''; v_lk := ''; v_ub := (v_j + 1) * 1024 / v_n; v_ut := ''; v_uk := '';
        END IF;
        WITH RECURSIVE heads (bucket, topic, key, id, ready, total, step) AS (
            SELECT v_lb, v_lt, v_lk, 0::bigint, false, v_total, 0
            UNION ALL
            -- The next key's head, whether it is ready, and how many messages it would give.
            SELECT n.bucket, n.topic, n.key, n.id, x.ready,
                   h.total + CASE WHEN x.ready THEN
                       (SELECT count(*) FROM (SELECT FROM pgcoord_outbox p
                                               WHERE p.state = 'pending' AND p.bucket = n.bucket
                                                 AND p.topic = n.topic AND p.key = n.key
                                               ORDER BY p.id LIMIT p_key_limit) c)
                   ELSE 0 END,
                   h.step + 1
              FROM heads h
             CROSS JOIN LATERAL (
                SELECT o.bucket, o.topic, o.key, o.id, o.available_at, o.claim_expires_at
                  FROM pgcoord_outbox o
                 WHERE o.state = 'pending' AND (o.bucket, o.topic, o.key) > (h.bucket, h.topic, h.key)
                   AND (o.bucket, o.topic, o.key) < (v_ub, v_ut, v_uk)
                 ORDER BY o.bucket, o.topic, o.key, o.id LIMIT 1) n
             CROSS JOIN LATERAL (
                SELECT n.available_at <= v_now
                       AND (n.claim_expires_at IS NULL OR n.claim_expires_at <= v_now)
                       AND (p_topics IS NULL OR n.topic = ANY (p_topics)) AS ready) x
             WHERE h.total < p_limit
        )
        SELECT v_heads || ARRAY(SELECT h.id FROM heads h WHERE h.ready ORDER BY h.step), coalesce(max(h.total), v_total)
          INTO v_heads, v_total FROM heads h;
    END LOOP;

    WITH locked AS (
        -- Each ready head by primary key (a plan that scans the pending rows instead costs
        -- O(pending) per claim), locked unless a concurrent claim holds it.
        SELECT o.id, o.bucket, o.topic, o.key, h.step
          FROM unnest(v_heads) WITH ORDINALITY h(id, step)
         CROSS JOIN LATERAL (
            SELECT o.id, o.bucket, o.topic, o.key FROM pgcoord_outbox o
             WHERE o.id = h.id AND o.state = 'pending' AND o.available_at <= v_now
               AND (o.claim_expires_at IS NULL OR o.claim_expires_at <= v_now)
               FOR UPDATE SKIP LOCKED) o
    ),
    picked AS (
        -- In walk order: whatever LIMIT and the byte cap below cut off lies after every
        -- message claimed, so the caller's cursor skips none of it.
        SELECT m.id, m.bytes, row_number() OVER (ORDER BY l.step, m.id) AS n FROM locked l CROSS JOIN LATERAL (
            SELECT s.id, s.bytes FROM (
                SELECT o.id, octet_length(o.payload) AS bytes,
                       bool_and(o.available_at <= v_now AND (o.claim_expires_at IS NULL OR o.claim_expires_at <= v_now))
                                OVER (ORDER BY o.id) AS ok
                  FROM pgcoord_outbox o
                 WHERE o.state = 'pending' AND o.bucket = l.bucket AND o.topic = l.topic AND o.key = l.key
                   AND o.id >= l.id
                 ORDER BY o.id LIMIT p_key_limit) s
             WHERE s.ok) m
         ORDER BY l.step, m.id
         LIMIT p_limit
    )
    -- The messages, in claim order, while the payloads so far fit p_max_bytes (the first
    -- one always: octet_length reads the stored size, not the payload).
    SELECT ARRAY(SELECT c.id FROM (SELECT p.id, p.n, sum(p.bytes) OVER (ORDER BY p.n) AS upto FROM picked p) c
                  WHERE c.n = 1 OR c.upto <= p_max_bytes ORDER BY c.n)
      INTO v_ids;

    -- Membership, until this claim expires, and when it last took messages. A relay that
    -- joins also deletes the registrations that ran out, skipping those another relay is
    -- deleting (so no claim waits for another's in a cycle).
    UPDATE pgcoord_outbox_relays r
       SET topics = v_group, until = v_now + p_ttl,
           claimed_at = CASE WHEN cardinality(v_ids) > 0 THEN v_now ELSE r.claimed_at END
     WHERE r.claimant = p_claimant;
    IF NOT FOUND THEN
        DELETE FROM pgcoord_outbox_relays r
         WHERE r.claimant = ANY (ARRAY(SELECT x.claimant FROM pgcoord_outbox_relays x
                                        WHERE x.until <= v_now FOR UPDATE SKIP LOCKED));
        INSERT INTO pgcoord_outbox_relays AS r (claimant, topics, claimed_at, until)
        VALUES (p_claimant, v_group, CASE WHEN cardinality(v_ids) > 0 THEN v_now ELSE '-infinity' END, v_now + p_ttl)
        ON CONFLICT (claimant) DO UPDATE SET topics = excluded.topics, until = excluded.until,
                                             claimed_at = greatest(r.claimed_at, excluded.claimed_at);
    END IF;

    -- The rows by primary key only, as in pgcoord_outbox_settle (which says why), returned
    -- in claim order.
    RETURN QUERY
    WITH claimed AS (
        UPDATE pgcoord_outbox o
           SET claim_token = v_token, claimed_by = p_claimant, claim_expires_at = v_now + p_ttl
         WHERE o.id = ANY (v_ids) AND o.state NOT IN ('delivered', 'dead')
        RETURNING o.*)
    SELECT c.* FROM claimed c JOIN unnest(v_ids) WITH ORDINALITY k(id, n) ON k.id = c.id ORDER BY k.n;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pgcoord_outbox_wake() RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting(pgcoord_outbox_wake_flag(), true) = 'on' THEN
        RETURN true;
    END IF;
    PERFORM set_config(pgcoord_outbox_wake_flag(), 'on', true);
    -- The lock first, then the check: each statement of this (volatile) function reads a
    -- new snapshot, so the check sees every registration that committed before the lock.
    PERFORM pg_advisory_xact_lock_shared(pgcoord_lock_key('outbox:wakeup'));
    IF EXISTS (SELECT FROM pgcoord_outbox_idle WHERE until > pgcoord_clock()) THEN
        PERFORM pg_notify(pgcoord_channel('outbox'), '');
    END IF;
    RETURN true;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pgcoord_outbox_idle(p_claimant text, p_ttl interval) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    IF NOT pgcoord_name_ok(p_claimant) THEN
        PERFORM pgcoord_refuse_name('outbox claimant', p_claimant);
    END IF;
    IF p_ttl IS NOT NULL AND NOT pgcoord_ttl_ok(p_ttl) THEN
        PERFORM pgcoord_refuse('idle ttl', 'positive, at most 24 hours and without months, or NULL', p_ttl::text);
    END IF;
    IF p_ttl IS NULL THEN
        DELETE FROM pgcoord_outbox_idle WHERE claimant = p_claimant;
        RETURN true;
    END IF;
    PERFORM set_config('synchronous_commit', 'off', true); -- losing it only delays a wake-up
    INSERT INTO pgcoord_outbox_idle (claimant, until) VALUES (p_claimant, pgcoord_clock() + p_ttl)
    ON CONFLICT (claimant) DO UPDATE SET until = excluded.until;
    RETURN pg_try_advisory_xact_lock(pgcoord_lock_key('outbox:wakeup'));
END
$$;
-- +goose StatementEnd

CREATE FUNCTION pgcoord_outbox_lock_key(p_topic text, p_key text) RETURNS bigint
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    AS $$ SELECT pgcoord_lock_key('outbox:' || octet_length(p_topic)::text || ':' || p_topic || ':' || p_key) $$;

CREATE OR REPLACE FUNCTION pgcoord_outbox_bucket(p_topic text, p_key text) RETURNS integer
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    AS $$ SELECT (pgcoord_outbox_lock_key(p_topic, p_key) & 1023)::integer $$;
ALTER FUNCTION pgcoord_outbox_bucket(text, text) RESET ALL;

-- pgcoord_outbox_lock was LANGUAGE sql (inlined): drop and create it again.
DROP FUNCTION pgcoord_outbox_lock(text, text);
CREATE FUNCTION pgcoord_outbox_lock(p_topic text, p_key text) RETURNS boolean
    LANGUAGE sql
    AS $$ SELECT CASE WHEN current_setting(pgcoord_outbox_wake_flag(), true) = 'on' OR pgcoord_outbox_wake()
                      THEN pg_advisory_xact_lock(pgcoord_outbox_lock_key(p_topic, p_key)) IS NOT NULL END $$;

DROP FUNCTION pgcoord_singleton_release(text, bigint, bigint);
DROP FUNCTION pgcoord_singleton_try(text, boolean);
DROP FUNCTION pgcoord_singleton_held(integer, bigint);
DROP FUNCTION pgcoord_singleton_key(text, bigint);
DROP TABLE pgcoord_singletons;
DROP SEQUENCE pgcoord_singleton_gen_seq;
DROP TABLE pgcoord_secret;
DROP TABLE pgcoord_semaphore_turn;
DROP TABLE pgcoord_outbox_wakeup;
DROP TABLE pgcoord_outbox_keys;
