// Package singleton runs a job on one replica of many: cron that stays single when an app
// is scaled from one pod to three.
//
// Three tools, from the simplest:
//
//   - RunOnce: every replica calls it when its own timer fires; the one that gets the
//     job's transaction-level advisory lock (pg_try_advisory_xact_lock, on a secret key,
//     see below) runs fn inside
//     that transaction, the others return at once. The lock ends with the transaction, or
//     with the connection if the replica dies. Works behind PgBouncer in transaction mode.
//   - RunSession: the same with a session-level lock on a dedicated connection and no open
//     transaction while fn runs, for long jobs (an open transaction holds back VACUUM).
//     Needs a direct connection; it detects a pooler and refuses (pgcoord.ErrPooler).
//   - Schedule (built on RunTick, built on ClaimTick/HeartbeatTick/FinishTick): a per-tick
//     ledger. Each schedule slot (a "tick", date_bin(Every, database now, Origin)) is
//     claimed once in pgcoord_job_runs, whatever the replicas' timers and clocks say; a
//     running tick is a lease with a fence token, heartbeated, taken over when its runner
//     dies; every outcome is recorded, so a job that stopped running can be detected
//     (JobStatus.Overdue, ListJobs).
//
// A weekly report, on every replica:
//
//	err := singleton.Schedule(ctx, pool, singleton.Job{Name: "weekly-report", Every: 7 * 24 * time.Hour,
//		Origin: time.Date(2024, 1, 1, 9, 0, 0, 0, paris)}, // Mondays 09:00
//		func(ctx context.Context, run singleton.Run) error {
//			campaign := run.ScheduledFor.Format("2006-01-02")
//			for _, u := range users {
//				// The unit of work is idempotent: a second run of the tick sends nothing.
//				tag, err := pool.Exec(ctx, `INSERT INTO email_sends (user_id, campaign_id)
//					VALUES ($1, $2) ON CONFLICT DO NOTHING`, u.ID, campaign)
//				if err != nil {
//					return err // recorded in the ledger; the next tick runs as scheduled
//				}
//				if tag.RowsAffected() == 1 {
//					send(ctx, u, campaign)
//				}
//			}
//			return nil
//		}, nil)
//
// Advisory locks are database-wide and need no privilege, and pg_locks shows every held
// key to every login, so a login without pgcoord's grants can neither compute a job's key
// nor stall the job by holding a key it saw: the key is 64 bits of sha256(secret, job,
// generation) (the SQL function pgcoord_singleton_key), where the secret is the install's
// row of pgcoord_secret (created by the migration 00010_no_stranger_locks.sql; grant
// SELECT on it to pgcoord's roles only, rotate it with UPDATE pgcoord_secret SET secret =
// ...) and the generation is the job's row of pgcoord_singletons, which moves to a new,
// never used value at the end of every RunSession (at its unlock) and whenever a key is
// found squatted; RunOnce runs keep it (migration 00024: a run writes no row version). A
// RunOnce holds its key and, locked FOR UPDATE, its job's row until its transaction ends.
// A replica gets the job only if, holding the key, it finds under the row's lock that the
// generation is still the one it locked and no live RunSession holds the job; a replica
// that finds the key held and the row locked gives up (a run is under way); if the key is
// held by anyone else — a login squatting on a key it saw in pg_locks during an earlier
// run — the job moves to a new generation and the replica tries its key. RunOnce and
// RunSession of one job exclude each other, and two applications (or schemas) never
// collide. Plain SQL callers use pgcoord_singleton_try and pgcoord_singleton_release;
// LockName is deprecated. The ledger is made of SQL functions (pgcoord_job_claim,
// _heartbeat, _finish; see the migration 00003_jobs.sql) that plain SQL callers can use
// too.
//
// # Guarantees
//
//   - RunOnce and RunSession: while one replica runs fn, no other replica of the same
//     database and schema runs fn for the same job name — with the semantics of a
//     Postgres advisory lock: it is held until COMMIT/ROLLBACK (RunOnce) or the unlock
//     (RunSession), and released by the server when the connection is closed or
//     terminated. A replica that does not get the lock does not wait (except, on a job's
//     very first run, at most 10ms for a concurrent first run's row).
//   - A login without pgcoord's grants cannot make RunOnce or RunSession answer "not
//     mine" for a job nobody runs, by holding keys computed from the migrations or read
//     from pg_locks (integration_test TestSquattingLoginStallsNoPrimitive). A role that can
//     read pgcoord_secret can compute keys (generations come from a sequence): only roles
//     that may write it keep SELECT on it (migration 00010 revokes it from the others).
//   - RunSession holds no transaction open while fn runs, and refuses to run behind a
//     pooler that would make a session lock meaningless (unless SessionOpts.AllowPooler).
//   - The ledger: each tick of a job is claimed by exactly one runner, however many
//     replicas claim at once; it is claimed again only when its run's lease expired (its
//     runner stopped heartbeating), as the next attempt. Fence tokens of a job's runs
//     strictly increase, so the writes of a runner that was taken over can be fenced
//     (package fenced, resource "job:"+name), also across a failover (docs/failover.md).
//   - Only a primary runs jobs: on a standby, claims, RunOnce and RunSession fail with
//     pgcoord.ErrReadOnly (an advisory lock taken on a standby would exclude nobody).
//   - Ticks and leases are judged by the database clock alone (pgcoord_now(), see the
//     migration 00001_foundation.sql), so replicas whose clocks disagree still agree on
//     ticks; no option or SQL argument lets a caller choose the time. Schedule also times
//     its claims by the database clock.
//   - Heartbeats, finishes and takeovers are scoped to one run (job + tick + token): a
//     runner that was taken over or replaced cannot extend or finish its successor's run
//     (ErrLost).
//   - Every run's outcome, and every skipped tick, is a row of pgcoord_job_runs; the job's
//     last start, success, failure and failure count are in pgcoord_jobs.
//
// # Failure modes
//
//   - Exactly once is impossible: a runner can do the work and die before recording it,
//     and its tick is then taken over and run again; a paused runner (GC, SIGSTOP, a VM
//     migration) wakes up after being taken over and keeps writing until it next looks at
//     its context. The unit of work must be idempotent whatever this package does — a
//     UNIQUE constraint with INSERT ... ON CONFLICT DO NOTHING (email_sends(user_id,
//     campaign_id)), a dedupe claim (package dedupe), an idempotency key sent to the
//     payment provider — or fenced with Run.Token. A lock or a ledger only makes
//     duplicates rare.
//   - A RunSession holder is recognized by its backend pid and key (pgcoord_singletons):
//     a holder that died leaves them behind until the next replica finds its pid no longer
//     holds the key. A login whose new session got that pid by chance and squats on that
//     very key would be taken for the holder until it disconnects.
//   - A RunOnce that runs locks its job's row and writes it at most once a minute (its
//     used_at), and rows of jobs not run for the gc retention are collected (pgcoord gc,
//     kind singletons). A squatter makes the next run move the job to a new generation:
//     one row write, and one more try of the lock, per squatted key.
//   - An advisory lock cannot stop a write to a system outside Postgres made after the
//     lock's connection was lost: RunSession cancels fn's context when its watchdog finds
//     the connection dead (within SessionOpts.CheckEvery), but fn stops only when it looks.
//   - A job that runs zero times is a failure too: every replica down at a boundary, a
//     schedule nobody deployed, a job that keeps failing. Nothing here raises an alarm by
//     itself; probe JobStatus.Overdue (ListJobs) from your monitoring.
//   - A tick whose runner dies is taken over only while its slot is current (claims are
//     always for the current slot). Keep Job.TTL well below Every — TTL plus Delay plus
//     the run's duration must fit in the slot — or such a tick is lost: its row stays
//     "running" with an expired lease, and the job's next success comes a slot later.
//     With OverlapForbid, the dead run's lease, until it expires, also makes the next tick
//     be skipped.
//   - OverlapForbid skips (for good) a tick that comes while an earlier run is still
//     running; OverlapReplace cancels the earlier run's function at its next heartbeat;
//     OverlapAllow lets runs of different ticks run at once.
//   - Replicas must agree on the schedule. Each claim records the claimer's Every, Origin
//     and Overlap; during a rolling update that changes them, old and new replicas flip
//     the schedule back and forth and may run two ticks close together. Change a schedule
//     by renaming the job, or accept one odd tick.
//   - Rolling updates: old and new replicas overlap for a few seconds; the ledger (or the
//     lock) keeps each tick single. A boundary that passes while no replica runs Schedule
//     is missed, unless the next replica to start sets ScheduleOpts.CatchUp
//     (JobStatus.MissedTicks counts such gaps).
//   - Each replica's timer: Schedule wakes ScheduleOpts.Delay after each boundary by its
//     estimate of the database clock, measured over a round trip; an estimate off by more
//     than Delay makes a claim reach the database early, and Schedule measures again and
//     retries within the slot. A replica busy past the next boundary leaves that tick to
//     the others.
//   - Behind PgBouncer in transaction mode, use RunOnce or the ledger (RunTick,
//     Schedule), which keep no session state; RunSession returns an error wrapping pgcoord.ErrPooler. A session-mode
//     pooler cannot be told from a transaction-mode one (both send their own cancel key):
//     set SessionOpts.AllowPooler only if you know it is in session mode.
//   - RunOnce holds a transaction open, and RunSession a connection, for as long as fn
//     runs; RunTick and Schedule hold a connection only per statement.
//   - With asynchronous replication, a claim committed on a primary that fails before the
//     standby receives it is lost: the tick can be claimed and run again (with a higher
//     token) on the promoted standby. Use a synchronous standby, for every commit or for
//     claims only (Job.SyncCommit); see docs/failover.md.
package singleton
