-- Deliveries per minute, for the dashboard's chart (outbox.DeliveryRate).

-- name: OutboxDeliveryRate :many
-- Among the newest max_scan messages (a backward walk of the primary key: bounded work
-- whatever the table's size), the deliveries of each topic in each of the last `minutes`
-- minutes before now: minutes_ago 0 ends at now. One pass: the messages outside the window
-- (older, pending, dead) are counted in one group with topic '' and minutes_ago -1, so that
-- scanned, the sum of every group, says how many messages were read. At least one row comes
-- back, for db_now, even from an empty outbox. The epoch is taken as double precision
-- (date_part): extract() computes in numeric, which doubled the statement's cost.
WITH clock AS (
    SELECT pgcoord_now()::timestamptz AS db_now
), counted AS (
    SELECT CASE WHEN w.in_window THEN w.topic ELSE '' END AS topic,
           CASE WHEN w.in_window THEN floor(date_part('epoch', w.db_now - w.delivered_at) / 60)::int ELSE -1 END AS minutes_ago,
           count(*) AS delivered
      FROM (SELECT r.topic, r.delivered_at, c.db_now,
                   (r.delivered_at <= c.db_now AND r.delivered_at > c.db_now - make_interval(mins => @minutes::int)) IS TRUE AS in_window
              FROM clock c,
                   LATERAL (SELECT o.topic, o.delivered_at FROM pgcoord_outbox o ORDER BY o.id DESC LIMIT @max_scan::int) r) w
     GROUP BY 1, 2
)
SELECT coalesce(g.topic, '')::text AS topic,
       coalesce(g.minutes_ago, -1)::int AS minutes_ago,
       coalesce(g.delivered, 0)::bigint AS delivered,
       coalesce(sum(g.delivered) OVER (), 0)::bigint AS scanned,
       c.db_now::timestamptz AS db_now
FROM clock c LEFT JOIN counted g ON true
ORDER BY 1, 2 DESC;
