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
	leaseNearMissesDesc = prometheus.NewDesc("pgcoord_lease_near_misses_total",
		"Renewals of the lease's grants that found less than a quarter of the grant left, by the database clock.", []string{"name"}, nil)
	leaseForcedExpiriesDesc = prometheus.NewDesc("pgcoord_lease_forced_expiries_total",
		"Grants of the lease an operator forced to expire (leases.Expire).", []string{"name"}, nil)

	// Measured in this process by leases.Do and Electors (Opts.Leases).
	leaseClientRenewalsDesc = prometheus.NewDesc("pgcoord_lease_client_renewals_total",
		"Successful keep-alive renewals in this process (leases.Do).", nil, nil)
	leaseClientRenewErrorsDesc = prometheus.NewDesc("pgcoord_lease_client_renew_errors_total",
		"Keep-alive renewals in this process that failed for a reason other than losing the lease.", nil, nil)
	leaseClientNearMissesDesc = prometheus.NewDesc("pgcoord_lease_client_near_misses_total",
		"Renewals in this process that succeeded with less than a quarter of the TTL left before the trust deadline.", nil, nil)
	leaseClientLostDesc = prometheus.NewDesc("pgcoord_lease_client_lost_total",
		"Leases lost by this process while their function ran (taken over, expired by an operator, or past the trust deadline).", nil, nil)

	// Counted in this process by package fenced (Opts.Fenced): the database cannot count a
	// refused write, whose transaction rolls back.
	fenceClientRejectionsDesc = prometheus.NewDesc("pgcoord_fence_client_rejections_total",
		"Writes this process's fenced calls refused: reason stale_token (ErrStale from Check, Write, Exec or the guard trigger) or lease_lost (CheckLease).",
		[]string{"reason"}, nil)
)

func init() {
	register(source{
		name: "leases",
		descs: []*prometheus.Desc{leasesHeldDesc, leasesExpiredDesc, leasesForcedDesc, leaseRemainingDesc, leaseTokenDesc,
			leaseNearMissesDesc, leaseForcedExpiriesDesc,
			leaseClientRenewalsDesc, leaseClientRenewErrorsDesc, leaseClientNearMissesDesc, leaseClientLostDesc,
			fenceClientRejectionsDesc},
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
		ms = append(ms, gauge(leaseTokenDesc, float64(l.Token), l.Name),
			counter(leaseNearMissesDesc, float64(l.NearMisses), l.Name),
			counter(leaseForcedExpiriesDesc, float64(l.ForcedExpiries), l.Name))
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
		ms = append(ms, counter(leaseClientRenewalsDesc, float64(m.Renewals.Load())),
			counter(leaseClientRenewErrorsDesc, float64(m.RenewErrors.Load())),
			counter(leaseClientNearMissesDesc, float64(m.NearMisses.Load())),
			counter(leaseClientLostDesc, float64(m.Lost.Load())))
	}
	if o.Fenced != nil {
		r := o.Fenced()
		ms = append(ms, counter(fenceClientRejectionsDesc, float64(r.Stale), "stale_token"),
			counter(fenceClientRejectionsDesc, float64(r.LeaseLost), "lease_lost"))
	}
	return ms, len(all) == o.MaxRows, nil
}
