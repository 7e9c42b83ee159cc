package metrics

import (
	"context"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgcoord/pgcoord/outbox"
	"github.com/pgcoord/pgcoord/pgcoord"
)

var (
	topicLabel        = []string{"topic"}
	outboxPendingDesc = prometheus.NewDesc("pgcoord_outbox_pending",
		"Messages of the topic not yet delivered nor dead (due, delayed, in backoff or in flight).", topicLabel, nil)
	outboxDueDesc = prometheus.NewDesc("pgcoord_outbox_due",
		"Pending messages of the topic ready to claim now, by the database clock.", topicLabel, nil)
	outboxInFlightDesc = prometheus.NewDesc("pgcoord_outbox_in_flight",
		"Pending messages of the topic under a live relay claim.", topicLabel, nil)
	outboxDeadDesc = prometheus.NewDesc("pgcoord_outbox_dead",
		"Messages of the topic that failed their maximum number of attempts (until retried or pruned).", topicLabel, nil)
	outboxOldestAgeDesc = prometheus.NewDesc("pgcoord_outbox_oldest_pending_age_seconds",
		"How long the topic's oldest pending message has waited, by the database clock (0 if none).", topicLabel, nil)
	outboxMaxAttemptsDesc = prometheus.NewDesc("pgcoord_outbox_max_attempts",
		"The most failed attempts of a pending message of the topic: a stuck key shows here.", topicLabel, nil)
)

func init() {
	register(source{
		name: "outbox",
		descs: []*prometheus.Desc{outboxPendingDesc, outboxDueDesc, outboxInFlightDesc, outboxDeadDesc,
			outboxOldestAgeDesc, outboxMaxAttemptsDesc},
		collect: collectOutbox,
	})
}

// collectOutbox reads outbox.Stats: one aggregate over the pending and dead messages,
// one row per topic, of which it exports at most MaxRows.
func collectOutbox(ctx context.Context, db pgcoord.DBTX, o *Opts) ([]prometheus.Metric, bool, error) {
	stats, err := outbox.Stats(ctx, db, nil)
	if err != nil {
		return nil, false, err
	}
	truncated := len(stats) > o.MaxRows
	if truncated {
		stats = stats[:o.MaxRows]
	}
	var ms []prometheus.Metric
	for _, s := range stats {
		ms = append(ms,
			gauge(outboxPendingDesc, float64(s.Pending), s.Topic),
			gauge(outboxDueDesc, float64(s.Due), s.Topic),
			gauge(outboxInFlightDesc, float64(s.InFlight), s.Topic),
			gauge(outboxDeadDesc, float64(s.Dead), s.Topic),
			gauge(outboxOldestAgeDesc, s.OldestPendingAge().Seconds(), s.Topic),
			gauge(outboxMaxAttemptsDesc, float64(s.MaxAttempts), s.Topic))
	}
	return ms, truncated, nil
}
