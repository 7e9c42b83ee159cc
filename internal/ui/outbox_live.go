package ui

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgcoord/pgcoord/internal/dbarg"
	"github.com/pgcoord/pgcoord/outbox"
)

// What the Outbox page reads beyond the public API: the relays, the enqueue/delivery trend
// and one key's messages, each one bounded statement.
const (
	trendMinutes = 60                     // the trend chart's window, one point per minute
	trendScan    = outbox.DefaultRateScan // the newest messages the trend reads
	claimScan    = 10000                  // the in-flight claims the relay list reads
	relayRows    = 100                    // the relays it lists
)

// relayRow is one relay seen in the database: claiming messages now (its claims of
// pending messages, outbox.Config.Claimant), or waiting for a notification
// (pgcoord_outbox_idle), or both.
type relayRow struct {
	Claimant   string
	InFlight   int64    // pending messages under its live claims
	Topics     []string // their topics
	ClaimUntil time.Time
	IdleUntil  time.Time // zero unless it waits for a notification
}

// loadRelays reads the relays: the live claims among at most claimScan in-flight
// messages (a walk of the pending messages, as outbox.Stats does), joined with the relays
// that wait. more reports that there were more claims than it read.
func loadRelays(ctx context.Context, s *Server) (relays []relayRow, more bool, err error) {
	rows, err := s.cfg.Pool.Query(ctx, `
		WITH claims AS (
		    SELECT o.claimed_by, o.topic, o.claim_expires_at FROM pgcoord_outbox o
		     WHERE o.state = 'pending' AND o.claim_expires_at > pgcoord_now() AND o.claimed_by IS NOT NULL
		     LIMIT $1
		), c AS (
		    SELECT claimed_by AS claimant, count(*) AS n, array_agg(DISTINCT topic ORDER BY topic) AS topics,
		           max(claim_expires_at) AS until
		      FROM claims GROUP BY claimed_by
		), i AS (
		    SELECT claimant, until FROM pgcoord_outbox_idle WHERE until > pgcoord_now()
		)
		SELECT coalesce(c.claimant, i.claimant), coalesce(c.n, 0), coalesce(c.topics, '{}'),
		       coalesce(c.until, 'epoch'), coalesce(i.until, 'epoch'), (SELECT count(*) FROM claims)
		  FROM c FULL JOIN i ON i.claimant = c.claimant
		 ORDER BY 1 LIMIT $2`, claimScan, relayRows)
	if err != nil {
		return nil, false, err
	}
	var scanned int
	relays, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (relayRow, error) {
		var x relayRow
		err := r.Scan(&x.Claimant, &x.InFlight, &x.Topics, &x.ClaimUntil, &x.IdleUntil, &scanned)
		if x.IdleUntil.Equal(time.Unix(0, 0)) {
			x.IdleUntil = time.Time{}
		}
		return x, err
	})
	return relays, scanned >= claimScan, err
}

// trendChart is the enqueued-vs-delivered chart: two lines, one point per minute, oldest
// left, in a box of trendMinutes*10 by 100.
type trendChart struct {
	Enqueued, Delivered     []int64
	EnqPoints, DelPoints    string // SVG polyline points
	Max, EnqTotal, DelTotal int64
	Complete                bool // fewer messages than trendScan: exact counts
	Minutes, Width, Scanned int
	Behind                  bool // more enqueued than delivered over the last 10 minutes
}

// loadTrend counts, among the newest trendScan messages by id (a backward walk of the
// primary key), the messages created and delivered in each of the last trendMinutes
// minutes, by the database clock: one statement.
func loadTrend(ctx context.Context, s *Server) (trendChart, error) {
	c := trendChart{Enqueued: make([]int64, trendMinutes), Delivered: make([]int64, trendMinutes),
		Minutes: trendMinutes, Width: trendMinutes * 10}
	rows, err := s.cfg.Pool.Query(ctx, `
		WITH clock AS (SELECT pgcoord_now()::timestamptz AS now),
		r AS MATERIALIZED (SELECT o.created_at, o.delivered_at FROM pgcoord_outbox o ORDER BY o.id DESC LIMIT $2),
		e AS (
		    SELECT 'enqueued' AS kind, floor(date_part('epoch', c.now - r.created_at) / 60)::int AS ago FROM r, clock c
		     WHERE r.created_at <= c.now AND r.created_at > c.now - make_interval(mins => $1)
		    UNION ALL
		    SELECT 'delivered', floor(date_part('epoch', c.now - r.delivered_at) / 60)::int FROM r, clock c
		     WHERE r.delivered_at <= c.now AND r.delivered_at > c.now - make_interval(mins => $1)
		)
		SELECT kind, ago, count(*)::bigint FROM e GROUP BY 1, 2
		UNION ALL SELECT 'scanned', 0, count(*)::bigint FROM r`, trendMinutes, trendScan)
	if err != nil {
		return c, err
	}
	defer rows.Close()
	for rows.Next() {
		var kind string
		var ago int
		var n int64
		if err := rows.Scan(&kind, &ago, &n); err != nil {
			return c, err
		}
		switch {
		case kind == "scanned":
			c.Scanned = int(n)
		case ago >= 0 && ago < trendMinutes && kind == "enqueued":
			c.Enqueued[trendMinutes-1-ago] = n
		case ago >= 0 && ago < trendMinutes:
			c.Delivered[trendMinutes-1-ago] = n
		}
	}
	if err := rows.Err(); err != nil {
		return c, err
	}
	c.Complete = c.Scanned < trendScan
	c.Max = 1
	var enq10, del10 int64
	for i := range trendMinutes {
		c.Max = max(c.Max, c.Enqueued[i], c.Delivered[i])
		c.EnqTotal += c.Enqueued[i]
		c.DelTotal += c.Delivered[i]
		if i >= trendMinutes-10 {
			enq10, del10 = enq10+c.Enqueued[i], del10+c.Delivered[i]
		}
	}
	c.Behind = enq10 > del10
	c.EnqPoints, c.DelPoints = points(c.Enqueued, c.Max), points(c.Delivered, c.Max)
	return c, nil
}

// points draws counts as the points of an SVG polyline 10 wide per count and 100 high,
// scaled to top.
func points(counts []int64, top int64) string {
	var b strings.Builder
	for i, n := range counts {
		fmt.Fprintf(&b, "%d,%.1f ", 10*i+5, 100-pct(float64(n), float64(top)))
	}
	return strings.TrimSpace(b.String())
}

// loadKeyMessages reads the newest detailRows messages of (topic, key): its pending and
// dead messages by their indexes, and its delivered ones among the newest trendScan
// messages (no index covers them); payloads only with ShowPayloads, at most
// maxPayloadShown bytes each. One statement.
func loadKeyMessages(ctx context.Context, s *Server, topic, key string) ([]outbox.Message, error) {
	var payloadBytes int
	if s.cfg.ShowPayloads {
		payloadBytes = maxPayloadShown
	}
	rows, err := s.cfg.Pool.Query(ctx, `
		SELECT m.id, m.state, m.attempts, m.created_at, m.delivered_at, m.dead_at, m.last_error, m.claimed_by,
		       octet_length(m.payload), substring(m.payload FROM 1 FOR $4)
		  FROM ((SELECT * FROM pgcoord_outbox o WHERE o.state = 'pending' AND o.topic = $1 AND o.key = $2 ORDER BY o.id DESC LIMIT $3)
		        UNION ALL
		        (SELECT * FROM pgcoord_outbox o WHERE o.state = 'dead' AND o.topic = $1 AND o.key = $2 ORDER BY o.id DESC LIMIT $3)
		        UNION ALL
		        (SELECT * FROM (SELECT * FROM pgcoord_outbox o ORDER BY o.id DESC LIMIT $5) n
		          WHERE n.state = 'delivered' AND n.topic = $1 AND n.key = $2)) m
		 ORDER BY m.id DESC LIMIT $3`, topic, key, detailRows, payloadBytes, trendScan)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (outbox.Message, error) {
		m := outbox.Message{Topic: topic, Key: key}
		var delivered, dead *time.Time
		var lastErr, claimedBy *string
		var state string
		err := r.Scan(&m.ID, &state, &m.Attempts, &m.CreatedAt, &delivered, &dead, &lastErr, &claimedBy, &m.PayloadSize, &m.Payload)
		m.State = outbox.State(state)
		m.DeliveredAt, m.DeadAt = dbarg.Deref(delivered), dbarg.Deref(dead)
		m.LastError, m.ClaimedBy = dbarg.Deref(lastErr), dbarg.Deref(claimedBy)
		return m, err
	})
}
