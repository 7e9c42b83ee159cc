-- Outbox relays share the keys through a partition group (issue 31), instead of the soft
-- bucket ranges of pgcoord_outbox_relays: one mechanism, not two.
--
-- A relay is a member of a partition group (the Go Relay joins one per topic set, see
-- outbox.Config); partition p of the group's M covers the buckets p*1024/M up to
-- (p+1)*1024/M (a bucket is a hash of topic and key, pgcoord_outbox_bucket). A claim naming
-- its group walks only the buckets of the partitions its claimant holds there now (a live
-- grant of the group's epoch; of p_partitions only, when given), and holds those grants
-- (FOR KEY SHARE) until the claim commits, so no partition is granted to another member
-- while a claim of it is being made. So a relay's range is its partitions, strictly: two
-- relays never walk the same keys, a relay that joins gets its share only once the
-- partitions' holders released them, and a dead relay's partitions move when its member
-- lease expires. Per-key order does not depend on it: a claim takes a key only through its
-- head, locked, and only when no live claim covers it, as before.
--
-- A claim naming partitions (p_partitions) of which its claimant holds none raises PGP01:
-- the caller's view of its grants is behind (they lapsed, or moved on); it heartbeats and
-- claims again. (A claim naming none walks whatever the claimant holds, possibly nothing.)
--
-- A claim without a group walks every bucket: a relay alone (or one of several that accept
-- walking the same keys, skipping each other's locked heads).
--
-- pgcoord_outbox_relays, the soft ranges' registrations, is dropped.

-- +goose Up
DROP FUNCTION pgcoord_outbox_claim(text, integer, integer, bigint, interval, text[], text, text);
DROP TABLE pgcoord_outbox_relays;

-- +goose StatementBegin
CREATE FUNCTION pgcoord_outbox_claim(
    p_claimant text, p_limit integer, p_key_limit integer, p_max_bytes bigint, p_ttl interval,
    p_topics text[] DEFAULT NULL, p_after_topic text DEFAULT '', p_after_key text DEFAULT '',
    p_group text DEFAULT NULL, p_partitions integer[] DEFAULT NULL
) RETURNS SETOF pgcoord_outbox LANGUAGE plpgsql
-- The batch's rows are found by primary key (see pgcoord_outbox_settle), the keys through
-- the pending index: a table scan is never the way, even on a table not analyzed yet.
SET enable_seqscan = off
SET jit = off
AS $$
DECLARE
    v_now timestamptz := pgcoord_now();
    v_token bigint;
    v_lo integer[];         -- the ranges of buckets to walk: v_lo[i] <= bucket < v_hi[i],
    v_hi integer[];         -- disjoint, in bucket order
    v_n integer;
    v_held bigint;          -- how many of the partitions the claimant holds
    v_from integer;         -- the bucket of the key to resume after
    v_start integer;        -- the range that holds it
    v_heads bigint[] := '{}'; -- the ready heads, in walk order
    v_total bigint := 0;    -- the messages they would give
    v_seg integer;
    v_r integer;
    v_lb integer;           -- a segment: after (v_lb, v_lt, v_lk), before (v_ub, v_ut, v_uk)
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
    IF p_group IS NOT NULL THEN
        PERFORM pgcoord_partition_group_args(p_group, 1);
    END IF;
    IF p_partitions IS NOT NULL AND (p_group IS NULL OR cardinality(p_partitions) > 65536
            OR EXISTS (SELECT FROM unnest(p_partitions) x WHERE x IS NULL OR x NOT BETWEEN 0 AND 65535)) THEN
        PERFORM pgcoord_refuse('outbox claim partitions', 'partitions 0 to 65535 of the group p_group', p_partitions::text);
    END IF;
    v_token := pgcoord_next_token();

    IF p_group IS NULL THEN
        v_lo := '{0}';
        v_hi := '{1024}';
    ELSE
        -- The buckets of the partitions the claimant holds, merged where adjacent. The
        -- grants stay locked until the claim commits: none is revoked and granted anew
        -- meanwhile (a grant locks FOR UPDATE), and one released or granted anew since
        -- the snapshot is re-read on its latest version, where the claimant lost it.
        WITH held AS (
            SELECT p.partition * 1024 / g.partitions AS lo, (p.partition + 1) * 1024 / g.partitions AS hi
              FROM pgcoord_partition_groups g
              JOIN pgcoord_partitions p ON p.group_name = g.name
             WHERE g.name = p_group AND p.holder = p_claimant AND p.epoch = g.epoch
               AND p.partition < g.partitions AND p.expires_at > v_now
               AND (p_partitions IS NULL OR p.partition = ANY (p_partitions))
               FOR KEY SHARE OF p),
        edges AS (
            SELECT h.lo, h.hi, h.lo IS DISTINCT FROM lag(h.hi) OVER w AS starts,
                   h.hi IS DISTINCT FROM lead(h.lo) OVER w AS ends
              FROM held h WHERE h.lo < h.hi
            WINDOW w AS (ORDER BY h.lo))
        SELECT coalesce(array_agg(e.lo ORDER BY e.lo) FILTER (WHERE e.starts), '{}'),
               coalesce(array_agg(e.hi ORDER BY e.hi) FILTER (WHERE e.ends), '{}'),
               (SELECT count(*) FROM held)
          INTO v_lo, v_hi, v_held FROM edges e;
        IF v_held = 0 AND cardinality(p_partitions) > 0 THEN
            RAISE EXCEPTION 'pgcoord: outbox claimant % holds none of its partitions % of group %', p_claimant, p_partitions, p_group
                USING ERRCODE = 'PGP01', HINT = 'Its grants lapsed or moved on: heartbeat (pgcoord_partition_heartbeat), then claim the partitions it holds.';
        END IF;
    END IF;
    v_n := cardinality(v_lo);
    v_from := pgcoord_outbox_bucket(p_after_topic, p_after_key);
    v_start := (SELECT i FROM generate_subscripts(v_lo, 1) i WHERE v_from >= v_lo[i] AND v_from < v_hi[i]);
    IF coalesce(p_after_topic, '') = '' OR coalesce(p_after_key, '') = '' OR v_start IS NULL THEN
        v_start := 1;
        p_after_topic := '';
        p_after_key := '';
    END IF;

    -- The walk, in segments of (bucket, topic, key) order, each from after its first bound
    -- to before its second (no key or topic is ''): the cursor's range from the cursor on,
    -- the other ranges in bucket order round from it, and the cursor's range up to the
    -- cursor. It stops once the ready keys give p_limit.
    FOR v_seg IN 0..v_n LOOP
        EXIT WHEN v_total >= p_limit OR v_n = 0;
        IF v_seg = 0 THEN
            v_lb := v_from; v_lt := p_after_topic; v_lk := p_after_key;
            v_ub := v_hi[v_start]; v_ut := ''; v_uk := '';
            IF p_after_key = '' THEN
                v_lb := v_lo[v_start];
            END IF;
        ELSIF v_seg < v_n THEN
            v_r := (v_start - 1 + v_seg) % v_n + 1;
            v_lb := v_lo[v_r]; v_lt := ''; v_lk := ''; v_ub := v_hi[v_r]; v_ut := ''; v_uk := '';
        ELSE
            EXIT WHEN p_after_key = '';
            v_lb := v_lo[v_start]; v_lt := ''; v_lk := ''; v_ub := v_from; v_ut := p_after_topic; v_uk := p_after_key;
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

-- Its search_path pinned to the install schema, then pg_temp, as 00010 pinned the claim's.
-- +goose StatementBegin
DO $body$
BEGIN
    EXECUTE format('ALTER FUNCTION pgcoord_outbox_claim(text, integer, integer, bigint, interval, text[], text, text, text, integer[]) SET search_path = %I, pg_temp', current_schema());
END
$body$;
-- +goose StatementEnd

-- +goose Down
DROP FUNCTION pgcoord_outbox_claim(text, integer, integer, bigint, interval, text[], text, text, text, integer[]);

CREATE TABLE pgcoord_outbox_relays (
    claimant   text        PRIMARY KEY,
    topics     text[],
    claimed_at timestamptz NOT NULL,
    until      timestamptz NOT NULL
);

COMMENT ON TABLE pgcoord_outbox_relays IS 'pgcoord: outbox relays sharing the keys by bucket ranges';

-- pgcoord_outbox_claim as in 00010_no_stranger_locks.sql.
-- +goose StatementBegin
CREATE FUNCTION pgcoord_outbox_claim(
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

-- Its search_path pinned to the install schema, then pg_temp, as 00010 pinned the claim's.
-- +goose StatementBegin
DO $body$
BEGIN
    EXECUTE format('ALTER FUNCTION pgcoord_outbox_claim(text, integer, integer, bigint, interval, text[], text, text) SET search_path = %I, pg_temp', current_schema());
END
$body$;
-- +goose StatementEnd
