package metrics

import (
	"context"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgcoord/pgcoord/pgcoord"
	"github.com/pgcoord/pgcoord/singleton"
)

var (
	jobLabel              = []string{"job"}
	jobLastSuccessAgeDesc = prometheus.NewDesc("pgcoord_job_last_success_age_seconds",
		"Time since the job's last successful run finished, by the database clock (absent if it never succeeded).", jobLabel, nil)
	jobOverdueDesc = prometheus.NewDesc("pgcoord_job_overdue",
		"1 if the job has not succeeded within its period plus the allowed staleness (as `pgcoord jobs check`).", jobLabel, nil)
	jobFailingDesc = prometheus.NewDesc("pgcoord_job_failing",
		"1 if the job's last run failed.", jobLabel, nil)
	jobConsecutiveFailuresDesc = prometheus.NewDesc("pgcoord_job_consecutive_failures",
		"Runs that failed since the job's last success.", jobLabel, nil)
	jobMissedTicksDesc = prometheus.NewDesc("pgcoord_job_missed_ticks",
		"Schedule slots since the job's first tick that no replica claimed.", jobLabel, nil)
	jobRunningDesc = prometheus.NewDesc("pgcoord_job_running",
		"Runs of the job whose lease is live.", jobLabel, nil)
)

func init() {
	register(source{
		name: "jobs",
		descs: []*prometheus.Desc{jobLastSuccessAgeDesc, jobOverdueDesc, jobFailingDesc, jobConsecutiveFailuresDesc,
			jobMissedTicksDesc, jobRunningDesc},
		collect: collectJobs,
	})
}

func collectJobs(ctx context.Context, db pgcoord.DBTX, o *Opts) ([]prometheus.Metric, bool, error) {
	jobs, err := singleton.ListJobs(ctx, db, &singleton.ListJobsOpts{Limit: o.MaxRows})
	if err != nil {
		return nil, false, err
	}
	var ms []prometheus.Metric
	for _, j := range jobs {
		overdue, failing := j.Stale(o.MaxStaleness), j.Failing()
		if !j.LastSuccessAt.IsZero() {
			ms = append(ms, gauge(jobLastSuccessAgeDesc, max(j.DBNow.Sub(j.LastSuccessAt).Seconds(), 0), j.Name))
		}
		ms = append(ms,
			gauge(jobOverdueDesc, boolValue(overdue), j.Name),
			gauge(jobFailingDesc, boolValue(failing), j.Name),
			gauge(jobConsecutiveFailuresDesc, float64(j.ConsecutiveFailures), j.Name),
			gauge(jobMissedTicksDesc, float64(j.MissedTicks), j.Name),
			gauge(jobRunningDesc, float64(j.Running), j.Name))
	}
	return ms, len(jobs) == o.MaxRows, nil
}
