// Package gocronpg makes go-co-op/gocron v2 schedulers on many replicas run each job once,
// coordinated by the Postgres database the application already uses. It offers the two
// hooks gocron has for distributed instances:
//
//   - Locker (gocron.WithDistributedLocker, or per job gocron.WithDistributedJobLocker):
//     every replica's scheduler fires the job on its own timer and asks the Locker first;
//     the Locker claims the job's current tick in package singleton's tick ledger
//     (pgcoord_job_runs), so exactly one replica runs each tick and the others skip it. The
//     claimed run is a lease, heartbeated while the job runs, and its outcome is recorded:
//     `pgcoord jobs list` shows every job's last run, and singleton.JobStatus.Overdue tells
//     when a job stopped running.
//   - Elector (gocron.WithDistributedElector): only the replica that leads a
//     leases.Elector runs jobs at all; the others skip every job while they follow.
//
// With the Locker, all replicas schedule, and the work of one job is spread over them;
// with the Elector, one replica does all the work until it dies or resigns, and another
// takes over within the lease's TTL (at once when it resigns).
//
//	locker, err := gocronpg.NewLocker(pool, &gocronpg.LockerConfig{Window: time.Minute})
//	s, err := gocron.NewScheduler(gocron.WithDistributedLocker(locker))
//	_, err = s.NewJob(gocron.CronJob("0 * * * * *", true), gocron.NewTask(sendReports),
//		gocron.WithName("send-reports"))
//
// How the Locker handles time splay. gocron fires a job by each replica's own clock, so the
// replicas' calls for one tick arrive spread over a few milliseconds — more when clocks
// disagree or a replica is busy. The Locker maps each call to a slot of the database
// clock, date_bin(Window, now, Origin), and lets one call per slot through. By default the
// slots are centred on the multiples of Window (Origin is the Unix epoch shifted by half a
// Window), so a job scheduled at multiples of Window — a cron schedule on whole seconds,
// minutes or hours, or a gocron.DurationJob started WithStartAt at a multiple of its
// interval — finds each of its ticks in the middle of a slot, and tolerates up to
// Window/2 of splay either way. Choose Window equal to the job's interval (or a divisor of
// every interval of the jobs sharing the Locker; use one Locker per interval with
// gocron.WithDistributedJobLocker otherwise).
//
// # Guarantees
//
//   - Locker: for each job name and each slot of the database clock, at most one Lock call
//     succeeds across all replicas sharing the database and schema, however many call at
//     once (the ledger serializes claims of one job). While a run is held, its lease is
//     heartbeated every TTL/3; a run of a replica that dies stops blocking the job after
//     TTL.
//   - Locker: a tick that comes while the job's previous run is still running (on any
//     replica, with a live lease) is skipped on every replica and recorded as skipped
//     (OverlapForbid).
//   - Locker: each successful run is recorded in the ledger as succeeded when gocron
//     unlocks it; Locker.Current gives a running job its run's fence token.
//   - Elector: IsLeader returns nil only while the leases.Elector leads (see
//     leases.Elector.IsLeader): no two replicas' IsLeader return nil at one instant unless
//     one of them is paused or partitioned past its lease.
//
// # Failure modes
//
//   - Splay beyond Window/2 (clocks off by more, a replica stalled, a job scheduled off the
//     multiples of Window) can put two replicas' calls for one tick in adjacent slots: the
//     tick runs twice, and the next slot's calls find their slot taken. Keep clocks in sync
//     (NTP) and schedules aligned; the unit of work must be idempotent anyway.
//   - gocron does not tell a Locker whether the job failed: every run the Locker released
//     is recorded as succeeded. A job that wants failures in the ledger (and in
//     singleton.JobStatus) should use singleton.Schedule or singleton.RunTick instead.
//   - A Lock cannot stop its job. If the run's lease is lost (its heartbeats failed for
//     TTL, or an operator intervened), the Locker logs it and Current reports the run gone,
//     but the job function runs on. Fence its writes with Current's token (package fenced,
//     resource "job:"+name) or make them idempotent.
//   - Exactly once is impossible: a replica can run the job and die before the run is
//     recorded; a tick in which every replica was down is not run (gocron has no catch-up),
//     and shows in singleton.JobStatus.MissedTicks.
//   - A replica that cannot reach the database skips the job (fail closed).
//   - Elector: gocron asks IsLeader only before it starts a job. A job that runs while its
//     replica is deposed overlaps the new leader's first runs: fence the job's writes with
//     the leader's token (Elector.Lease).
package gocronpg
