package doctor

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// checkNotify sends a notification from one connection to another and waits for it.
func checkNotify(ctx context.Context, pool *pgxpool.Pool, o Options) Finding {
	listener, err := pool.Acquire(ctx)
	if err != nil {
		return failed(err)
	}
	// The connection ends its LISTEN by being closed, never returned to the pool listening.
	defer func() { _ = listener.Conn().Close(context.WithoutCancel(ctx)); listener.Release() }()
	// Through a transaction-mode pooler the LISTEN would stay on a server connection that
	// other clients share, and no notification would come back: say so without trying.
	var pid uint32
	if err := listener.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		return failed(err)
	}
	if given := listener.Conn().PgConn().PID(); pid != given {
		return Finding{Status: Attention,
			Summary: fmt.Sprintf("a pooler stands between (server process %d, connection given %d): notifications are not delivered", pid, given),
			Explain: poolerAdvice}
	}
	channel := "pgcoord_doctor_" + fmt.Sprint(time.Now().UnixNano())
	if _, err := listener.Exec(ctx, "LISTEN "+channel); err != nil {
		return failed(err)
	}
	start := time.Now()
	if _, err := pool.Exec(ctx, "SELECT pg_notify($1, 'probe')", channel); err != nil {
		return failed(err)
	}
	wctx, cancel := context.WithTimeout(ctx, o.NotifyTimeout)
	defer cancel()
	if _, err := listener.Conn().WaitForNotification(wctx); err != nil {
		if ctx.Err() != nil {
			return failed(ctx.Err())
		}
		return Finding{Status: Attention,
			Summary: fmt.Sprintf("a notification did not arrive within %v", o.NotifyTimeout),
			Explain: "LISTEN/NOTIFY does not work on these connections. " + poolerAdvice}
	}
	return Finding{Status: OK, Summary: fmt.Sprintf("LISTEN/NOTIFY round trip in %v", roundMs(time.Since(start)))}
}

// poolerAdvice explains what a transaction-mode pooler in the way means.
const poolerAdvice = "Typically a transaction-mode pooler (PgBouncer) is in the way. Waiting calls " +
	"(leases.Acquire, semaphore.Acquire, outbox relays) find it and only poll, every PollInterval " +
	"(NoListen skips their check); run migrations and singleton.RunSession on a direct connection."

// checkClock compares this host's clock with the database's.
func checkClock(ctx context.Context, pool *pgxpool.Pool, o Options) Finding {
	var db time.Time
	t0 := time.Now()
	if err := pool.QueryRow(ctx, "SELECT clock_timestamp()").Scan(&db); err != nil {
		return failed(err)
	}
	rtt := time.Since(t0)
	offset := db.Sub(t0.Add(rtt / 2))
	summary := fmt.Sprintf("the database clock is %v %s this host's (±%v)", roundMs(abs(offset)), aheadBehind(offset), roundMs(rtt/2))
	if abs(offset) <= o.ClockTolerance {
		return Finding{Status: OK, Summary: summary}
	}
	return Finding{Status: Info, Summary: summary,
		Explain: "pgcoord judges every expiry and schedule by the database clock, so this does not affect its " +
			"guarantees; but one of the two clocks is probably not synchronized (NTP), and logs of the two disagree."}
}

// checkTime reports whether pgcoord reads the database's own clock: pgcoord_now() and
// pgcoord_clock(), through which pgcoord's SQL reads every instant, must be now() and
// clock_timestamp(). Only a test harness replaces them (internal/pgtest's Clock).
func checkTime(ctx context.Context, pool *pgxpool.Pool, _ Options) Finding {
	var now, clock string
	err := pool.QueryRow(ctx, `
		SELECT coalesce((SELECT prosrc FROM pg_proc WHERE oid = to_regprocedure('pgcoord_now()')), ''),
		       coalesce((SELECT prosrc FROM pg_proc WHERE oid = to_regprocedure('pgcoord_clock()')), '')`).Scan(&now, &clock)
	if err != nil {
		return failed(err)
	}
	var bad []string
	if !isBody(now, "now()") {
		bad = append(bad, fmt.Sprintf("pgcoord_now() is %q, not SELECT now()", strings.TrimSpace(now)))
	}
	if !isBody(clock, "clock_timestamp()") {
		bad = append(bad, fmt.Sprintf("pgcoord_clock() is %q, not SELECT clock_timestamp()", strings.TrimSpace(clock)))
	}
	if len(bad) == 0 {
		return Finding{Status: OK, Summary: "pgcoord reads the database's clock (pgcoord_now, pgcoord_clock)"}
	}
	return Finding{Status: Attention,
		Summary: "time is not the database's: " + strings.Join(bad, "; "),
		Explain: "pgcoord judges every expiry, TTL and schedule through these two functions. Replaced, they let " +
			"leases, permits and job runs be granted while held, outlive their TTL or never expire. Only a test " +
			"harness should replace them. Restore them: CREATE OR REPLACE FUNCTION pgcoord_now() ... AS $$ SELECT now() $$ " +
			"and pgcoord_clock() ... AS $$ SELECT clock_timestamp() $$, exactly as pgcoord migrate sql prints them."}
}

// isBody reports whether a LANGUAGE sql function's source is SELECT fn, ignoring case,
// spaces, a trailing semicolon and a pg_catalog qualification.
func isBody(src, fn string) bool {
	s := strings.ToLower(strings.Join(strings.Fields(src), " "))
	s = strings.TrimSpace(strings.TrimSuffix(s, ";"))
	return s == "select "+fn || s == "select pg_catalog."+fn
}

// checkTransactions reports transactions open longer than o.LongTransaction.
func checkTransactions(ctx context.Context, pool *pgxpool.Pool, o Options) Finding {
	rows, err := pool.Query(ctx, `
		SELECT pid, coalesce(usename, ''), coalesce(application_name, ''), coalesce(state, ''),
		       extract(epoch FROM clock_timestamp() - xact_start)::float8
		FROM pg_stat_activity
		WHERE xact_start < clock_timestamp() - make_interval(secs => $1) AND pid <> pg_backend_pid()
		UNION ALL
		SELECT NULL, owner, 'prepared transaction ' || gid, 'prepared',
		       extract(epoch FROM clock_timestamp() - prepared)::float8
		FROM pg_prepared_xacts WHERE prepared < clock_timestamp() - make_interval(secs => $1)
		ORDER BY 5 DESC`, o.LongTransaction.Seconds())
	if err != nil {
		return failed(err)
	}
	defer rows.Close()
	var found []string
	for rows.Next() {
		var pid *int32
		var user, app, state string
		var secs float64
		if err := rows.Scan(&pid, &user, &app, &state, &secs); err != nil {
			return failed(err)
		}
		who := fmt.Sprintf("%s (%s, %s)", app, user, state)
		if pid != nil {
			who = fmt.Sprintf("pid %d %s", *pid, who)
		}
		found = append(found, fmt.Sprintf("%s open for %v", who, (time.Duration(secs)*time.Second).Round(time.Second)))
	}
	if err := rows.Err(); err != nil {
		return failed(err)
	}
	if len(found) == 0 {
		return Finding{Status: OK, Summary: fmt.Sprintf("no transaction open longer than %v", o.LongTransaction)}
	}
	shown := found
	if len(shown) > 5 {
		shown = append(shown[:5:5], fmt.Sprintf("and %d more", len(found)-5))
	}
	return Finding{Status: Attention,
		Summary: fmt.Sprintf("%d transaction(s) open longer than %v: %s", len(found), o.LongTransaction, strings.Join(shown, "; ")),
		Explain: "A long transaction holds back VACUUM for the whole database: pgcoord's lease, permit and ledger rows " +
			"(and your tables) bloat, and a transaction holding a lease's or key's row lock makes others wait. " +
			"Run long jobs with singleton.RunSession or the tick ledger rather than inside one transaction."}
}

// checkReplication reports whether this server is a primary and how its standbys
// replicate, and what that means for fencing.
func checkReplication(ctx context.Context, pool *pgxpool.Pool, _ Options) Finding {
	var standby bool
	var standbys, sync int
	var syncCommit, syncNames string
	err := pool.QueryRow(ctx, `SELECT pg_is_in_recovery(),
			(SELECT count(*) FROM pg_stat_replication),
			(SELECT count(*) FROM pg_stat_replication WHERE sync_state IN ('sync', 'quorum')),
			current_setting('synchronous_commit'), current_setting('synchronous_standby_names')`).
		Scan(&standby, &standbys, &sync, &syncCommit, &syncNames)
	if err != nil {
		return failed(err)
	}
	switch {
	case standby:
		return Finding{Status: Attention, Summary: "this server is a standby (in recovery): it is read-only",
			Explain: "Every grant, claim and fenced write needs the primary. Point pgcoord at the primary " +
				"(for instance with target_session_attrs=read-write in the connection string)."}
	case standbys == 0:
		return Finding{Status: Info, Summary: "primary with no streaming standby",
			Explain: "A restore from a backup brings leases, claims and fence tokens back to the backup's time: " +
				"point-in-time recovery starts a new timeline and keeps tokens increasing, a plain snapshot does " +
				"not. See docs/failover.md."}
	case sync > 0 && syncCommit != "off" && syncCommit != "local":
		return Finding{Status: OK,
			Summary: fmt.Sprintf("primary with %d standby(s), %d synchronous (synchronous_commit=%s): acknowledged grants survive a failover to a synchronous standby",
				standbys, sync, syncCommit),
			Explain: "Every commit waits for a synchronous standby, so a grant, claim, fenced write or outbox message " +
				"acknowledged here is on it. That holds through a failover only if the failover promotes a " +
				"synchronous standby (Patroni: synchronous_mode). Fence tokens stay increasing across any promotion. " +
				"See docs/ha.md."}
	case sync > 0:
		return Finding{Status: Info,
			Summary: fmt.Sprintf("primary with %d standby(s), %d synchronous, but synchronous_commit=%s: only grants made with SyncCommit survive a failover",
				standbys, sync, syncCommit),
			Explain: "Ordinary commits do not wait for the synchronous standby. Grants, claims and ticks made with the " +
				"SyncCommit option do, and survive a failover to it; others may be lost with the primary (fence tokens " +
				"stay increasing: they are floored by the timeline). See docs/failover.md."}
	default:
		return Finding{Status: Info,
			Summary: fmt.Sprintf("primary with %d asynchronous standby(s) (synchronous_standby_names=%q, synchronous_commit=%s)", standbys, syncNames, syncCommit),
			Explain: "A claim, fenced write or outbox message acknowledged by this primary may be lost if it fails " +
				"before its standby received it, and the work then runs again (fence tokens stay increasing: they " +
				"are floored by the timeline). Use a synchronous standby, or the SyncCommit option for grants, " +
				"where that matters (docs/failover.md)."}
	}
}

func roundMs(d time.Duration) time.Duration {
	if d < 10*time.Millisecond {
		return d.Round(10 * time.Microsecond)
	}
	return d.Round(time.Millisecond)
}

func abs(d time.Duration) time.Duration {
	if d < 0 {
		return -d
	}
	return d
}

func aheadBehind(offset time.Duration) string {
	if offset < 0 {
		return "behind"
	}
	return "ahead of"
}

// checkAdvisory reports the advisory locks of this database held, or waited for, by roles
// that are not pgcoord's: roles that neither own one of pgcoord's tables in this schema nor
// have a privilege on one. Since schema version 10 no primitive depends on an advisory key
// such a role can compute or reuse, so this is information (who squats, with which pids),
// not a failure.
func checkAdvisory(ctx context.Context, pool *pgxpool.Pool, _ Options) Finding {
	rows, err := pool.Query(ctx, `
		WITH t AS (
			SELECT c.oid, c.relowner FROM pg_class c
			 WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind = 'r' AND c.relname LIKE 'pgcoord\_%'
		)
		SELECT coalesce(a.usename::text, '?'), array_agg(DISTINCT l.pid ORDER BY l.pid)::int[], count(*)
		  FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
		 WHERE l.locktype = 'advisory' AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
		   AND NOT EXISTS (SELECT FROM t WHERE t.relowner = a.usesysid
		                      OR has_table_privilege(a.usesysid, t.oid, 'SELECT, INSERT, UPDATE, DELETE, TRUNCATE'))
		 GROUP BY 1 ORDER BY 3 DESC, 1`)
	if err != nil {
		return failed(err)
	}
	defer rows.Close()
	var found []string
	total := int64(0)
	for rows.Next() {
		var role string
		var pids []int32
		var n int64
		if err := rows.Scan(&role, &pids, &n); err != nil {
			return failed(err)
		}
		total += n
		ps := make([]string, len(pids))
		for i, p := range pids {
			ps[i] = fmt.Sprint(p)
		}
		found = append(found, fmt.Sprintf("%d by role %s (pid %s)", n, role, strings.Join(ps, ", ")))
	}
	if err := rows.Err(); err != nil {
		return failed(err)
	}
	if len(found) == 0 {
		return Finding{Status: OK, Summary: "no advisory lock held by a role without pgcoord's grants"}
	}
	shown := found
	if len(shown) > 5 {
		shown = append(shown[:5:5], fmt.Sprintf("and %d more role(s)", len(found)-5))
	}
	return Finding{Status: Info,
		Summary: fmt.Sprintf("%d advisory lock(s) held or awaited by roles without pgcoord's grants: %s", total, strings.Join(shown, "; ")),
		Explain: "Advisory locks are database-wide and need no privilege. pgcoord's outbox and semaphores take no " +
			"advisory lock, and a singleton's key is derived from a secret only pgcoord's roles can read and changes " +
			"with every run, so these locks cannot stall pgcoord; they may be another application's own. If a role " +
			"should not be taking them, look at its sessions (pg_stat_activity) and end them with pg_terminate_backend."}
}
