package ui

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgcoord/pgcoord/outbox"
)

// rateMinutes is the window of the delivery-rate chart, one bar per minute.
const rateMinutes = outbox.DefaultRateMinutes

type topicRow struct {
	outbox.TopicStats
	// Waiting counts the pending messages neither due nor in flight: delayed or in backoff.
	Waiting int64
	// Scale is the pending bars' full width: the most pending messages of a topic.
	Scale int64
	// AgePct is the oldest pending age as a share of the oldest of all topics.
	AgePct float64
	// Rate is the topic's deliveries per minute, oldest first (none: no delivery in the
	// window).
	Rate []rateBar
}

// rateChart is the delivery-rate chart: one bar per minute, oldest first.
type rateChart struct {
	Bars []rateBar
	// Max is the tallest bar's count (at least 1: the chart's scale); Total the window's
	// deliveries; Complete whether they are exact (outbox.Deliveries.Complete).
	Max, Total int64
	Complete   bool
	Scanned    int
	Minutes    int
}

// rateBar is one minute's bar in a chart 100 high and 10 wide per minute.
type rateBar struct {
	N         int64
	X         int
	Y, Height float64
	Label     string // "3–2m ago"
}

// barsOf draws counts per minute, oldest first, as bars scaled to the largest (at least 1).
func barsOf(counts []int64) (bars []rateBar, top int64) {
	top = 1
	for _, n := range counts {
		top = max(top, n)
	}
	for i, n := range counts {
		h, ago := pct(float64(n), float64(top)), len(counts)-i
		bars = append(bars, rateBar{N: n, X: 10 * i, Y: 100 - h, Height: h, Label: fmt.Sprintf("%d–%dm ago", ago, ago-1)})
	}
	return bars, top
}

type outboxData struct {
	Topics []topicRow
	Chart  rateChart
	Trend  trendChart
	Dead   []outbox.Message
	DBNow  time.Time
	// Topic filters the dead list; After and Next page it by id. Prefix filters the
	// topics.
	Topic, After, Next, Prefix string
	// Key, with Topic, asks for the key's messages (KeyMessages).
	Key         string
	KeyMessages []outbox.Message
	Relays      []relayRow
	RelaysMore  bool
}

// loadOutbox reads the topics' stats, the delivery rate, the enqueue/delivery trend, the
// relays and one page of dead messages: five queries, six with ?topic=&key= (the key's
// messages). The page reads the payloads only with ShowPayloads, and then only as much of
// each as the page shows. ?prefix= filters the topics (among outbox.Stats' rows, which
// the page reads whole anyway).
func loadOutbox(ctx context.Context, s *Server, q url.Values) (any, error) {
	var d outboxData
	err := params(q, map[string]*string{"topic": &d.Topic, "after": &d.After, "prefix": &d.Prefix, "key": &d.Key})
	if err != nil {
		return nil, err
	}
	var after int64
	if d.After != "" {
		if after, err = strconv.ParseInt(d.After, 10, 64); err != nil || after < 0 {
			return nil, userErrorf(http.StatusBadRequest, "after: want a message id")
		}
	}
	if d.Key != "" && d.Topic == "" {
		return nil, userErrorf(http.StatusBadRequest, "key: name its topic too (?topic=&key=)")
	}
	stats, err := outbox.Stats(ctx, s.cfg.Pool, nil)
	if err != nil {
		return nil, err
	}
	rate, err := outbox.DeliveryRate(ctx, s.cfg.Pool, &outbox.DeliveryRateOpts{Minutes: rateMinutes})
	if err != nil {
		return nil, err
	}
	// Only a topic of the outbox (pending, dead or recently delivered messages) is shown
	// back, never a link's text: it could say anything.
	if d.Topic != "" && !slices.ContainsFunc(stats, func(st outbox.TopicStats) bool { return st.Topic == d.Topic }) &&
		!slices.ContainsFunc(rate.Topics, func(r outbox.TopicDeliveries) bool { return r.Topic == d.Topic }) {
		return nil, userErrorf(http.StatusNotFound, "topic: the outbox has no pending, dead or recently delivered message of that topic")
	}
	var payloadBytes int
	if s.cfg.ShowPayloads {
		payloadBytes = maxPayloadShown
	}
	dead, err := outbox.List(ctx, s.cfg.Pool, &outbox.ListOpts{State: outbox.Dead, Topic: d.Topic, After: after, Limit: pageSize + 1,
		PayloadBytes: payloadBytes})
	if err != nil {
		return nil, err
	}
	if d.Key != "" {
		if d.KeyMessages, err = loadKeyMessages(ctx, s, d.Topic, d.Key); err != nil {
			return nil, err
		}
		if len(d.KeyMessages) == 0 {
			return nil, userErrorf(http.StatusNotFound, "key: the topic has no message of that key (or none among the newest delivered)")
		}
	}
	if d.Relays, d.RelaysMore, err = loadRelays(ctx, s); err != nil {
		return nil, err
	}
	if d.Trend, err = loadTrend(ctx, s); err != nil {
		return nil, err
	}
	if len(dead) > pageSize {
		dead = dead[:pageSize]
		d.Next = strconv.FormatInt(dead[pageSize-1].ID, 10)
	}
	d.Dead, d.DBNow = dead, rate.DBNow

	perTopic := make(map[string][]rateBar, len(rate.Topics))
	for _, r := range rate.Topics {
		perTopic[r.Topic], _ = barsOf(r.PerMinute)
	}
	var scale int64 = 1
	var oldest time.Duration
	for _, st := range stats {
		scale = max(scale, st.Pending)
		oldest = max(oldest, st.OldestPendingAge())
	}
	for _, st := range stats {
		if !strings.HasPrefix(st.Topic, d.Prefix) {
			continue
		}
		d.Topics = append(d.Topics, topicRow{TopicStats: st, Waiting: max(st.Pending-st.Due-st.InFlight, 0), Scale: scale,
			AgePct: pct(float64(st.OldestPendingAge()), float64(oldest)), Rate: perTopic[st.Topic]})
	}
	d.Chart = chartOf(rate)
	return d, nil
}

// chartOf draws the deliveries of every topic per minute.
func chartOf(r outbox.Deliveries) rateChart {
	c := rateChart{Complete: r.Complete, Scanned: r.Scanned, Minutes: len(r.Total)}
	c.Bars, c.Max = barsOf(r.Total)
	for _, n := range r.Total {
		c.Total += n
	}
	return c
}

// summarizeOutbox counts messages by state from outbox.Stats: one aggregate query.
func summarizeOutbox(ctx context.Context, s *Server) ([]count, error) {
	stats, err := outbox.Stats(ctx, s.cfg.Pool, nil)
	if err != nil {
		return nil, err
	}
	var pending, due, inFlight, dead int64
	for _, st := range stats {
		pending, due, inFlight, dead = pending+st.Pending, due+st.Due, inFlight+st.InFlight, dead+st.Dead
	}
	return []count{{"topics", len(stats), false}, {"pending", int(pending), false}, {"due", int(due), false},
		{"in flight", int(inFlight), false}, {"dead", int(dead), false}}, nil
}

// retryMessage makes a dead message pending again (outbox.Retry), in the action's
// transaction. Only dead messages: Retry would also cut short a pending message's
// backoff, which is not what the button says.
func retryMessage(ctx context.Context, tx pgx.Tx, _ *Server, form url.Values, _ string) (string, map[string]any, string, error) {
	id, err := strconv.ParseInt(form.Get("id"), 10, 64)
	if err != nil || id < 1 {
		return "", nil, "", userErrorf(http.StatusBadRequest, "message id %q: want a positive integer", form.Get("id"))
	}
	m, err := outbox.Get(ctx, tx, id)
	if errors.Is(err, outbox.ErrNotFound) {
		return "", nil, "", userErrorf(http.StatusNotFound, "no outbox message %d (pruned?)", id)
	}
	if err != nil {
		return "", nil, "", err
	}
	if m.State != outbox.Dead {
		return "", nil, "", userErrorf(http.StatusConflict, "outbox message %d is %s, not dead: nothing to retry", id, m.State)
	}
	if err := outbox.Retry(ctx, tx, id); err != nil {
		return "", nil, "", err
	}
	details := map[string]any{"topic": m.Topic, "key": m.Key, "attempts": m.Attempts, "last_error": m.LastError}
	msg := fmt.Sprintf("outbox message %d (topic %s, key %s) is pending again after %d failed attempts; it goes before the later messages of its key",
		id, m.Topic, m.Key, m.Attempts)
	return strconv.FormatInt(id, 10), details, msg, nil
}

// retryTopic makes every dead message of a topic pending again (outbox.RetryDead), in the
// action's transaction: one statement.
func retryTopic(ctx context.Context, tx pgx.Tx, _ *Server, form url.Values, _ string) (string, map[string]any, string, error) {
	topic := form.Get("topic")
	if topic == "" {
		return "", nil, "", userErrorf(http.StatusBadRequest, "no topic given")
	}
	n, err := outbox.RetryDead(ctx, tx, &outbox.RetryDeadOpts{Topic: topic})
	if err != nil {
		return "", nil, "", err
	}
	if n == 0 {
		return "", nil, "", userErrorf(http.StatusConflict, "topic %s has no dead messages: nothing to retry", topic)
	}
	msg := fmt.Sprintf("%d dead message(s) of topic %s are pending again, each before the later messages of its key", n, topic)
	return topic, map[string]any{"retried": n}, msg, nil
}
