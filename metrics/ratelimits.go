package metrics

import (
	"context"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgcoord/pgcoord/pgcoord"
	"github.com/pgcoord/pgcoord/ratelimit"
)

var (
	policyLabel         = []string{"policy"}
	rlRateDesc          = prometheus.NewDesc("pgcoord_ratelimit_rate_per_second", "Units the policy admits per second (rate / period).", policyLabel, nil)
	rlBurstDesc         = prometheus.NewDesc("pgcoord_ratelimit_burst", "The most units the policy admits at once.", policyLabel, nil)
	rlShadowDesc        = prometheus.NewDesc("pgcoord_ratelimit_shadow", "1 when the policy is in shadow mode (counts, refuses nothing).", policyLabel, nil)
	rlShadowRefusedDesc = prometheus.NewDesc("pgcoord_ratelimit_shadow_refused_total",
		"Calls the policy would have refused since shadow mode was turned on, in every process.", policyLabel, nil)

	// Measured in this process (Opts.Ratelimits).
	rlClientAllowedDesc = prometheus.NewDesc("pgcoord_ratelimit_client_allowed_total",
		"Calls of this process the policy admitted.", policyLabel, nil)
	rlClientRefusedDesc = prometheus.NewDesc("pgcoord_ratelimit_client_refused_total",
		"Calls of this process the policy refused.", policyLabel, nil)
)

func init() {
	register(source{
		name:    "ratelimits",
		descs:   []*prometheus.Desc{rlRateDesc, rlBurstDesc, rlShadowDesc, rlShadowRefusedDesc, rlClientAllowedDesc, rlClientRefusedDesc},
		collect: collectRatelimits,
	})
}

func collectRatelimits(ctx context.Context, db pgcoord.DBTX, o *Opts) ([]prometheus.Metric, bool, error) {
	ps, err := ratelimit.List(ctx, db, &ratelimit.ListOpts{Limit: o.MaxRows})
	if err != nil {
		return nil, false, err
	}
	var ms []prometheus.Metric
	for _, p := range ps {
		shadow := 0.0
		if p.Shadow {
			shadow = 1
		}
		ms = append(ms,
			gauge(rlRateDesc, float64(p.Rate)/p.Period.Seconds(), p.Name),
			gauge(rlBurstDesc, float64(p.Burst), p.Name),
			gauge(rlShadowDesc, shadow, p.Name),
			counter(rlShadowRefusedDesc, float64(p.ShadowRefused), p.Name))
	}
	if m := o.Ratelimits; m != nil {
		for _, c := range m.Snapshot() {
			ms = append(ms, counter(rlClientAllowedDesc, float64(c.Allowed), c.Policy),
				counter(rlClientRefusedDesc, float64(c.Refused), c.Policy))
		}
	}
	return ms, len(ps) == o.MaxRows, nil
}
