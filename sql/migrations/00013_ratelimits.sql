-- Rate limits: the generic cell rate algorithm (GCRA) per (policy, key), on the database
-- clock, with policies as rows.
--
-- A policy admits `rate` units per `period`, with bursts of up to `burst` units. Its
-- emission interval T is period / rate, rounded up to a whole microsecond (so a policy
-- never admits more than it says), and its tolerance is burst × T. A key's state is one
-- row holding its theoretical arrival time (tat): a call of cost c at instant now is
-- admitted when max(tat, now) + c × T - now <= burst × T, and then moves tat there. So in
-- any stretch of time W a key admits at most W / T + burst units, and a key whose tat is in
-- the past is at rest: it carries no state, and pgcoord_gc deletes its row (kind ratelimit).
--
-- One call checks a list of (policy, key) pairs — per key, per tenant, global — and is
-- all-or-nothing: the pairs' rows are locked in one order (policy, key), every enforcing
-- policy is judged, and only if all admit is any row charged, in the same statement. A
-- shadow policy is judged and charged like an enforcing one while it would admit, and
-- counts the calls it would refuse (shadow_refused) without refusing them: it tells what a
-- new limit would do before it is enforced. A policy changed at runtime applies from the
-- next call; keys keep their tat.

-- +goose Up
-- pgcoord_ratelimit_period_ok tells whether p_period is a valid policy period: positive, at
-- most 366 days, without months or years (which have no fixed length).
CREATE FUNCTION pgcoord_ratelimit_period_ok(p_period interval) RETURNS boolean
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ SELECT p_period IS NOT NULL AND p_period > interval '0' AND p_period <= interval '366 days'
                 AND date_part('month', p_period) = 0 AND date_part('year', p_period) = 0 $$;

CREATE TABLE pgcoord_ratelimit_policies (
    name           text        PRIMARY KEY CHECK (pgcoord_name_ok(name)),
    rate           bigint      NOT NULL CHECK (rate BETWEEN 1 AND 1000000000),
    period         interval    NOT NULL CHECK (pgcoord_ratelimit_period_ok(period)),
    burst          bigint      NOT NULL CHECK (burst BETWEEN 1 AND 1000000000),
    shadow         boolean     NOT NULL DEFAULT false,
    -- unlogged keeps the policy's keys in pgcoord_ratelimit_state_unlogged (see there); it is
    -- set when the policy is created and cannot change.
    unlogged       boolean     NOT NULL DEFAULT false,
    -- interval_us is T, the emission interval in microseconds: ceil(period / rate).
    interval_us    bigint      NOT NULL CHECK (interval_us >= 1),
    -- shadow_refused counts the calls this policy would have refused while in shadow mode.
    shadow_refused bigint      NOT NULL DEFAULT 0,
    created_at     timestamptz NOT NULL DEFAULT pgcoord_now(),
    updated_at     timestamptz NOT NULL DEFAULT pgcoord_now()
);

COMMENT ON TABLE pgcoord_ratelimit_policies IS 'pgcoord: rate limit policies (GCRA: rate per period, burst)';

-- A key's row exists only while its tat is ahead of the clock (and until gc runs). No index
-- on tat: a charge changes only tat, so it is a HOT update that touches no index; gc finds
-- rows at rest by a scan that stops at its batch.
CREATE TABLE pgcoord_ratelimit_state (
    policy         text        NOT NULL,
    key            text        NOT NULL,
    tat            timestamptz NOT NULL,
    -- shadow_refused counts the calls a shadow policy would have refused on this key: kept on
    -- the key's row, which the call holds anyway, so that counting never makes the keys of a
    -- policy wait for one another. gc adds it to the policy's count before it deletes the row.
    shadow_refused bigint      NOT NULL DEFAULT 0,
    PRIMARY KEY (policy, key)
) WITH (fillfactor = 70);

-- The keys that counted shadow refusals, for the policy's sum (few: a shadow policy's).
CREATE INDEX pgcoord_ratelimit_state_shadow ON pgcoord_ratelimit_state (policy) WHERE shadow_refused > 0;

-- The keys of unlogged policies: the same rows in an UNLOGGED table. Its writes skip the
-- WAL, so a transaction that charges only such keys commits without waiting for a WAL
-- flush; and PostgreSQL empties the table after a crash, and a standby has none of it, so a
-- crash or a failover puts every key of those policies at rest (a full burst again).
CREATE UNLOGGED TABLE pgcoord_ratelimit_state_unlogged (
    policy         text        NOT NULL,
    key            text        NOT NULL,
    tat            timestamptz NOT NULL,
    shadow_refused bigint      NOT NULL DEFAULT 0,
    PRIMARY KEY (policy, key)
) WITH (fillfactor = 70);

CREATE INDEX pgcoord_ratelimit_state_unlogged_shadow ON pgcoord_ratelimit_state_unlogged (policy) WHERE shadow_refused > 0;

COMMENT ON TABLE pgcoord_ratelimit_state_unlogged IS 'pgcoord: rate limit keys of unlogged policies ahead of the clock (lost at a crash or failover)';

-- pgcoord_ratelimit_unlogged_tat is a key's arrival time in the unlogged table; NULL on a
-- standby, which has none of that table (and cannot even plan a query that names it).
-- +goose StatementBegin
CREATE FUNCTION pgcoord_ratelimit_unlogged_tat(p_policy text, p_key text) RETURNS timestamptz
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF pg_is_in_recovery() THEN
        RETURN NULL;
    END IF;
    RETURN (SELECT s.tat FROM pgcoord_ratelimit_state_unlogged s WHERE s.policy = p_policy AND s.key = p_key);
END
$$;
-- +goose StatementEnd

-- pgcoord_ratelimit_shadow_refused is a policy's count of the calls it would have refused
-- since shadow mode was turned on: its own (from collected keys) and its keys'.
-- (On a standby, without the unlogged keys' counts: it has none of that table.)
-- +goose StatementBegin
CREATE FUNCTION pgcoord_ratelimit_shadow_refused(p_policy text) RETURNS bigint LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_n bigint := (SELECT p.shadow_refused FROM pgcoord_ratelimit_policies p WHERE p.name = p_policy)
                  + coalesce((SELECT sum(s.shadow_refused) FROM pgcoord_ratelimit_state s
                               WHERE s.policy = p_policy AND s.shadow_refused > 0), 0)::bigint;
BEGIN
    IF NOT pg_is_in_recovery() THEN
        v_n := v_n + coalesce((SELECT sum(s.shadow_refused) FROM pgcoord_ratelimit_state_unlogged s
                                WHERE s.policy = p_policy AND s.shadow_refused > 0), 0)::bigint;
    END IF;
    RETURN v_n;
END
$$;
-- +goose StatementEnd

COMMENT ON TABLE pgcoord_ratelimit_state IS 'pgcoord: rate limit keys ahead of the clock (theoretical arrival time)';

-- pgcoord_ratelimit_set creates or changes a policy; the change applies from the next call.
-- +goose StatementBegin
CREATE FUNCTION pgcoord_ratelimit_set(p_name text, p_rate bigint, p_period interval, p_burst bigint,
                                      p_shadow boolean DEFAULT false, p_unlogged boolean DEFAULT false)
RETURNS SETOF pgcoord_ratelimit_policies LANGUAGE plpgsql AS $$
DECLARE
    v_us numeric;
    v_restart boolean;
BEGIN
    IF NOT pgcoord_name_ok(p_name) THEN
        PERFORM pgcoord_refuse_name('rate limit policy name', p_name);
    END IF;
    IF p_rate IS NULL OR p_rate NOT BETWEEN 1 AND 1000000000 THEN
        PERFORM pgcoord_refuse('rate', 'between 1 and 1000000000', p_rate::text);
    END IF;
    IF NOT coalesce(pgcoord_ratelimit_period_ok(p_period), false) THEN
        PERFORM pgcoord_refuse('period', 'positive, at most 366 days, without months or years', p_period::text);
    END IF;
    IF p_burst IS NULL OR p_burst NOT BETWEEN 1 AND 1000000000 THEN
        PERFORM pgcoord_refuse('burst', 'between 1 and 1000000000', p_burst::text);
    END IF;
    IF p_shadow IS NULL THEN
        PERFORM pgcoord_refuse('shadow', 'true or false', NULL);
    END IF;
    IF p_unlogged IS NULL THEN
        PERFORM pgcoord_refuse('unlogged', 'true or false', NULL);
    END IF;
    IF EXISTS (SELECT FROM pgcoord_ratelimit_policies p WHERE p.name = p_name AND p.unlogged <> p_unlogged) THEN
        PERFORM pgcoord_refuse('unlogged', 'what the policy was created with (' || (NOT p_unlogged)::text
                               || '): delete the policy and create it again to change it', p_unlogged::text);
    END IF;
    v_us := ceil(extract(epoch FROM p_period) * 1000000 / p_rate);
    IF v_us * p_burst > 366 * 86400 * 1000000::numeric THEN
        PERFORM pgcoord_refuse('burst × period / rate', 'at most 366 days', (v_us * p_burst / 1000000) || ' s');
    END IF;
    INSERT INTO pgcoord_ratelimit_policies AS p (name, rate, period, burst, shadow, unlogged, interval_us)
    VALUES (p_name, p_rate, p_period, p_burst, p_shadow, p_unlogged, v_us)
    ON CONFLICT (name) DO UPDATE
       SET rate = excluded.rate, period = excluded.period, burst = excluded.burst,
           shadow = excluded.shadow, interval_us = excluded.interval_us,
           shadow_refused = CASE WHEN p.shadow AND excluded.shadow THEN p.shadow_refused ELSE 0 END,
           updated_at = pgcoord_now()
    RETURNING (NOT (p.shadow AND p_shadow)) INTO v_restart;
    IF v_restart AND p_unlogged THEN
        UPDATE pgcoord_ratelimit_state_unlogged s SET shadow_refused = 0 WHERE s.policy = p_name AND s.shadow_refused > 0;
    ELSIF v_restart THEN
        UPDATE pgcoord_ratelimit_state s SET shadow_refused = 0 WHERE s.policy = p_name AND s.shadow_refused > 0;
    END IF;
    RETURN QUERY SELECT p.name, p.rate, p.period, p.burst, p.shadow, p.unlogged, p.interval_us,
                        pgcoord_ratelimit_shadow_refused(p.name), p.created_at, p.updated_at
                   FROM pgcoord_ratelimit_policies p WHERE p.name = p_name;
END
$$;
-- +goose StatementEnd

-- pgcoord_ratelimit_delete deletes a policy and its keys' state; false when there was none.
-- +goose StatementBegin
CREATE FUNCTION pgcoord_ratelimit_delete(p_name text) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    IF NOT pgcoord_name_ok(p_name) THEN
        PERFORM pgcoord_refuse_name('rate limit policy name', p_name);
    END IF;
    PERFORM FROM pgcoord_ratelimit_state s WHERE s.policy = p_name ORDER BY s.key FOR UPDATE;
    DELETE FROM pgcoord_ratelimit_state s WHERE s.policy = p_name;
    PERFORM FROM pgcoord_ratelimit_state_unlogged s WHERE s.policy = p_name ORDER BY s.key FOR UPDATE;
    DELETE FROM pgcoord_ratelimit_state_unlogged s WHERE s.policy = p_name;
    DELETE FROM pgcoord_ratelimit_policies p WHERE p.name = p_name;
    RETURN FOUND;
END
$$;
-- +goose StatementEnd

-- pgcoord_ratelimit_reset forgets a key's state (it is at rest again: a full burst);
-- false when it had none.
-- +goose StatementBegin
CREATE FUNCTION pgcoord_ratelimit_reset(p_policy text, p_key text) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    IF NOT pgcoord_name_ok(p_policy) THEN
        PERFORM pgcoord_refuse_name('rate limit policy name', p_policy);
    END IF;
    IF NOT pgcoord_name_ok(p_key) THEN
        PERFORM pgcoord_refuse_name('rate limit key', p_key);
    END IF;
    IF (SELECT p.unlogged FROM pgcoord_ratelimit_policies p WHERE p.name = p_policy) THEN
        DELETE FROM pgcoord_ratelimit_state_unlogged s WHERE s.policy = p_policy AND s.key = p_key;
    ELSE
        DELETE FROM pgcoord_ratelimit_state s WHERE s.policy = p_policy AND s.key = p_key;
    END IF;
    RETURN FOUND;
END
$$;
-- +goose StatementEnd

-- pgcoord_ratelimit_take charges p_cost units to every (p_policies[i], p_keys[i]) pair, all
-- or nothing, and returns one row:
--   granted      the units charged: p_cost, or 0 when refused; with p_at_most, the most
--                units from 1 to p_cost that every enforcing policy admits (0 if none)
--   policy       the binding policy: the refusing one with the latest retry (when refused),
--                the one with the latest slot (a reservation), else the one with the
--                fewest units remaining
--   retry_after  when refused, how long until the same call would be admitted; else 0
--   delay        with p_max_wait, how long until the reserved slot (act then); else 0
--   slot         the instant of the call's slot by the database clock: when charged, the
--                judgement's instant plus delay; when refused, plus retry_after
--   remaining    the units the binding policy's key admits right after this call
--   reset_after  how long until the binding policy's key is at rest (a full burst again)
--   rate, period, burst   the binding policy's
--   tats         when charged, each pair's new theoretical arrival time, in the order of
--                p_policies, the epoch for a shadow pair left uncharged; NULL when refused
--   bases        likewise, each pair's arrival time before the charge (max(tat, now)):
--                with tats, what pgcoord_ratelimit_cancel takes
-- With p_max_wait (0 to 24 hours), the call reserves: every enforcing policy charges it
-- at its next free slot, and it is admitted if no slot is further than p_max_wait away
-- (calls on a key get slots in the order they lock its row: first come, first served).
-- Up to 16 pairs, distinct; a policy that does not exist raises P0002. A cost above a
-- policy's burst could never be admitted: it raises 22023 (with p_at_most, it is capped).
-- The rows are locked in (policy, key) order, so concurrent calls over overlapping pairs
-- queue instead of deadlocking. Judged by pgcoord_clock() read after the locks are held.
--
-- pgcoord_ratelimit_take_each decides several calls of the same pairs at once, in array
-- order, as if each came right after the one before: p_costs[j] is call j's cost (1 to
-- 1000 calls). It returns one row per call, in order (call_no = j), shaped as
-- pgcoord_ratelimit_take's. It is how concurrent calls of one process on one hot key are
-- decided in one statement (the ratelimit package coalesces them); pgcoord_ratelimit_take is
-- this function for one call.
--
-- How it goes. The pairs' policies and rows are read, without a lock: if even the cheapest
-- call is refused by that state, every call is, and the refusals are returned having
-- written and locked nothing (no commit flush). Otherwise the rows are locked (or created)
-- in (policy, key) order, judged again by pgcoord_clock() read after the locks, and charged
-- with one write per row. (The ratelimit package sends a single call of one pair as one
-- UPDATE first, and this function only if that UPDATE charged nothing: RatelimitTakeOne in
-- sql/queries/ratelimits.sql.)
-- +goose StatementBegin
CREATE FUNCTION pgcoord_ratelimit_take_each(p_policies text[], p_keys text[], p_costs bigint[],
                                            p_at_most boolean DEFAULT false, p_max_wait interval DEFAULT NULL)
RETURNS TABLE (call_no integer, granted bigint, policy text, retry_after interval, delay interval, slot timestamptz,
               remaining bigint, reset_after interval, rate bigint, period interval, burst bigint,
               tats timestamptz[], bases timestamptz[])
-- Generic plans: the custom plan of a statement over unnest(p_policies, p_keys) looks far
-- cheaper than the generic one (1 row against 100), so the plan cache would replan it on
-- every call (about 90 us of a refusal's 125); the generic plans reach each row by its key.
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    v_n integer := cardinality(p_policies);
    v_m integer := cardinality(p_costs);
    v_max_wait bigint := coalesce(extract(epoch FROM p_max_wait) * 1000000, 0);
    -- The pairs, in (policy, key) order.
    v_pos integer[];           -- each pair's index in p_policies
    v_names text[];
    v_keys text[];
    v_us bigint[];             -- T, µs
    v_tau bigint[];            -- burst × T, µs
    v_rate bigint[];
    v_period interval[];
    v_burst bigint[];
    v_shadow boolean[];
    v_unlogged boolean[];      -- the key's row is in pgcoord_ratelimit_state_unlogged
    v_tat timestamptz[];       -- as read or locked; NULL: no row (at rest)
    v_t timestamptz;
    v_ahead bigint[];          -- µs the pair's tat is ahead of v_now (<= 0: at rest)
    v_counted bigint[];        -- shadow refusals to add, per pair
    v_known integer;
    v_names_ok boolean;
    v_distinct integer;
    v_now timestamptz;
    v_refused boolean := false; -- every call refused by the state as read
    v_cost bigint;
    v_need bigint;
    v_grant bigint;
    v_fit bigint;
    v_wait bigint;             -- µs until a slot for v_need units (<= 0: now)
    v_refuse bigint;           -- the latest retry of a refusing policy, µs
    v_refuser integer;
    v_delay bigint;            -- the latest slot of the call, µs
    v_late integer;
    v_least bigint;
    v_left bigint;
    v_bind integer;
    v_out timestamptz[];
    v_bases timestamptz[];
BEGIN
    IF pg_is_in_recovery() THEN
        PERFORM pgcoord_refuse_on_standby();
    END IF;
    IF v_n IS NULL OR v_n NOT BETWEEN 1 AND 16 OR array_ndims(p_policies) <> 1 THEN
        PERFORM pgcoord_refuse('p_policies', '1 to 16 policy names', coalesce(v_n::text || ' names', NULL));
    END IF;
    IF p_keys IS NULL OR cardinality(p_keys) <> v_n OR array_ndims(p_keys) <> 1 THEN
        PERFORM pgcoord_refuse('p_keys', 'one key per policy (' || v_n || ')',
                               coalesce(cardinality(p_keys)::text || ' keys', NULL));
    END IF;
    IF v_m IS NULL OR v_m NOT BETWEEN 1 AND 1000 OR array_ndims(p_costs) <> 1 THEN
        PERFORM pgcoord_refuse('p_costs', '1 to 1000 costs', coalesce(v_m::text || ' costs', NULL));
    END IF;
    IF p_at_most IS NULL THEN
        PERFORM pgcoord_refuse('p_at_most', 'true or false', NULL);
    END IF;
    IF p_max_wait IS NOT NULL AND (p_at_most OR p_max_wait < interval '0' OR p_max_wait > interval '24 hours'
                                   OR date_part('month', p_max_wait) <> 0 OR date_part('year', p_max_wait) <> 0) THEN
        PERFORM pgcoord_refuse('max wait', '0 to 24 hours, and not with p_at_most', p_max_wait::text);
    END IF;
    IF v_m = 1 THEN -- (no query for the usual single call)
        v_need := p_costs[1];
        v_cost := v_need;
        v_known := CASE WHEN v_need IS NULL THEN 0 ELSE 1 END;
    ELSE
        SELECT min(c), max(c), count(c) INTO v_need, v_cost, v_known FROM unnest(p_costs) c;
    END IF;
    IF v_known < v_m OR v_need < 1 OR v_cost > 1000000000 THEN
        PERFORM pgcoord_refuse('cost', 'between 1 and 1000000000',
                               (SELECT c::text FROM unnest(p_costs) c WHERE c IS NULL OR c NOT BETWEEN 1 AND 1000000000 LIMIT 1));
    END IF;

    -- The pairs' policies and rows as they are, in (policy, key) order, without a lock.
    SELECT array_agg(x.i), array_agg(x.p), array_agg(x.k), array_agg(x.interval_us),
           array_agg(x.interval_us * x.burst), array_agg(x.rate), array_agg(x.period), array_agg(x.burst),
           array_agg(x.shadow), array_agg(x.unlogged), array_agg(x.tat),
           count(x.name), bool_and(x.names_ok), count(DISTINCT (x.p, x.k))
      INTO v_pos, v_names, v_keys, v_us, v_tau, v_rate, v_period, v_burst, v_shadow, v_unlogged, v_tat,
           v_known, v_names_ok, v_distinct
      FROM (SELECT u.i::integer AS i, u.p, u.k, p.name, p.interval_us, p.burst, p.rate, p.period, p.shadow,
                   p.unlogged, coalesce(s.tat, su.tat) AS tat,
                   coalesce(pgcoord_name_ok(u.p) AND pgcoord_name_ok(u.k), false) AS names_ok
              FROM unnest(p_policies, p_keys) WITH ORDINALITY AS u(p, k, i)
              LEFT JOIN pgcoord_ratelimit_policies p ON p.name = u.p
              LEFT JOIN pgcoord_ratelimit_state s ON s.policy = u.p AND s.key = u.k AND NOT p.unlogged
              LEFT JOIN pgcoord_ratelimit_state_unlogged su ON su.policy = u.p AND su.key = u.k AND p.unlogged
             ORDER BY u.p, u.k) x;
    IF NOT v_names_ok THEN
        FOR i IN 1 .. v_n LOOP
            IF NOT pgcoord_name_ok(p_policies[i]) THEN
                PERFORM pgcoord_refuse_name('rate limit policy name', p_policies[i]);
            END IF;
            IF NOT pgcoord_name_ok(p_keys[i]) THEN
                PERFORM pgcoord_refuse_name('rate limit key', p_keys[i]);
            END IF;
        END LOOP;
    END IF;
    IF v_distinct < v_n THEN
        FOR i IN 2 .. v_n LOOP
            IF v_names[i] = v_names[i - 1] AND v_keys[i] = v_keys[i - 1] THEN
                PERFORM pgcoord_refuse('each (policy, key) pair', 'given once', v_names[i] || ', ' || v_keys[i]);
            END IF;
        END LOOP;
    END IF;
    IF v_known < v_n THEN
        RAISE EXCEPTION 'pgcoord: no rate limit policy %',
            quote_literal((SELECT u.p FROM unnest(p_policies) u(p)
                            WHERE NOT EXISTS (SELECT FROM pgcoord_ratelimit_policies p WHERE p.name = u.p) LIMIT 1))
            USING ERRCODE = 'P0002';
    END IF;
    IF NOT p_at_most THEN
        FOR i IN 1 .. v_n LOOP
            IF v_cost > v_burst[i] AND NOT v_shadow[i] THEN
                PERFORM pgcoord_refuse('cost', 'at most the burst of policy ' || quote_literal(v_names[i])
                                       || ' (' || v_burst[i] || ')', v_cost::text);
            END IF;
        END LOOP;
    END IF;
    v_counted := array_fill(0::bigint, ARRAY[v_n]);

    -- If the cheapest call is refused by the state as read, every call is (a refusal
    -- charges nothing): they are answered from that state. Else the rows are locked.
    IF p_at_most THEN
        v_need := 1;
    END IF;
    v_now := pgcoord_clock();
    FOR i IN 1 .. v_n LOOP
        v_ahead[i] := coalesce(ceil(extract(epoch FROM (v_tat[i] - v_now)) * 1000000)::bigint, 0);
        CONTINUE WHEN v_shadow[i];
        IF greatest(v_ahead[i], 0) + v_need * v_us[i] - v_tau[i] > v_max_wait THEN
            v_refused := true;
        END IF;
    END LOOP;
    IF NOT v_refused THEN
        FOR i IN 1 .. v_n LOOP
            -- A key at rest has no row: create it; a concurrent creator makes this wait for
            -- it, and then lock its row.
            IF v_unlogged[i] THEN
                SELECT s.tat INTO v_t FROM pgcoord_ratelimit_state_unlogged s
                 WHERE s.policy = v_names[i] AND s.key = v_keys[i] FOR UPDATE;
                IF NOT FOUND THEN
                    INSERT INTO pgcoord_ratelimit_state_unlogged AS s (policy, key, tat)
                    VALUES (v_names[i], v_keys[i], pgcoord_clock())
                    ON CONFLICT ON CONSTRAINT pgcoord_ratelimit_state_unlogged_pkey DO UPDATE SET tat = s.tat
                    RETURNING s.tat INTO v_t;
                END IF;
            ELSE
                SELECT s.tat INTO v_t FROM pgcoord_ratelimit_state s
                 WHERE s.policy = v_names[i] AND s.key = v_keys[i] FOR UPDATE;
                IF NOT FOUND THEN
                    INSERT INTO pgcoord_ratelimit_state AS s (policy, key, tat)
                    VALUES (v_names[i], v_keys[i], pgcoord_clock())
                    ON CONFLICT ON CONSTRAINT pgcoord_ratelimit_state_pkey DO UPDATE SET tat = s.tat
                    RETURNING s.tat INTO v_t;
                END IF;
            END IF;
            v_tat[i] := v_t;
        END LOOP;
        v_now := pgcoord_clock();
        FOR i IN 1 .. v_n LOOP
            v_ahead[i] := ceil(extract(epoch FROM (v_tat[i] - v_now)) * 1000000)::bigint;
        END LOOP;
    END IF;

    -- Each call in turn, by v_now: judged by every enforcing policy, then, if admitted,
    -- charged to every enforcing policy and every shadow one that would admit it.
    FOR j IN 1 .. v_m LOOP
        call_no := j;
        v_cost := p_costs[j];
        v_need := CASE WHEN p_at_most THEN 1 ELSE v_cost END;
        v_grant := v_cost;
        v_refuse := -1;
        v_refuser := NULL;
        v_delay := 0;
        v_late := NULL;
        FOR i IN 1 .. v_n LOOP
            CONTINUE WHEN v_shadow[i];
            -- admitted once max(tat, now) + need × T - tau <= now: v_wait µs from now
            v_wait := greatest(v_ahead[i], 0) + v_need * v_us[i] - v_tau[i];
            IF p_at_most THEN
                v_grant := least(v_grant, greatest((v_tau[i] - greatest(v_ahead[i], 0)) / v_us[i], 0));
            END IF;
            IF v_wait > v_max_wait THEN
                IF v_wait - v_max_wait > v_refuse THEN
                    v_refuse := v_wait - v_max_wait;
                    v_refuser := i;
                END IF;
            ELSIF v_wait > v_delay THEN
                v_delay := v_wait;
                v_late := i;
            END IF;
        END LOOP;
        IF v_refuser IS NOT NULL THEN
            granted := 0;
            policy := v_names[v_refuser];
            retry_after := greatest(v_refuse, 1) * interval '1 microsecond';
            delay := interval '0';
            slot := v_now + retry_after;
            remaining := 0;
            reset_after := greatest(v_ahead[v_refuser], 0) * interval '1 microsecond';
            rate := v_rate[v_refuser];
            period := v_period[v_refuser];
            burst := v_burst[v_refuser];
            tats := NULL;
            bases := NULL;
            RETURN NEXT;
            CONTINUE;
        END IF;
        v_out := array_fill('epoch'::timestamptz, ARRAY[v_n]);
        v_bases := v_out;
        v_bind := NULL;
        FOR i IN 1 .. v_n LOOP
            v_fit := (v_tau[i] - greatest(v_ahead[i], 0)) / v_us[i];
            IF v_shadow[i] AND v_fit < v_grant THEN
                v_counted[i] := v_counted[i] + 1;
                v_left := greatest(v_fit, 0);
            ELSE
                v_bases[v_pos[i]] := v_now + greatest(v_ahead[i], 0) * interval '1 microsecond';
                v_ahead[i] := greatest(v_ahead[i], 0) + v_grant * v_us[i];
                v_left := greatest(v_fit - v_grant, 0);
                v_out[v_pos[i]] := v_now + v_ahead[i] * interval '1 microsecond';
            END IF;
            -- The binding policy is an enforcing one (a shadow one only when all are).
            IF v_bind IS NULL OR (v_shadow[v_bind] AND NOT v_shadow[i])
               OR (v_shadow[v_bind] = v_shadow[i] AND v_left < v_least) THEN
                v_least := v_left;
                v_bind := i;
            END IF;
        END LOOP;
        v_bind := coalesce(v_late, v_bind);
        granted := v_grant;
        policy := v_names[v_bind];
        retry_after := interval '0';
        delay := v_delay * interval '1 microsecond';
        slot := v_now + delay;
        remaining := CASE WHEN v_late IS NULL THEN v_least ELSE 0 END; -- a delayed slot leaves none
        reset_after := greatest(v_ahead[v_bind], 0) * interval '1 microsecond';
        rate := v_rate[v_bind];
        period := v_period[v_bind];
        burst := v_burst[v_bind];
        tats := v_out;
        bases := v_bases;
        RETURN NEXT;
    END LOOP;

    -- One write per row that changed.
    IF NOT v_refused THEN
        FOR i IN 1 .. v_n LOOP
            CONTINUE WHEN v_counted[i] = 0 AND v_now + v_ahead[i] * interval '1 microsecond' = v_tat[i];
            IF v_unlogged[i] THEN
                UPDATE pgcoord_ratelimit_state_unlogged s
                   SET tat = greatest(v_tat[i], v_now + v_ahead[i] * interval '1 microsecond'),
                       shadow_refused = s.shadow_refused + v_counted[i]
                 WHERE s.policy = v_names[i] AND s.key = v_keys[i];
            ELSE
                UPDATE pgcoord_ratelimit_state s
                   SET tat = greatest(v_tat[i], v_now + v_ahead[i] * interval '1 microsecond'),
                       shadow_refused = s.shadow_refused + v_counted[i]
                 WHERE s.policy = v_names[i] AND s.key = v_keys[i];
            END IF;
        END LOOP;
    END IF;
END
$$;
-- +goose StatementEnd

-- pgcoord_ratelimit_take is pgcoord_ratelimit_take_each for one call.
-- +goose StatementBegin
CREATE FUNCTION pgcoord_ratelimit_take(p_policies text[], p_keys text[], p_cost bigint,
                                       p_at_most boolean DEFAULT false, p_max_wait interval DEFAULT NULL)
RETURNS TABLE (granted bigint, policy text, retry_after interval, delay interval, slot timestamptz,
               remaining bigint, reset_after interval, rate bigint, period interval, burst bigint,
               tats timestamptz[], bases timestamptz[])
LANGUAGE plpgsql AS $$
BEGIN
    -- PL/pgSQL, not SQL: a SQL function that is not inlined plans its query on every call.
    RETURN QUERY SELECT t.granted, t.policy, t.retry_after, t.delay, t.slot, t.remaining, t.reset_after, t.rate,
                        t.period, t.burst, t.tats, t.bases
                   FROM pgcoord_ratelimit_take_each(p_policies, p_keys, ARRAY[p_cost], p_at_most, p_max_wait) t;
END
$$;
-- +goose StatementEnd

-- pgcoord_ratelimit_cancel gives back a reservation not yet due: each pair whose tat is
-- still p_tats[i] (no later call charged the key since) goes back to p_bases[i], its
-- arrival time before the reservation, but never before now — as if the reservation had
-- not been made, whatever the policy's rate since. Pairs charged since keep their tat: the
-- slot is lost. Returns how many pairs gave their units back.
-- +goose StatementBegin
CREATE FUNCTION pgcoord_ratelimit_cancel(p_policies text[], p_keys text[], p_tats timestamptz[],
                                         p_bases timestamptz[])
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    v_n integer;
    v_pair record;
BEGIN
    IF coalesce(cardinality(p_policies) NOT BETWEEN 1 AND 16 OR cardinality(p_keys) <> cardinality(p_policies)
                OR cardinality(p_tats) <> cardinality(p_policies)
                OR cardinality(p_bases) <> cardinality(p_policies), true) THEN
        PERFORM pgcoord_refuse('p_policies, p_keys, p_tats and p_bases', 'arrays of 1 to 16 elements, of one length',
                               cardinality(p_policies) || ', ' || cardinality(p_keys) || ', ' || cardinality(p_tats)
                               || ', ' || cardinality(p_bases));
    END IF;
    IF EXISTS (SELECT FROM unnest(p_tats, p_bases) u(t, b) WHERE b > t) THEN
        PERFORM pgcoord_refuse('p_bases', 'each at most its p_tats element (a reservation''s arrival times)',
                               (SELECT b::text FROM unnest(p_tats, p_bases) u(t, b) WHERE b > t LIMIT 1));
    END IF;
    -- Pair by pair in (policy, key) order, as every take locks them: no deadlock with one.
    v_n := 0;
    FOR v_pair IN
        SELECT u.p, u.k, u.t, u.b, p.unlogged
          FROM unnest(p_policies, p_keys, p_tats, p_bases) AS u(p, k, t, b)
          JOIN pgcoord_ratelimit_policies p ON p.name = u.p
         WHERE u.t > pgcoord_clock()
         ORDER BY u.p, u.k
    LOOP
        IF v_pair.unlogged THEN
            UPDATE pgcoord_ratelimit_state_unlogged s SET tat = greatest(v_pair.b, pgcoord_clock())
             WHERE s.policy = v_pair.p AND s.key = v_pair.k AND s.tat = v_pair.t;
        ELSE
            UPDATE pgcoord_ratelimit_state s SET tat = greatest(v_pair.b, pgcoord_clock())
             WHERE s.policy = v_pair.p AND s.key = v_pair.k AND s.tat = v_pair.t;
        END IF;
        IF FOUND THEN
            v_n := v_n + 1;
        END IF;
    END LOOP;
    RETURN v_n;
END
$$;
-- +goose StatementEnd

-- pgcoord_ratelimit_allow is pgcoord_ratelimit_take for one pair: whether p_cost units of
-- p_key under p_policy are admitted (and charged).
CREATE FUNCTION pgcoord_ratelimit_allow(p_policy text, p_key text, p_cost bigint DEFAULT 1) RETURNS boolean
    LANGUAGE sql
    AS $$ SELECT t.granted > 0 FROM pgcoord_ratelimit_take(ARRAY[p_policy], ARRAY[p_key], p_cost) t $$;

-- Retention. pgcoord_gc keeps its body, as it was, under the name pgcoord_gc_core, and
-- becomes the list of collectors: the core's kinds, then each later primitive's function
-- pgcoord_gc_<kind>. A later primitive adds its function and replaces only this list.
-- pgcoord_gc_ratelimit deletes, by pgcoord_clock(), up to p_batch rows of keys at rest
-- (their tat is past: they carry no state), skipping rows a call has locked; with
-- p_dry_run it counts them. The retention does not apply: a key at rest is the same with
-- or without its row.
ALTER FUNCTION pgcoord_gc(interval, integer, boolean) RENAME TO pgcoord_gc_core;

-- +goose StatementBegin
CREATE FUNCTION pgcoord_gc_ratelimit(p_batch integer, p_dry_run boolean) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := pgcoord_clock();
    v_n bigint;
    v_u bigint;
BEGIN
    IF p_dry_run THEN
        SELECT (SELECT count(*) FROM pgcoord_ratelimit_state s WHERE s.tat <= v_now)
             + (SELECT count(*) FROM pgcoord_ratelimit_state_unlogged s WHERE s.tat <= v_now) INTO v_n;
        RETURN v_n;
    END IF;
    -- A deleted key's shadow count goes to its policy's.
    WITH gone AS (
        -- By ctid (the rows are locked: they cannot move): a Tid Scan, where a join on the
        -- key would, on an analyzed table, hash-join a scan of the whole table per batch.
        DELETE FROM pgcoord_ratelimit_state s
         WHERE s.ctid = ANY (ARRAY(
                SELECT c.ctid FROM pgcoord_ratelimit_state c WHERE c.tat <= v_now
                 LIMIT p_batch FOR UPDATE SKIP LOCKED))
           AND s.tat <= v_now
        RETURNING s.policy, s.shadow_refused),
    folded AS (
        UPDATE pgcoord_ratelimit_policies p SET shadow_refused = p.shadow_refused + g.n
          FROM (SELECT policy, sum(shadow_refused) AS n FROM gone WHERE shadow_refused > 0 GROUP BY policy) g
         WHERE p.name = g.policy)
    SELECT count(*) INTO v_n FROM gone;
    IF v_n >= p_batch THEN
        RETURN v_n;
    END IF;
    -- The rest of the batch from the unlogged policies' keys, alike.
    WITH gone AS (
        DELETE FROM pgcoord_ratelimit_state_unlogged s
         WHERE s.ctid = ANY (ARRAY(
                SELECT c.ctid FROM pgcoord_ratelimit_state_unlogged c WHERE c.tat <= v_now
                 LIMIT p_batch - v_n FOR UPDATE SKIP LOCKED))
           AND s.tat <= v_now
        RETURNING s.policy, s.shadow_refused),
    folded AS (
        UPDATE pgcoord_ratelimit_policies p SET shadow_refused = p.shadow_refused + g.n
          FROM (SELECT policy, sum(shadow_refused) AS n FROM gone WHERE shadow_refused > 0 GROUP BY policy) g
         WHERE p.name = g.policy)
    SELECT count(*) INTO v_u FROM gone;
    RETURN v_n + v_u;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION pgcoord_gc(p_older_than interval, p_batch integer DEFAULT 10000, p_dry_run boolean DEFAULT false)
RETURNS TABLE (kind text, removed bigint) LANGUAGE plpgsql AS $$
BEGIN
    -- The core checks the arguments first.
    RETURN QUERY SELECT g.kind, g.removed FROM pgcoord_gc_core(p_older_than, p_batch, p_dry_run) g;
    kind := 'ratelimit'; removed := pgcoord_gc_ratelimit(p_batch, p_dry_run); RETURN NEXT;
END
$$;
-- +goose StatementEnd

-- Fair admission that honours rates: pgcoord_semaphore_next takes a rate limit policy,
-- p_rate_policy, whose key is the semaphore key (a tenant's rate, beside its concurrency).
-- A candidate key the policy refuses now is passed over like a key at its limit; an
-- admitted one is charged one unit, in the same transaction. Without a policy it is
-- 00010's function.
DROP FUNCTION pgcoord_semaphore_next(text, interval, text[], text);

-- +goose StatementBegin
CREATE FUNCTION pgcoord_semaphore_next(
    p_holder text, p_ttl interval, p_keys text[] DEFAULT NULL, p_sync_commit text DEFAULT NULL,
    p_rate_policy text DEFAULT NULL
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
    IF p_rate_policy IS NOT NULL AND NOT pgcoord_name_ok(p_rate_policy) THEN
        PERFORM pgcoord_refuse_name('rate limit policy name', p_rate_policy);
    END IF;
    IF p_rate_policy IS NOT NULL AND NOT EXISTS (SELECT FROM pgcoord_ratelimit_policies WHERE name = p_rate_policy) THEN
        RAISE EXCEPTION 'pgcoord: no rate limit policy %', quote_literal(p_rate_policy) USING ERRCODE = 'P0002';
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
        IF p_rate_policy IS NULL THEN
            SELECT * INTO r FROM pgcoord_semaphore_admit(v_key, p_holder, p_ttl, true);
        ELSIF EXISTS (SELECT FROM (SELECT s.policy, s.key, s.tat FROM pgcoord_ratelimit_state s
                                   UNION ALL
                                   SELECT s.policy, s.key, s.tat FROM pgcoord_ratelimit_state_unlogged s) s
                        JOIN pgcoord_ratelimit_policies p ON p.name = s.policy
                       WHERE s.policy = p_rate_policy AND s.key = v_key AND NOT p.shadow
                         AND s.tat - pgcoord_clock() > make_interval(secs => (p.burst - 1) * p.interval_us / 1000000.0)) THEN
            -- Over its rate now (read without a lock): passed over without trying.
            r := NULL;
        ELSE
            -- The key's rate under the policy is charged with its admission, all or nothing:
            -- a key the policy refuses now is passed over like a key at its limit (its
            -- virtual time does not move), and its admission is undone.
            BEGIN
                SELECT * INTO r FROM pgcoord_semaphore_admit(v_key, p_holder, p_ttl, true);
                IF r.key IS NOT NULL
                   AND (SELECT t.granted FROM pgcoord_ratelimit_take(ARRAY[p_rate_policy], ARRAY[v_key], 1) t) = 0 THEN
                    RAISE EXCEPTION 'pgcoord: rate refused' USING ERRCODE = 'PGR01';
                END IF;
            EXCEPTION WHEN SQLSTATE 'PGR01' THEN
                r := NULL;
            END;
        END IF;
        IF r.key IS NOT NULL THEN
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

-- As 00010 made it, its search_path is pinned to the install schema, then pg_temp.
-- +goose StatementBegin
DO $body$
BEGIN
    EXECUTE format('ALTER FUNCTION pgcoord_semaphore_next(text, interval, text[], text, text) SET search_path = %I, pg_temp', current_schema());
END
$body$;
-- +goose StatementEnd

-- +goose Down
DROP FUNCTION pgcoord_semaphore_next(text, interval, text[], text, text);
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
DROP FUNCTION pgcoord_gc(interval, integer, boolean);
DROP FUNCTION pgcoord_gc_ratelimit(integer, boolean);
ALTER FUNCTION pgcoord_gc_core(interval, integer, boolean) RENAME TO pgcoord_gc;
DROP FUNCTION pgcoord_ratelimit_allow(text, text, bigint);
DROP FUNCTION pgcoord_ratelimit_cancel(text[], text[], timestamptz[], timestamptz[]);
DROP FUNCTION pgcoord_ratelimit_take(text[], text[], bigint, boolean, interval);
DROP FUNCTION pgcoord_ratelimit_take_each(text[], text[], bigint[], boolean, interval);
DROP FUNCTION pgcoord_ratelimit_reset(text, text);
DROP FUNCTION pgcoord_ratelimit_delete(text);
DROP FUNCTION pgcoord_ratelimit_set(text, bigint, interval, bigint, boolean, boolean);
DROP TABLE pgcoord_ratelimit_state_unlogged;
DROP TABLE pgcoord_ratelimit_state;
DROP TABLE pgcoord_ratelimit_policies;
DROP FUNCTION pgcoord_ratelimit_shadow_refused(text);
DROP FUNCTION pgcoord_ratelimit_unlogged_tat(text, text);
DROP FUNCTION pgcoord_ratelimit_period_ok(interval);
-- +goose StatementBegin
DO $body$
BEGIN
    EXECUTE format('ALTER FUNCTION pgcoord_semaphore_next(text, interval, text[], text) SET search_path = %I, pg_temp', current_schema());
END
$body$;
-- +goose StatementEnd
