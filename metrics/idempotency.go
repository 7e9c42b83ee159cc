package metrics

import (
	"context"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgcoord/pgcoord/idempotency"
	"github.com/pgcoord/pgcoord/pgcoord"
)

var (
	idemInFlightDesc = prometheus.NewDesc("pgcoord_idempotency_keys_in_flight",
		"Idempotency keys in flight whose attempt committed a recovery point (held or stuck); attempts that have not are visible only through their lock.", nil, nil)
	idemStuckDesc = prometheus.NewDesc("pgcoord_idempotency_keys_stuck",
		"Idempotency keys in flight that no live attempt holds: their holder died, and the next retry recovers them.", nil, nil)
	idemCompletedDesc = prometheus.NewDesc("pgcoord_idempotency_keys_completed",
		`Completed idempotency keys (stored responses) among the first MaxRows keys: a lower bound when pgcoord_rows_truncated{source="idempotency_keys"} is 1.`, nil, nil)
)

// Two sources, so that each reads one bounded list and its truncation means one thing:
// in-flight keys (few, and what an alert watches) apart from all keys.
func init() {
	register(source{name: "idempotency", descs: []*prometheus.Desc{idemInFlightDesc, idemStuckDesc}, collect: collectIdempotencyInFlight})
	register(source{name: "idempotency_keys", descs: []*prometheus.Desc{idemCompletedDesc}, collect: collectIdempotencyKeys})
}

// collectIdempotencyInFlight counts the keys in flight and those of them stuck, from one
// page of at most MaxRows in-flight keys (idempotency.List, as `pgcoord idempotency list
// --in-flight`).
func collectIdempotencyInFlight(ctx context.Context, db pgcoord.DBTX, o *Opts) ([]prometheus.Metric, bool, error) {
	keys, err := idempotency.List(ctx, db, &idempotency.ListOpts{InFlight: true, Limit: o.MaxRows})
	if err != nil {
		return nil, false, err
	}
	var stuck int
	for _, k := range keys {
		if k.Stuck() {
			stuck++
		}
	}
	return []prometheus.Metric{gauge(idemInFlightDesc, float64(len(keys))), gauge(idemStuckDesc, float64(stuck))},
		len(keys) == o.MaxRows, nil
}

// collectIdempotencyKeys counts the completed keys among the first MaxRows keys.
func collectIdempotencyKeys(ctx context.Context, db pgcoord.DBTX, o *Opts) ([]prometheus.Metric, bool, error) {
	keys, err := idempotency.List(ctx, db, &idempotency.ListOpts{Limit: o.MaxRows})
	if err != nil {
		return nil, false, err
	}
	var completed int
	for _, k := range keys {
		if k.State == idempotency.StateCompleted {
			completed++
		}
	}
	return []prometheus.Metric{gauge(idemCompletedDesc, float64(completed))}, len(keys) == o.MaxRows, nil
}
