-- Per-tenant semaphores: at most K permits per key across the cluster, with fair admission
-- across keys.
--
-- A key (a tenant) has a header row holding its limit, weight and fairness accounting, and
-- one row per held permit. Every admission to a key locks the header row (FOR UPDATE), so
-- the count of live permits and the insert of a new one are atomic: the limit holds exactly
-- under any concurrency, and is never inferred from sequence values. Expired permits (dead
-- workers) are deleted by the next admission of their key, judged by the database clock.
-- Fence tokens come from pgcoord_next_token(), so pgcoord_gc may delete idle keys.
--
-- Fair admission (pgcoord_semaphore_next) is start-time fair queuing over keys: each key has
-- a virtual time that grows by 1/weight per admitted unit; the next unit goes to the key
-- with demand, under its limit, whose virtual time is smallest. A key that becomes busy
-- again starts at the system's virtual time (that of the key served last), so idling earns
-- no credit. Demand counts the units of work not yet done: an admission by
-- pgcoord_semaphore_next reserves one unit (the permit is 'reserved') and only
-- pgcoord_semaphore_done, in the transaction that removes the job from the application's
-- queue, consumes it. A reserved permit that ends any other way — released, expired because
-- its worker died, drained — gives its unit back, so no job is stranded without demand.
--
-- Admission waits, for operators (the dashboard cannot see the applications' in-process
-- metrics): every admission adds its wait to a histogram in the key's row, in the UPDATE
-- that admission makes anyway (one array element more; only the first admission of a
-- window of the key runs one more UPDATE, which rotates the windows). The wait is
-- the admission's time minus when the holder joined the line (pgcoord_semaphore_waiters.since: the first
-- refused attempt of a blocking Acquire), or 0 if it never stood in line (TryAcquire,
-- Next, an Acquire admitted at once); the database clock only. The histogram counts
-- 5-minute windows aligned with date_bin('5 minutes', t, 'epoch'): waits holds the counts of
-- the window starting at wait_window, waits_prev those of the window before it (all zero if
-- the key had no admission then). The first admission of a later window rotates them.
-- Buckets (1-based, 50 of them), logarithmic with 2 per power of two of milliseconds:
--   bucket 1:       wait < 1 ms
--   bucket k + 2:   2^(k/2) ms <= wait < 2^((k+1)/2) ms, for k = 0 .. 47
--   bucket 50:      wait >= 2^24 ms (about 4.7 hours)
-- so bucket b >= 2 holds waits of at least 2^((b-2)/2) ms. Readers (semaphore.KeyStatus)
-- report a bucket as its geometric middle, which is within about 20% of every wait in it.

-- +goose Up
CREATE TABLE pgcoord_semaphores (
    key           text        PRIMARY KEY CHECK (octet_length(key) BETWEEN 1 AND 255),
    permit_limit  integer     NOT NULL CHECK (permit_limit BETWEEN 1 AND 1000000),
    weight        integer     NOT NULL DEFAULT 1 CHECK (weight BETWEEN 1 AND 1000000),
    -- Whether an operator or the application set the limit (pgcoord_semaphore_set_limit):
    -- such a key is configuration, and pgcoord_gc keeps it.
    configured    boolean     NOT NULL DEFAULT false,
    -- The token of the key's newest permit (0 before the first).
    fence_token   bigint      NOT NULL DEFAULT 0,
    -- Fair admission: units of work not yet done (reported with
    -- pgcoord_semaphore_add_demand, consumed by pgcoord_semaphore_done) and the key's
    -- virtual time.
    demand        bigint      NOT NULL DEFAULT 0 CHECK (demand >= 0),
    vtime         double precision NOT NULL DEFAULT 0,
    -- When pgcoord_semaphore_next last served the key: the key served last carries the
    -- system's current virtual time.
    served_at     timestamptz,
    -- Counters for operators: admissions since the key was created, and refusals decided
    -- under the key's lock (rounds of waiting acquirers, and lost races). A TryAcquire
    -- refused from plain reads is not counted here (it writes nothing); count those in
    -- the client (semaphore.Metrics).
    admitted      bigint      NOT NULL DEFAULT 0,
    refused       bigint      NOT NULL DEFAULT 0,
    -- Admission waits (see the top of this file): the start of the current 5-minute
    -- window ('epoch' before the first admission: infinities do not scan into Go's
    -- time.Time) and the bucket counts of it and of the window before it, 50 buckets each.
    wait_window   timestamptz NOT NULL DEFAULT 'epoch',
    waits         integer[]   NOT NULL DEFAULT array_fill(0, ARRAY[50]),
    waits_prev    integer[]   NOT NULL DEFAULT array_fill(0, ARRAY[50]),
    created_at    timestamptz NOT NULL DEFAULT pgcoord_now(),
    updated_at    timestamptz NOT NULL DEFAULT pgcoord_now()
);

CREATE INDEX pgcoord_semaphores_by_vtime ON pgcoord_semaphores (vtime, key) WHERE demand > 0;
-- The key served last, whose virtual time a key becoming busy again starts from
-- (pgcoord_semaphore_add_demand): one index probe, whatever the number of keys.
CREATE INDEX pgcoord_semaphores_by_served_at ON pgcoord_semaphores (served_at) WHERE served_at IS NOT NULL;

COMMENT ON TABLE pgcoord_semaphores IS 'pgcoord: one row per semaphore key: limit, weight, fairness accounting';

CREATE TABLE pgcoord_semaphore_permits (
    key          text        NOT NULL REFERENCES pgcoord_semaphores (key),
    holder       text        NOT NULL CHECK (octet_length(holder) BETWEEN 1 AND 255),
    fence_token  bigint      NOT NULL,
    acquired_at  timestamptz NOT NULL,
    renewed_at   timestamptz,
    expires_at   timestamptz NOT NULL,
    -- Admitted by pgcoord_semaphore_next: the permit holds one unit of the key's demand
    -- until pgcoord_semaphore_done consumes it, or gives it back when it ends otherwise.
    reserved     boolean     NOT NULL DEFAULT false,
    PRIMARY KEY (key, holder)
);

COMMENT ON TABLE pgcoord_semaphore_permits IS 'pgcoord: held semaphore permits; expired ones are reclaimed by the next admission';

-- Waiters of a blocking acquire, served first come first served within a key. A waiter
-- refreshes wanted_until while it waits; one that stops (a dead process) is ignored.
CREATE TABLE pgcoord_semaphore_waiters (
    key          text        NOT NULL REFERENCES pgcoord_semaphores (key),
    holder       text        NOT NULL,
    since        timestamptz NOT NULL,
    wanted_until timestamptz NOT NULL,
    PRIMARY KEY (key, holder)
);

-- pgcoord_semaphore_admit is the admission of p_holder to p_key, whose header row it
-- locks (the caller may hold it already). Returns the new (or p_holder's existing) permit,
-- or no row when the key is at its limit, counting the live waiters ahead of p_holder. With
-- p_reserve (pgcoord_semaphore_next) the permit reserves one unit of the key's demand, and
-- it is refused unless the key has a unit that no live reserved permit holds.
-- +goose StatementBegin
CREATE FUNCTION pgcoord_semaphore_admit(p_key text, p_holder text, p_ttl interval, p_reserve boolean)
RETURNS SETOF pgcoord_semaphore_permits LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := pgcoord_now();
    v_sem pgcoord_semaphores;
    r pgcoord_semaphore_permits;
    v_live integer;
    v_reserved integer;
    v_own boolean;
    v_expired integer;
    v_ahead integer;
    v_since timestamptz;
    v_lapsed integer;
    v_ms double precision;
    v_bucket integer;
    v_window timestamptz := date_bin('5 minutes', v_now, timestamptz 'epoch');
    v_token bigint;
    v_window_was timestamptz;
BEGIN
    IF NOT pgcoord_ttl_ok(p_ttl) THEN
        PERFORM pgcoord_refuse('permit ttl', 'positive, at most 24 hours and without months', p_ttl::text);
    END IF;
    SELECT * INTO v_sem FROM pgcoord_semaphores WHERE key = p_key FOR UPDATE;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    -- One look at the key's permits and one at its waiters (each statement of a function
    -- costs microseconds), whose expired rows are deleted only when there are some.
    SELECT count(*) FILTER (WHERE expires_at > v_now),
           count(*) FILTER (WHERE reserved AND expires_at > v_now),
           coalesce(bool_or(holder = p_holder AND expires_at > v_now), false),
           count(*) FILTER (WHERE expires_at <= v_now)
      INTO v_live, v_reserved, v_own, v_expired
      FROM pgcoord_semaphore_permits WHERE key = p_key;
    IF v_expired > 0 THEN
        DELETE FROM pgcoord_semaphore_permits WHERE key = p_key AND expires_at <= v_now;
    END IF;
    -- The holder's place in line, and the live waiters that came before it (they keep
    -- their place).
    SELECT o.since,
           (SELECT count(*) FROM pgcoord_semaphore_waiters w
             WHERE w.key = p_key AND w.wanted_until > v_now AND w.holder <> p_holder
               AND w.since < coalesce(o.since, 'infinity')),
           (SELECT count(*) FROM pgcoord_semaphore_waiters w WHERE w.key = p_key AND w.wanted_until <= v_now)
      INTO v_since, v_ahead, v_lapsed
      FROM (SELECT (SELECT since FROM pgcoord_semaphore_waiters
                     WHERE key = p_key AND holder = p_holder AND wanted_until > v_now) AS since) o;
    IF v_lapsed > 0 THEN
        DELETE FROM pgcoord_semaphore_waiters WHERE key = p_key AND wanted_until <= v_now;
    END IF;
    IF v_own THEN
        -- Already admitted: an earlier attempt whose reply was lost.
        RETURN QUERY SELECT * FROM pgcoord_semaphore_permits WHERE key = p_key AND holder = p_holder;
        RETURN;
    END IF;
    IF p_reserve AND v_reserved >= v_sem.demand THEN
        RETURN; -- every unit of work of the key is in hand
    END IF;
    IF v_live + v_ahead >= v_sem.permit_limit THEN
        RETURN;
    END IF;
    -- The wait's histogram bucket (see the top of this file).
    v_ms := greatest(extract(epoch FROM v_now - coalesce(v_since, v_now)) * 1000, 0);
    v_bucket := CASE WHEN v_ms < 1 THEN 1 ELSE least(2 + floor(2 * ln(v_ms) / ln(2))::integer, 50) END;
    -- Within the current window (or a later one: a transaction that started earlier, whose
    -- now() is older, may commit after the first admission of the next window), one bucket
    -- goes up; the first admission of a new window adds nothing here and rotates below.
    UPDATE pgcoord_semaphores
       SET fence_token = pgcoord_next_token(), admitted = admitted + 1, updated_at = v_now,
           waits[v_bucket] = waits[v_bucket] + (wait_window >= v_window)::integer
     WHERE key = p_key
    RETURNING fence_token, wait_window INTO v_token, v_window_was;
    IF v_window_was < v_window THEN
        -- Once per key and window: the current window becomes the previous one if it is
        -- the window just before; an older one counts no more.
        UPDATE pgcoord_semaphores
           SET waits_prev = CASE WHEN wait_window = v_window - interval '5 minutes' THEN waits
                                 ELSE array_fill(0, ARRAY[50]) END,
               waits = array_fill(0, ARRAY[v_bucket - 1]) || 1 || array_fill(0, ARRAY[50 - v_bucket]),
               wait_window = v_window
         WHERE key = p_key;
    END IF;
    INSERT INTO pgcoord_semaphore_permits (key, holder, fence_token, acquired_at, expires_at, reserved)
    VALUES (p_key, p_holder, v_token, v_now, v_now + p_ttl, coalesce(p_reserve, false))
    RETURNING * INTO r;
    IF v_since IS NOT NULL THEN
        DELETE FROM pgcoord_semaphore_waiters WHERE key = p_key AND holder = p_holder;
    END IF;
    RETURN NEXT r;
END
$$;
-- +goose StatementEnd

-- pgcoord_semaphore_permit_args refuses the bad arguments of a call that names one permit:
-- a key or holder that is not 1 to 255 bytes, or a token that is not positive (NULL is
-- allowed where the function says so: any token of the holder's permit).
-- +goose StatementBegin
CREATE FUNCTION pgcoord_semaphore_permit_args(p_key text, p_holder text, p_fence_token bigint)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF NOT pgcoord_name_ok(p_key) THEN
        PERFORM pgcoord_refuse_name('semaphore key', p_key);
    END IF;
    IF NOT pgcoord_name_ok(p_holder) THEN
        PERFORM pgcoord_refuse_name('permit holder', p_holder);
    END IF;
    IF p_fence_token < 1 THEN
        PERFORM pgcoord_refuse('fence token', 'positive', p_fence_token::text);
    END IF;
END
$$;
-- +goose StatementEnd

-- pgcoord_semaphore_acquire admits p_holder to p_key for p_ttl (at most 24 hours) if fewer
-- than the key's limit of permits are live and no earlier waiter is in line, and returns
-- the permit, with a new fence token; no row if the key is full. p_limit (1 to 1,000,000)
-- is the key's limit when this call creates the key; afterwards the stored limit
-- (pgcoord_semaphore_set_limit) applies. With p_wait set (positive, at most 24 hours), a
-- refused caller is put in line (first come, first served) until now + p_wait, and a
-- release of the key notifies pgcoord_channel('semaphores') with the key. p_sync_commit
-- is as in pgcoord_lease_acquire; on a standby it raises 25006.
-- +goose StatementBegin
CREATE FUNCTION pgcoord_semaphore_acquire(
    p_key text, p_holder text, p_limit integer, p_ttl interval,
    p_wait interval DEFAULT NULL, p_sync_commit text DEFAULT NULL
) RETURNS SETOF pgcoord_semaphore_permits LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := pgcoord_now();
    v_full boolean;
    r pgcoord_semaphore_permits;
BEGIN
    IF NOT (pgcoord_name_ok(p_key) AND pgcoord_name_ok(p_holder)) THEN
        PERFORM pgcoord_semaphore_permit_args(p_key, p_holder, NULL);
    END IF;
    IF p_limit IS NULL OR p_limit NOT BETWEEN 1 AND 1000000 THEN
        PERFORM pgcoord_refuse('semaphore limit', 'between 1 and 1000000', p_limit::text);
    END IF;
    IF NOT pgcoord_ttl_ok(p_ttl) THEN
        PERFORM pgcoord_refuse('permit ttl', 'positive, at most 24 hours and without months', p_ttl::text);
    END IF;
    IF p_wait IS NOT NULL AND NOT pgcoord_ttl_ok(p_wait) THEN
        PERFORM pgcoord_refuse('permit wait', 'positive, at most 24 hours and without months, or NULL', p_wait::text);
    END IF;
    IF p_sync_commit IS NOT NULL OR pg_is_in_recovery() THEN
        PERFORM pgcoord_grant_prepare(p_sync_commit);
    END IF;
    -- A caller that will not wait is refused from plain reads when the key is plainly
    -- full: such a refusal writes nothing, locks nothing and waits for nothing.
    IF p_wait IS NULL THEN
        SELECT NOT EXISTS (SELECT FROM pgcoord_semaphore_permits WHERE key = p_key AND holder = p_holder)
               AND (SELECT count(*) FROM pgcoord_semaphore_permits WHERE key = p_key AND expires_at > v_now)
                 + (SELECT count(*) FROM pgcoord_semaphore_waiters
                     WHERE key = p_key AND wanted_until > v_now AND holder <> p_holder) >= s.permit_limit
          INTO v_full FROM pgcoord_semaphores s WHERE s.key = p_key;
        IF v_full THEN
            RETURN;
        END IF;
    END IF;
    -- The admission locks the key's row (pgcoord_gc skips a locked key). A key it does not
    -- find — new, or collected since — is created, and the admission tried again.
    FOR i IN 1..2 LOOP
        SELECT * INTO r FROM pgcoord_semaphore_admit(p_key, p_holder, p_ttl, false);
        IF FOUND THEN
            RETURN NEXT r;
            RETURN;
        END IF;
        PERFORM FROM pgcoord_semaphores WHERE key = p_key; -- locked by the admission if there
        EXIT WHEN FOUND;
        INSERT INTO pgcoord_semaphores (key, permit_limit, created_at, updated_at)
        VALUES (p_key, p_limit, v_now, v_now) ON CONFLICT (key) DO NOTHING;
    END LOOP;
    UPDATE pgcoord_semaphores SET refused = refused + 1 WHERE key = p_key;
    IF p_wait IS NOT NULL THEN
        INSERT INTO pgcoord_semaphore_waiters (key, holder, since, wanted_until)
        VALUES (p_key, p_holder, v_now, v_now + p_wait)
        ON CONFLICT (key, holder) DO UPDATE SET wanted_until = excluded.wanted_until;
    END IF;
END
$$;
-- +goose StatementEnd

-- pgcoord_semaphore_renew extends the permit of p_holder on p_key (and, if not NULL, of
-- that token) to now + p_ttl (at most 24 hours) and returns it; no row if it is no longer
-- held. Like lease renewals, it locks the row before judging expiry by pgcoord_clock(), and
-- p_durable false commits it asynchronously.
-- +goose StatementBegin
CREATE FUNCTION pgcoord_semaphore_renew(
    p_key text, p_holder text, p_ttl interval, p_fence_token bigint DEFAULT NULL,
    p_durable boolean DEFAULT true
) RETURNS SETOF pgcoord_semaphore_permits LANGUAGE plpgsql AS $$
BEGIN
    IF NOT (pgcoord_name_ok(p_key) AND pgcoord_name_ok(p_holder)) OR p_fence_token < 1 THEN
        PERFORM pgcoord_semaphore_permit_args(p_key, p_holder, p_fence_token);
    END IF;
    IF NOT pgcoord_ttl_ok(p_ttl) THEN
        PERFORM pgcoord_refuse('permit ttl', 'positive, at most 24 hours and without months', p_ttl::text);
    END IF;
    IF p_durable IS NULL THEN
        PERFORM pgcoord_refuse('p_durable', 'true or false', NULL);
    END IF;
    IF NOT p_durable THEN
        PERFORM set_config('synchronous_commit', 'off', true);
    END IF;
    PERFORM FROM pgcoord_semaphore_permits
     WHERE key = p_key AND holder = p_holder FOR NO KEY UPDATE;
    RETURN QUERY
    UPDATE pgcoord_semaphore_permits
       SET expires_at = pgcoord_clock() + p_ttl,
           renewed_at = pgcoord_clock()
     WHERE key = p_key AND holder = p_holder
       AND (p_fence_token IS NULL OR fence_token = p_fence_token)
       AND expires_at > pgcoord_clock()
    RETURNING *;
END
$$;
-- +goose StatementEnd

-- pgcoord_semaphore_release frees one permit (key + holder + token; any token when
-- p_fence_token is NULL) and returns it; no row if it was not held, in which case nothing
-- changed (releasing twice is harmless). A reserved permit gives its unit of demand back.
-- Live waiters of the key are notified.
-- +goose StatementBegin
CREATE FUNCTION pgcoord_semaphore_release(p_key text, p_holder text, p_fence_token bigint DEFAULT NULL)
RETURNS SETOF pgcoord_semaphore_permits LANGUAGE plpgsql AS $$
DECLARE
    r pgcoord_semaphore_permits;
BEGIN
    IF NOT (pgcoord_name_ok(p_key) AND pgcoord_name_ok(p_holder)) OR p_fence_token < 1 THEN
        PERFORM pgcoord_semaphore_permit_args(p_key, p_holder, p_fence_token);
    END IF;
    DELETE FROM pgcoord_semaphore_permits
     WHERE key = p_key AND holder = p_holder AND (p_fence_token IS NULL OR fence_token = p_fence_token)
    RETURNING * INTO r;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF EXISTS (SELECT FROM pgcoord_semaphore_waiters
                WHERE key = p_key AND wanted_until > pgcoord_now()) THEN
        PERFORM pg_notify(pgcoord_channel('semaphores'), p_key);
    END IF;
    RETURN NEXT r;
END
$$;
-- +goose StatementEnd

-- pgcoord_semaphore_done ends one live permit (key + holder + token, judged by
-- pgcoord_clock()) because its unit of work is done: it consumes the unit of demand the
-- permit reserved (a permit of pgcoord_semaphore_next) and frees the slot, like a release.
-- Call it last in the transaction that removes the job from the application's queue, so
-- that the job and its unit of demand go together (it locks the key's row until that
-- transaction ends). Returns the permit, or no row — nothing changed, and that
-- transaction should roll back — if the permit is no longer live: it expired (its unit
-- went back, and another worker may run the job) or was drained.
-- +goose StatementBegin
CREATE FUNCTION pgcoord_semaphore_done(p_key text, p_holder text, p_fence_token bigint)
RETURNS SETOF pgcoord_semaphore_permits LANGUAGE plpgsql AS $$
DECLARE
    r pgcoord_semaphore_permits;
BEGIN
    IF NOT (pgcoord_name_ok(p_key) AND pgcoord_name_ok(p_holder)) OR p_fence_token < 1 THEN
        PERFORM pgcoord_semaphore_permit_args(p_key, p_holder, p_fence_token);
    END IF;
    IF p_fence_token IS NULL THEN
        PERFORM pgcoord_refuse('fence token', 'positive', NULL);
    END IF;
    -- The key's row first, as admissions lock it: an admission that holds it and reclaims
    -- this permit (expired meanwhile) must not wait for us while we wait for it.
    PERFORM FROM pgcoord_semaphores WHERE key = p_key FOR NO KEY UPDATE;
    DELETE FROM pgcoord_semaphore_permits
     WHERE key = p_key AND holder = p_holder AND fence_token = p_fence_token AND expires_at > pgcoord_clock()
    RETURNING * INTO r;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF r.reserved THEN
        UPDATE pgcoord_semaphores SET demand = greatest(demand - 1, 0), updated_at = pgcoord_now()
         WHERE key = p_key;
    END IF;
    IF EXISTS (SELECT FROM pgcoord_semaphore_waiters
                WHERE key = p_key AND wanted_until > pgcoord_now()) THEN
        PERFORM pg_notify(pgcoord_channel('semaphores'), p_key);
    END IF;
    RETURN NEXT r;
END
$$;
-- +goose StatementEnd

-- pgcoord_semaphore_held tells whether the permit of p_key with token p_fence_token is live
-- by pgcoord_clock(). An application's queue uses it to give a job back when the permit of
-- the worker that took it has ended: a job row that records the token it was taken under
-- is free again once pgcoord_semaphore_held(key, token) is false.
CREATE FUNCTION pgcoord_semaphore_held(p_key text, p_fence_token bigint) RETURNS boolean
    LANGUAGE sql VOLATILE
    AS $$ SELECT EXISTS (SELECT FROM pgcoord_semaphore_permits
                          WHERE key = p_key AND fence_token = p_fence_token AND expires_at > pgcoord_clock()) $$;

-- pgcoord_semaphore_drain is the operator's revocation of every permit of p_key: the
-- holders' renewals fail from then on, their fence tokens are lower than the next
-- admission's, their reserved units of demand go back, and waiters are woken. Returns the
-- revoked permits.
-- +goose StatementBegin
CREATE FUNCTION pgcoord_semaphore_drain(p_key text)
RETURNS SETOF pgcoord_semaphore_permits LANGUAGE plpgsql AS $$
BEGIN
    IF NOT pgcoord_name_ok(p_key) THEN
        PERFORM pgcoord_refuse_name('semaphore key', p_key);
    END IF;
    RETURN QUERY DELETE FROM pgcoord_semaphore_permits WHERE key = p_key RETURNING *;
    IF FOUND THEN
        PERFORM pg_notify(pgcoord_channel('semaphores'), p_key);
    END IF;
END
$$;
-- +goose StatementEnd

-- pgcoord_semaphore_set_limit sets the limit (1 to 1,000,000) and, if p_weight is not NULL,
-- the weight (1 to 1,000,000) of p_key, creating the key if needed, and returns the header
-- row. The key is then configuration: pgcoord_gc keeps it. Raising the limit wakes waiters;
-- lowering it revokes nothing: new admissions wait until fewer permits than the new limit
-- are live.
-- +goose StatementBegin
CREATE FUNCTION pgcoord_semaphore_set_limit(p_key text, p_limit integer, p_weight integer DEFAULT NULL)
RETURNS SETOF pgcoord_semaphores LANGUAGE plpgsql AS $$
DECLARE
    r pgcoord_semaphores;
BEGIN
    IF NOT pgcoord_name_ok(p_key) THEN
        PERFORM pgcoord_refuse_name('semaphore key', p_key);
    END IF;
    IF p_limit IS NULL OR p_limit NOT BETWEEN 1 AND 1000000 THEN
        PERFORM pgcoord_refuse('semaphore limit', 'between 1 and 1000000', p_limit::text);
    END IF;
    IF p_weight NOT BETWEEN 1 AND 1000000 THEN
        PERFORM pgcoord_refuse('semaphore weight', 'between 1 and 1000000, or NULL', p_weight::text);
    END IF;
    INSERT INTO pgcoord_semaphores AS s (key, permit_limit, weight, configured)
    VALUES (p_key, p_limit, coalesce(p_weight, 1), true)
    ON CONFLICT (key) DO UPDATE
       SET permit_limit = excluded.permit_limit, weight = coalesce(p_weight, s.weight), configured = true,
           updated_at = pgcoord_now()
    RETURNING * INTO r;
    PERFORM pg_notify(pgcoord_channel('semaphores'), p_key);
    RETURN NEXT r;
END
$$;
-- +goose StatementEnd

-- pgcoord_semaphore_add_demand adds p_units (-10^12 to 10^12: may be negative; demand never goes below 0)
-- to the work not yet done for p_key, creating the key with p_limit (NULL: 1) if needed.
-- Call it in the transaction that enqueues (or cancels) the work. A key that had no demand
-- starts at the system's virtual time (that of the key served last), so idling earns no
-- credit.
-- +goose StatementBegin
CREATE FUNCTION pgcoord_semaphore_add_demand(p_key text, p_units bigint, p_limit integer DEFAULT 1)
RETURNS SETOF pgcoord_semaphores LANGUAGE plpgsql AS $$
DECLARE
    r pgcoord_semaphores;
    v_floor double precision;
BEGIN
    IF NOT pgcoord_name_ok(p_key) THEN
        PERFORM pgcoord_refuse_name('semaphore key', p_key);
    END IF;
    IF p_units IS NULL OR p_units NOT BETWEEN -1000000000000 AND 1000000000000 THEN
        PERFORM pgcoord_refuse('demand units', 'between -10^12 and 10^12', p_units::text);
    END IF;
    IF p_limit NOT BETWEEN 1 AND 1000000 THEN
        PERFORM pgcoord_refuse('semaphore limit', 'between 1 and 1000000, or NULL', p_limit::text);
    END IF;
    -- The system's virtual time: that of the key served last (keys stuck at their limit
    -- lag behind it and must not pull a returning key back to their level).
    SELECT vtime INTO v_floor FROM pgcoord_semaphores
     WHERE key <> p_key AND served_at IS NOT NULL ORDER BY served_at DESC LIMIT 1;
    INSERT INTO pgcoord_semaphores AS s (key, permit_limit, demand, vtime)
    VALUES (p_key, coalesce(p_limit, 1), greatest(p_units, 0), coalesce(v_floor, 0))
    ON CONFLICT (key) DO UPDATE
       SET demand = greatest(s.demand + p_units, 0),
           vtime = CASE WHEN s.demand = 0 THEN greatest(s.vtime, coalesce(v_floor, s.vtime)) ELSE s.vtime END,
           updated_at = pgcoord_now()
    RETURNING * INTO r;
    RETURN NEXT r;
END
$$;
-- +goose StatementEnd

-- pgcoord_semaphore_next is fair admission across keys: it admits p_holder, for p_ttl (at
-- most 24 hours), to the key that has demand no live permit of Next reserved, is under its
-- limit (with nobody in line for it), and has the smallest virtual time — restricted to
-- p_keys (at most 10,000 valid keys) when given — and returns the permit, which reserves
-- one unit of that key's demand until pgcoord_semaphore_done consumes it; no row if no key
-- can be served. Callers of one schema take turns (a transaction-level advisory lock):
-- letting a concurrent caller skip to the next key while the first is being served would
-- hand the lower-priority key the turn. p_sync_commit is as in pgcoord_lease_acquire; on a
-- standby it raises 25006.
--
-- Cost: the candidates are read in virtual-time order through pgcoord_semaphores_by_vtime
-- (or, with p_keys, through the primary key), from a cursor planned for its first rows: a
-- call reads the keys it passes over and the one it serves, not every key with demand. JIT
-- is off: the planner prices a walk over every key, and compiling that costs more than the
-- few rows a call reads.
-- +goose StatementBegin
CREATE FUNCTION pgcoord_semaphore_next(
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

-- +goose Down
DROP FUNCTION pgcoord_semaphore_next(text, interval, text[], text);
DROP FUNCTION pgcoord_semaphore_add_demand(text, bigint, integer);
DROP FUNCTION pgcoord_semaphore_set_limit(text, integer, integer);
DROP FUNCTION pgcoord_semaphore_drain(text);
DROP FUNCTION pgcoord_semaphore_held(text, bigint);
DROP FUNCTION pgcoord_semaphore_done(text, text, bigint);
DROP FUNCTION pgcoord_semaphore_release(text, text, bigint);
DROP FUNCTION pgcoord_semaphore_renew(text, text, interval, bigint, boolean);
DROP FUNCTION pgcoord_semaphore_acquire(text, text, integer, interval, interval, text);
DROP FUNCTION pgcoord_semaphore_permit_args(text, text, bigint);
DROP FUNCTION pgcoord_semaphore_admit(text, text, interval, boolean);
DROP TABLE pgcoord_semaphore_waiters;
DROP TABLE pgcoord_semaphore_permits;
DROP TABLE pgcoord_semaphores;
