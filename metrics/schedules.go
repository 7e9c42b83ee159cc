package metrics

import (
	"context"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgcoord/pgcoord/pgcoord"
	"github.com/pgcoord/pgcoord/schedules"
)

// A schedule is also a job (kind "cron"): the jobs source exports its missed ticks,
// staleness, failures and running runs under pgcoord_job_*. This source adds what only a
// schedule has.
var (
	scheduleLabel      = []string{"schedule"}
	schedulePausedDesc = prometheus.NewDesc("pgcoord_schedule_paused",
		"1 while the schedule is paused (no tick runs).", scheduleLabel, nil)
	schedulePendingDesc = prometheus.NewDesc("pgcoord_schedule_pending_runs",
		"Runs of the schedule waiting to start: buffered, queued by catch-up, triggered, backfilled, or waiting for a process with the handler.",
		scheduleLabel, nil)
	scheduleNextTickDesc = prometheus.NewDesc("pgcoord_schedule_next_tick_seconds",
		"Time until the schedule's next tick, by the database clock; negative once the tick is past and still unclaimed. Absent while paused, not yet armed, or ended.",
		scheduleLabel, nil)
	scheduleHandlerLiveDesc = prometheus.NewDesc("pgcoord_schedule_handler_live",
		"1 if a live process (a running Scheduler) registered the handler, for each handler the schedules name.", []string{"handler"}, nil)
)

func init() {
	register(source{
		name:    "schedules",
		descs:   []*prometheus.Desc{schedulePausedDesc, schedulePendingDesc, scheduleNextTickDesc, scheduleHandlerLiveDesc},
		collect: collectSchedules,
	})
}

func collectSchedules(ctx context.Context, db pgcoord.DBTX, o *Opts) ([]prometheus.Metric, bool, error) {
	list, err := schedules.List(ctx, db, &schedules.ListOpts{Limit: o.MaxRows})
	if err != nil {
		return nil, false, err
	}
	var ms []prometheus.Metric
	handlers := map[string]bool{}
	for _, s := range list {
		ms = append(ms,
			gauge(schedulePausedDesc, boolValue(s.Paused), s.Name),
			gauge(schedulePendingDesc, float64(s.Pending), s.Name))
		if !s.Paused && !s.NextTick.IsZero() {
			ms = append(ms, gauge(scheduleNextTickDesc, s.NextTick.Sub(s.DBNow).Seconds(), s.Name))
		}
		handlers[s.Handler] = s.HandlerLive
	}
	for h, live := range handlers {
		ms = append(ms, gauge(scheduleHandlerLiveDesc, boolValue(live), h))
	}
	return ms, len(list) == o.MaxRows, nil
}
