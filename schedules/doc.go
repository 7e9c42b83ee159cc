// Package schedules runs cron expressions in a time zone, stored as rows, each tick once
// across replicas: "weekdays at 09:00 Berlin time", created, changed, paused and deleted at
// runtime from Go, SQL (pgcoord_schedule_*) or the CLI (`pgcoord schedules`).
//
// A schedule names a handler; every replica runs a Scheduler with the handlers it has:
//
//	_, err := schedules.Create(ctx, pool, schedules.Schedule{
//		Name: "weekly-report", Expr: "0 9 * * MON-FRI", Zone: "Europe/Berlin",
//		Handler: "report", Args: json.RawMessage(`{"kind":"weekly"}`),
//	}, nil)
//	...
//	s, err := schedules.New(schedules.Config{Pool: pool, Handlers: map[string]schedules.Handler{
//		"report": func(ctx context.Context, run schedules.Run) error { return send(ctx, run.Tick, run.Args) },
//	}})
//	err = s.Run(ctx) // until ctx ends
//
// A schedule is a job of the ledger of package singleton (kind "cron"): its runs are rows
// of pgcoord_job_runs with fence tokens, heartbeats and recorded outcomes, listed by
// singleton.ListJobs and ListRuns and checked by `pgcoord jobs check` like every job.
//
// # Expressions and time zones
//
// Expressions are parsed by github.com/robfig/cron/v3, the de facto cron parser of Go
// (see internal/cronspec, which says what it accepts and why this parser): five fields,
// an optional leading seconds field, the descriptors @hourly, @daily, @weekly, @monthly
// and @yearly, and "@every <duration>" (whole seconds, elapsed time, zone-free: ticks at
// StartsAt, or the Unix epoch, plus whole multiples). Day of month and day of week follow
// Vixie cron: when both are restricted, a day matching either fires. L, W and # are not
// supported. The zone is an IANA name; the zone database is embedded, so a bare container
// needs none.
//
// Daylight saving: a local time that does not exist (the clocks spring forward over it)
// fires once, at the first instant after the gap; a local time that occurs twice (they fall
// back) fires once, at its first occurrence. So "30 2 * * *" in Europe/Berlin fires at 03:00
// on the day of the spring change, once on the day of the autumn change, and "*/5 * * * *"
// does not fire during the repeated hour's second pass: use "@every 5m" for elapsed time.
//
// # Guarantees
//
//   - Each tick is claimed by at most one replica: the claim advances the schedule's next
//     tick in the database, under the schedule's row lock, and a claim of a tick already
//     advanced writes nothing. A running tick is a lease heartbeated every RunTTL/3; a tick
//     whose runner stopped heartbeating is taken over by another replica (as the next
//     attempt, with a higher fence token) while the tick is within its catch-up window.
//   - Due ticks and the catch-up window are judged by the database clock; no option or SQL
//     argument chooses the time. Replicas wake at each due time (by their estimate of the
//     database clock, measured with every look) and on notifications, not by polling.
//   - A change (Update, Pause, Resume, the SQL functions) applies from the first tick after
//     it: a claim made with the definition read before the change commits nothing, and no
//     tick is claimed while the schedule is paused. Every change writes a row of
//     pgcoord_audit in its own transaction and notifies the Schedulers.
//   - Ticks older than the catch-up window when they are claimed are recorded as "missed"
//     (one row standing for a run of them, with their count); within it, CatchUpLatest runs
//     the newest due tick and records the others "skipped", CatchUpAll runs each in order
//     (the first at once, the others queued "pending", each started when the one before
//     it finished).
//   - Overlap: OverlapSkip records a tick due while a run still runs as "skipped";
//     OverlapBuffer keeps one such tick "pending" until the run finishes; OverlapAllow runs
//     it beside; OverlapReplace marks the earlier run "replaced" (its context is cancelled at
//     its next heartbeat) and runs the new one.
//   - A tick whose handler no live process has registered is recorded "pending", not
//     skipped, and starts when a process with the handler comes (if still within the
//     catch-up window). Triggers (Trigger) and backfills (Backfill) are pending runs too:
//     each tick of a backfill runs once, however often it is repeated or interrupted.
//   - A run longer than the schedule's Deadline has its context cancelled and is recorded
//     as failed. Jitter delays each tick's claim by a fraction of Jitter fixed by the
//     schedule's name and the tick, so every replica agrees.
//
// # Failure modes
//
//   - Exactly once is impossible: a runner can do the work and die before recording it, and
//     its tick is then taken over and run again; a paused runner wakes after its takeover
//     and goes on until it looks at its context. Make the handler's work idempotent, or
//     fence it with Run.Token (resource "job:"+name), as for every singleton job.
//   - The ticks are computed by the Go library (the database cannot evaluate a cron
//     expression in a zone): replicas with different versions of the zone database can
//     disagree about a zone whose rules just changed. The database still runs each tick it
//     is sent at most once, and no tick before the one it holds as next.
//   - A replica whose estimate of the database clock is late claims late (by the error
//     of its estimate, measured over one round trip).
//   - A claim does not wait for a schedule's row that another transaction holds (another
//     process's claim, or a change): it writes nothing, and the next look tries again. A
//     transaction left open after changing a schedule (Pause in the caller's own
//     transaction, say) holds its ticks back until it ends.
//   - A burst of ticks due at the same instant is claimed one statement per look of each
//     process; the later ticks of a large burst start later (docs/benchmarks.md,
//     schedules.lateness: 167 ticks a second over three processes, p50 about 40 ms).
//   - A claim considers at most MaxTicksPerClaim due ticks: with CatchUpLatest the older
//     ones of a schedule further behind are recorded as missed.
//   - Behind PgBouncer in transaction mode, notifications do not arrive: Schedulers then
//     see changes and triggers at their next look (Config.PollInterval), and still wake at
//     each due time.
//   - With asynchronous replication, a claim committed on a primary that fails before the
//     standby receives it can be claimed and run again after the failover (see
//     docs/failover.md).
package schedules
