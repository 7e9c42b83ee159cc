-- Retention: one function that collects what pgcoord no longer needs, so that per-entity
-- names (a lease per order, a register per resource, a semaphore key per tenant) and the
-- logs of work done (job runs, delivered messages, inbox records) do not grow without bound.
--
-- Deleting never lets a fence token repeat or a stale one through: tokens come from one
-- schema-wide counter (pgcoord_next_token), a deleted lease hands its newest grant to the
-- register of the same name and to the retired floor, and a deleted register hands its
-- token to the floor (the retire triggers of 00002_leases.sql).

-- +goose Up
-- pgcoord_gc deletes, by the database clock, at most p_batch (1 to 100,000) rows of each
-- kind below per call, and returns one row per kind with how many it deleted — or, with
-- p_dry_run, how many it would delete now, in all, deleting nothing. Call it until every
-- count is below p_batch; each call is one short transaction. p_older_than (at least one
-- second) is the retention:
--   leases       lease rows free (released, or expired and not renewed) for longer
--   fences       fence registers not written for longer
--   permits      permits expired, and waiters gone, for longer
--   semaphores   keys with no demand, permit or waiter, not set for longer, whose limit was
--                never set explicitly (pgcoord_semaphore_set_limit: configuration is kept)
--   job_runs     runs finished (or abandoned) longer ago, except each job's latest
--   dedupe       dedupe claims past their own expiry
--   idempotency  idempotency keys past their own expiry, leaving a tombstone for
--                p_older_than, and tombstones past theirs (both counted)
--   outbox       messages delivered longer ago (dead messages are kept for operators)
--   inbox        inbox records applied longer ago
-- The kinds come back in that order. Job definitions, semaphore keys set by an operator,
-- dead messages and the audit log are never collected.
-- +goose StatementBegin
CREATE FUNCTION pgcoord_gc(p_older_than interval, p_batch integer DEFAULT 10000, p_dry_run boolean DEFAULT false)
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

-- +goose Down
DROP FUNCTION pgcoord_gc(interval, integer, boolean);
