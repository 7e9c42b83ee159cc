package doctor

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/internal/page"
	"github.com/pgcoord/pgcoord/pgcoord"
	"github.com/pgcoord/pgcoord/schedules"
)

// checkSchedules reports the schedules whose handler no live process has registered: an
// active one (not paused, not ended), whose ticks wait and then are missed, and one with
// runs pending, which wait for the handler. Overdue and failing schedules are the jobs
// check's: every schedule is a job.
func checkSchedules(ctx context.Context, pool *pgxpool.Pool, _ Options) Finding {
	all, _, err := page.Collect(-1, pgcoord.MaxListLimit, func(last *schedules.Info, n int) ([]schedules.Info, error) {
		opts := schedules.ListOpts{Limit: n}
		if last != nil {
			opts.After = last.Name
		}
		return schedules.List(ctx, pool, &opts)
	})
	if err != nil {
		return failed(err)
	}
	var bad []string
	for _, s := range all {
		ended := !s.EndsAt.IsZero() && s.EndsAt.Before(s.DBNow)
		switch {
		case s.HandlerLive:
		case s.Pending > 0:
			bad = append(bad, fmt.Sprintf("%s (handler %q, no live process; %d pending run(s) wait for it)", s.Name, s.Handler, s.Pending))
		case !s.Paused && !ended:
			bad = append(bad, fmt.Sprintf("%s (handler %q, no live process)", s.Name, s.Handler))
		}
	}
	if len(bad) == 0 {
		return Finding{Status: OK, Summary: fmt.Sprintf("%d schedule(s), the handler of each active one run by a live process", len(all))}
	}
	return Finding{Status: Attention,
		Summary: fmt.Sprintf("%d of %d schedule(s) wait for a handler: %s", len(bad), len(all), list(bad)),
		Explain: "No running Scheduler has registered the handler: its ticks are recorded pending and start when a " +
			"process with the handler comes — if still within the schedule's catch-up window, else they are recorded " +
			"missed; triggered and backfilled runs wait however long. Start a Scheduler with the handler " +
			"(schedules.Config.Handlers), correct the schedule's handler name, or pause it (pgcoord schedules get NAME, update, pause)."}
}
