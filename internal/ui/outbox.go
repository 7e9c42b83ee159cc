package ui

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgcoord/pgcoord/outbox"
)

func init() {
	registerPage(page{rank: 40, path: "/outbox", title: "Outbox", tmpl: "outbox", summarize: summarizeOutbox, load: loadOutbox})
	registerAction(action{path: "/actions/outbox/retry", name: "outbox.retry", run: retryMessage, back: "/outbox"})
}

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
	Dead   []outbox.Message
	DBNow  time.Time
	// Topic filters the dead list; After and Next page it by id.
	Topic, After, Next string
}

// loadOutbox reads the topics' stats, the delivery rate and one page of dead messages:
// three queries. The page reads the payloads only with ShowPayloads, and then only as much
// of each as the page shows.
func loadOutbox(ctx context.Context, s *Server, q url.Values) (any, error) {
	d := outboxData{Topic: q.Get("topic"), After: q.Get("after")}
	var after int64
	if d.After != "" {
		var err error
		if after, err = strconv.ParseInt(d.After, 10, 64); err != nil || after < 0 {
			return nil, fmt.Errorf("after %q: want a message id", d.After)
		}
	}
	stats, err := outbox.Stats(ctx, s.cfg.Pool, nil)
	if err != nil {
		return nil, err
	}
	rate, err := outbox.DeliveryRate(ctx, s.cfg.Pool, &outbox.DeliveryRateOpts{Minutes: rateMinutes})
	if err != nil {
		return nil, err
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
func summarizeOutbox(ctx context.Context, s *Server) summary {
	sum := summary{Name: "Outbox", Path: "/outbox"}
	stats, err := outbox.Stats(ctx, s.cfg.Pool, nil)
	if err != nil {
		sum.Err = err.Error()
		return sum
	}
	var pending, due, inFlight, dead int64
	for _, st := range stats {
		pending, due, inFlight, dead = pending+st.Pending, due+st.Due, inFlight+st.InFlight, dead+st.Dead
	}
	sum.Counts = []count{{"topics", len(stats), false}, {"pending", int(pending), false}, {"due", int(due), false},
		{"in flight", int(inFlight), false}, {"dead", int(dead), false}}
	return sum
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
