package metrics

import (
	"context"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgcoord/pgcoord/leases"
	"github.com/pgcoord/pgcoord/pgcoord"
)

var (
	leasesHeldDesc = prometheus.NewDesc("pgcoord_leases_held",
		"Leases with an unexpired holder, by the database clock.", nil, nil)
	leasesExpiredDesc = prometheus.NewDesc("pgcoord_leases_expired",
		"Leases whose grant expired by time without being released or taken since: a holder died or stopped renewing.", nil, nil)
	leasesForcedDesc = prometheus.NewDesc("pgcoord_leases_forced_expired",
		"Leases that are free because an operator forced their last grant to expire (leases.Expire).", nil, nil)
	leaseRemainingDesc = prometheus.NewDesc("pgcoord_lease_ttl_remaining_seconds",
		"Time the held lease has left, by the database clock.", []string{"name"}, nil)
	leaseTokenDesc = prometheus.NewDesc("pgcoord_lease_fence_token",
		"Fence token of the lease's current or latest grant.", []string{"name"}, nil)

	// Measured in this process by leases.Do (Opts.Leases).
	leaseRenewalsDesc = prometheus.NewDesc("pgcoord_lease_renewals_total",
		"Successful keep-alive renewals in this process (leases.Do).", nil, nil)
	leaseRenewErrorsDesc = prometheus.NewDesc("pgcoord_lease_renew_errors_total",
		"Keep-alive renewals in this process that failed for a reason other than losing the lease.", nil, nil)
	leaseNearMissesDesc = prometheus.NewDesc("pgcoord_lease_near_misses_total",
		"Renewals in this process that succeeded with less than a quarter of the TTL left before the trust deadline.", nil, nil)
	leaseLostDesc = prometheus.NewDesc("pgcoord_lease_lost_total",
		"Leases lost by this process while their function ran (taken over, expired by an operator, or past the trust deadline).", nil, nil)
)

func init() {
	register(source{
		name: "leases",
		descs: []*prometheus.Desc{leasesHeldDesc, leasesExpiredDesc, leasesForcedDesc, leaseRemainingDesc, leaseTokenDesc,
			leaseRenewalsDesc, leaseRenewErrorsDesc, leaseNearMissesDesc, leaseLostDesc},
		collect: collectLeases,
	})
}

func collectLeases(ctx context.Context, db pgcoord.DBTX, o *Opts) ([]prometheus.Metric, bool, error) {
	all, err := leases.List(ctx, db, &leases.ListOpts{Limit: o.MaxRows})
	if err != nil {
		return nil, false, err
	}
	var ms []prometheus.Metric
	var held, expired, forced int
	for _, l := range all {
		ms = append(ms, gauge(leaseTokenDesc, float64(l.Token), l.Name))
		switch {
		case l.Held():
			held++
			ms = append(ms, gauge(leaseRemainingDesc, l.Remaining().Seconds(), l.Name))
		case l.Holder != "":
			expired++
		case l.ExpiredBy != "":
			forced++
		}
	}
	ms = append(ms, gauge(leasesHeldDesc, float64(held)), gauge(leasesExpiredDesc, float64(expired)),
		gauge(leasesForcedDesc, float64(forced)))
	if m := o.Leases; m != nil {
		ms = append(ms, counter(leaseRenewalsDesc, float64(m.Renewals.Load())),
			counter(leaseRenewErrorsDesc, float64(m.RenewErrors.Load())),
			counter(leaseNearMissesDesc, float64(m.NearMisses.Load())),
			counter(leaseLostDesc, float64(m.Lost.Load())))
	}
	return ms, len(all) == o.MaxRows, nil
}
