package metrics

import (
	"context"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgcoord/pgcoord/pgcoord"
	"github.com/pgcoord/pgcoord/semaphore"
)

var (
	keyLabel     = []string{"key"}
	semLimitDesc = prometheus.NewDesc("pgcoord_semaphore_limit",
		"The most permits the key admits at once.", keyLabel, nil)
	semWeightDesc = prometheus.NewDesc("pgcoord_semaphore_weight",
		"The key's weight in fair admission across keys (semaphore.Next).", keyLabel, nil)
	semPermitsDesc = prometheus.NewDesc("pgcoord_semaphore_permits",
		"Unexpired permits the key holds, by the database clock.", keyLabel, nil)
	semExpiredDesc = prometheus.NewDesc("pgcoord_semaphore_expired_permits",
		"Permits past their expiry that nobody released (leaked slots), reclaimed by the key's next admission.", keyLabel, nil)
	semWaitersDesc = prometheus.NewDesc("pgcoord_semaphore_waiters",
		"Blocking acquirers waiting in line for the key.", keyLabel, nil)
	semOldestWaiterDesc = prometheus.NewDesc("pgcoord_semaphore_oldest_waiter_seconds",
		"How long the first waiter in line has waited, by the database clock (0 without waiters).", keyLabel, nil)
	semDemandDesc = prometheus.NewDesc("pgcoord_semaphore_demand",
		"Units of work waiting for the key (semaphore.AddDemand).", keyLabel, nil)
	semAdmittedDesc = prometheus.NewDesc("pgcoord_semaphore_admitted_total",
		"Admissions to the key since it was created.", keyLabel, nil)
	semRefusedDesc = prometheus.NewDesc("pgcoord_semaphore_refused_total",
		"Refusals decided under the key's lock since it was created (rounds of waiting acquirers, lost races).", keyLabel, nil)
	semWaitDesc = prometheus.NewDesc("pgcoord_semaphore_wait_seconds",
		"Time admissions to the key of the last 5 to 10 minutes waited in line, by the database clock, at the quantile (within about 20%; absent without admissions).",
		[]string{"key", "quantile"}, nil)
	semWaitedDesc = prometheus.NewDesc("pgcoord_semaphore_wait_admissions",
		"Admissions to the key of the last 5 to 10 minutes, whose waits pgcoord_semaphore_wait_seconds summarizes.", keyLabel, nil)

	// Measured in this process (Opts.Semaphores).
	semClientWaitDesc = prometheus.NewDesc("pgcoord_semaphore_client_acquire_wait_seconds",
		"Time admissions in this process took (for Acquire, the whole wait).", keyLabel, nil)
	semClientAdmissionsDesc = prometheus.NewDesc("pgcoord_semaphore_client_admissions_total",
		"Permits granted to this process.", keyLabel, nil)
	semClientRefusalsDesc = prometheus.NewDesc("pgcoord_semaphore_client_refusals_total",
		"Refused attempts of this process, including TryAcquire refusals that wrote nothing.", keyLabel, nil)
)

func init() {
	register(source{
		name: "semaphores",
		descs: []*prometheus.Desc{semLimitDesc, semWeightDesc, semPermitsDesc, semExpiredDesc, semWaitersDesc,
			semOldestWaiterDesc, semDemandDesc, semAdmittedDesc, semRefusedDesc, semWaitDesc, semWaitedDesc,
			semClientWaitDesc, semClientAdmissionsDesc, semClientRefusalsDesc},
		collect: collectSemaphores,
	})
}

func collectSemaphores(ctx context.Context, db pgcoord.DBTX, o *Opts) ([]prometheus.Metric, bool, error) {
	keys, err := semaphore.List(ctx, db, &semaphore.ListOpts{Limit: o.MaxRows})
	if err != nil {
		return nil, false, err
	}
	var ms []prometheus.Metric
	for _, s := range keys {
		var waited float64
		if !s.OldestWaiterSince.IsZero() {
			waited = max(s.DBNow.Sub(s.OldestWaiterSince).Seconds(), 0)
		}
		ms = append(ms,
			gauge(semLimitDesc, float64(s.Limit), s.Key),
			gauge(semWeightDesc, float64(s.Weight), s.Key),
			gauge(semPermitsDesc, float64(s.Held), s.Key),
			gauge(semExpiredDesc, float64(s.Expired), s.Key),
			gauge(semWaitersDesc, float64(s.Waiters), s.Key),
			gauge(semOldestWaiterDesc, waited, s.Key),
			gauge(semDemandDesc, float64(s.Demand), s.Key),
			counter(semAdmittedDesc, float64(s.Admitted), s.Key),
			counter(semRefusedDesc, float64(s.Refused), s.Key),
			gauge(semWaitedDesc, float64(s.Waited), s.Key))
		if s.Waited > 0 {
			ms = append(ms, gauge(semWaitDesc, s.WaitP50.Seconds(), s.Key, "0.5"),
				gauge(semWaitDesc, s.WaitP99.Seconds(), s.Key, "0.99"))
		}
	}
	if m := o.Semaphores; m != nil {
		bounds := semaphore.AcquireBounds()
		for _, k := range m.Snapshot() {
			ms = append(ms,
				counter(semClientAdmissionsDesc, float64(k.Admissions), k.Key),
				counter(semClientRefusalsDesc, float64(k.Refusals), k.Key))
			buckets := make(map[float64]uint64, len(bounds))
			for i, b := range bounds {
				buckets[b.Seconds()] = k.AcquireBuckets[i]
			}
			ms = append(ms, prometheus.MustNewConstHistogram(semClientWaitDesc, uint64(k.Admissions),
				k.AcquireSum.Seconds(), buckets, k.Key))
		}
	}
	return ms, len(keys) == o.MaxRows, nil
}
