// Package doctor checks a pgcoord installation and the database around it, and explains
// each finding: what it means for pgcoord's guarantees and what to do. `pgcoord doctor`
// prints its report, and the operator dashboard shows it.
package doctor

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/idempotency"
	"github.com/pgcoord/pgcoord/internal/page"
	"github.com/pgcoord/pgcoord/leases"
	"github.com/pgcoord/pgcoord/outbox"
	"github.com/pgcoord/pgcoord/pgcoord"
	"github.com/pgcoord/pgcoord/semaphore"
	"github.com/pgcoord/pgcoord/singleton"
)

// Status grades a finding.
type Status string

// The statuses of a finding, from good to bad.
const (
	OK        Status = "ok"        // as it should be
	Info      Status = "info"      // worth knowing, nothing to fix
	Attention Status = "attention" // something to fix or look at
)

// Finding is the outcome of one check.
type Finding struct {
	// Check names the check: schema, notify, clock, time, transactions, replication,
	// leases, semaphores, jobs, idempotency, outbox, retention.
	Check string `json:"check"`
	// Status grades it.
	Status Status `json:"status"`
	// Summary says what was found, in one line.
	Summary string `json:"summary"`
	// Explain says what it means for pgcoord and what to do; empty when all is well.
	Explain string `json:"explain,omitempty"`
}

// Options tune the checks. The zero value means the defaults.
type Options struct {
	// NotifyTimeout bounds the wait for the LISTEN/NOTIFY round trip. Default 2s.
	NotifyTimeout time.Duration
	// LongTransaction is the age from which an open transaction is reported. Default 5m.
	LongTransaction time.Duration
	// MaxStaleness is the slack after a job's period before it counts as overdue, as in
	// `pgcoord jobs check`. Default 5m.
	MaxStaleness time.Duration
	// OutboxLag is the age from which the oldest pending outbox message of a topic is
	// reported: its relays are down, or cannot keep up, or its key is parked. Default 5m.
	OutboxLag time.Duration
	// ClockTolerance is the clock difference between this host and the database from
	// which it is reported. Default 1s.
	ClockTolerance time.Duration
}

// WithDefaults returns o with every zero field set to its default.
func (o Options) WithDefaults() Options {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&o.NotifyTimeout, 2*time.Second)
	def(&o.LongTransaction, 5*time.Minute)
	def(&o.MaxStaleness, 5*time.Minute)
	def(&o.ClockTolerance, time.Second)
	def(&o.OutboxLag, 5*time.Minute)
	return o
}

// check is one check of the report.
type check struct {
	name string
	run  func(ctx context.Context, pool *pgxpool.Pool, o Options) Finding
	// needsSchema skips the check when pgcoord is not installed (or the schema check failed).
	needsSchema bool
}

var checks = []check{
	{"notify", checkNotify, false},
	{"clock", checkClock, false},
	{"time", checkTime, true},
	{"transactions", checkTransactions, false},
	{"replication", checkReplication, false},
	{"leases", checkLeases, true},
	{"semaphores", checkSemaphores, true},
	{"jobs", checkJobs, true},
	{"idempotency", checkIdempotency, true},
	{"outbox", checkOutbox, true},
	{"retention", checkRetention, true},
}

// Run runs every check against the schema pool's connections resolve to and returns the
// findings, schema first. A check that cannot run (a query fails) is itself a finding
// needing attention; Run returns an error only when ctx ends.
func Run(ctx context.Context, pool *pgxpool.Pool, opts Options) ([]Finding, error) {
	o := opts.WithDefaults()
	schema, installed := checkSchema(ctx, pool)
	findings := []Finding{schema}
	for _, c := range checks {
		if err := ctx.Err(); err != nil {
			return findings, err
		}
		if c.needsSchema && !installed {
			continue
		}
		f := c.run(ctx, pool, o)
		f.Check = c.name
		findings = append(findings, f)
	}
	return findings, ctx.Err()
}

// NeedsAttention reports whether any finding needs attention.
func NeedsAttention(findings []Finding) bool {
	for _, f := range findings {
		if f.Status == Attention {
			return true
		}
	}
	return false
}

// failed is the finding of a check that could not run.
func failed(err error) Finding {
	return Finding{Status: Attention, Summary: "the check failed: " + err.Error()}
}

// checkSchema checks the schema's migrations, and reports whether the schema is current:
// the checks of pgcoord's own state run only then.
func checkSchema(ctx context.Context, pool *pgxpool.Pool) (Finding, bool) {
	f := Finding{Check: "schema"}
	st, err := pgcoord.CheckSchema(ctx, pool)
	switch {
	case err == nil:
		f.Status, f.Summary = OK, fmt.Sprintf("schema %s at version %d, current", st.Schema, st.Current)
	case errors.Is(err, pgcoord.ErrSchemaOutdated) && st.Current == 0:
		f.Status, f.Summary = Attention, fmt.Sprintf("pgcoord is not installed in schema %s", st.Schema)
		f.Explain = "Apply the migrations: pgcoord migrate up (or pgcoord migrate sql for your own tool), " +
			"or point --schema at the schema pgcoord is installed in."
	case errors.Is(err, pgcoord.ErrSchemaOutdated):
		f.Status = Attention
		f.Summary = fmt.Sprintf("schema %s at version %d of %d: %d migration(s) pending", st.Schema, st.Current, st.Latest, len(st.Pending()))
		f.Explain = "This build of pgcoord needs the pending migrations: pgcoord migrate up."
	default:
		f = failed(err)
		f.Check = "schema"
		f.Explain = "Is pgcoord installed in the schema the connection resolves to? Point --schema (or search_path) at it."
	}
	return f, err == nil
}

// checkNotify sends a notification from one connection to another and waits for it.
func checkNotify(ctx context.Context, pool *pgxpool.Pool, o Options) Finding {
	listener, err := pool.Acquire(ctx)
	if err != nil {
		return failed(err)
	}
	// The connection ends its LISTEN by being closed, never returned to the pool listening.
	defer func() { _ = listener.Conn().Close(context.WithoutCancel(ctx)); listener.Release() }()
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
			Explain: "LISTEN/NOTIFY does not work on these connections — typically a transaction-mode pooler " +
				"(PgBouncer) is in the way. Waiting calls (leases.Acquire, semaphore.Acquire) then only poll: " +
				"set NoListen in their options, and run migrations and singleton.RunSession on a direct connection."}
	}
	return Finding{Status: OK, Summary: fmt.Sprintf("LISTEN/NOTIFY round trip in %v", roundMs(time.Since(start)))}
}

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
		return Finding{Status: OK, Summary: fmt.Sprintf("primary with %d standby(s), %d synchronous (synchronous_commit=%s)", standbys, sync, syncCommit)}
	default:
		return Finding{Status: Info,
			Summary: fmt.Sprintf("primary with %d asynchronous standby(s) (synchronous_standby_names=%q, synchronous_commit=%s)", standbys, syncNames, syncCommit),
			Explain: "A claim, fenced write or outbox message acknowledged by this primary may be lost if it fails " +
				"before its standby received it, and the work then runs again (fence tokens stay increasing: they " +
				"are floored by the timeline). Use a synchronous standby, or the SyncCommit option for grants, " +
				"where that matters (docs/failover.md)."}
	}
}

func checkLeases(ctx context.Context, pool *pgxpool.Pool, _ Options) Finding {
	all, _, err := page.Collect(-1, pgcoord.MaxListLimit, func(last *leases.Info, n int) ([]leases.Info, error) {
		opts := leases.ListOpts{Limit: n}
		if last != nil {
			opts.After = last.Name
		}
		return leases.List(ctx, pool, &opts)
	})
	if err != nil {
		return failed(err)
	}
	held, expired := 0, 0
	var late []string
	for _, l := range all {
		switch {
		case l.Held():
			held++
		case l.Holder != "": // expired, never released nor taken since
			expired++
		}
		if !l.LastNearMissAt.IsZero() && l.DBNow.Sub(l.LastNearMissAt) < nearMissWindow {
			late = append(late, fmt.Sprintf("%s (latest %s ago)", l.Name, l.DBNow.Sub(l.LastNearMissAt).Round(time.Second)))
		}
	}
	summary := fmt.Sprintf("%d lease(s) held, %d expired without release", held, expired)
	if len(late) == 0 {
		return Finding{Status: OK, Summary: summary}
	}
	return Finding{Status: Attention,
		Summary: fmt.Sprintf("%s; %d renewed with less than a quarter of the TTL left in the last hour: %s", summary, len(late), list(late)),
		Explain: "A near miss: a holder renewed just before losing its lease, by the database clock. The holder paused " +
			"(GC, CPU starvation, a stopped process) or the database answered slowly; a little later and a second holder " +
			"would have run beside it, stopped only by fencing. Raise the TTL (Do renews every third of it), or find the " +
			"pause. Counts per lease: pgcoord leases show NAME."}
}

// nearMissWindow is how recent a lease's latest near miss must be for the leases check to
// call for attention.
const nearMissWindow = time.Hour

func checkSemaphores(ctx context.Context, pool *pgxpool.Pool, _ Options) Finding {
	all, _, err := page.Collect(-1, pgcoord.MaxListLimit, func(last *semaphore.KeyStatus, n int) ([]semaphore.KeyStatus, error) {
		opts := semaphore.ListOpts{Limit: n}
		if last != nil {
			opts.After = last.Key
		}
		return semaphore.List(ctx, pool, &opts)
	})
	if err != nil {
		return failed(err)
	}
	keys := len(all)
	var bad []string
	for _, k := range all {
		switch {
		case k.OverLimit():
			bad = append(bad, k.Key+" (over its limit)")
		case k.Expired > 0:
			bad = append(bad, fmt.Sprintf("%s (%d leaked permit(s))", k.Key, k.Expired))
		}
	}
	if len(bad) == 0 {
		return Finding{Status: OK, Summary: fmt.Sprintf("%d semaphore key(s), none over its limit or leaking", keys)}
	}
	return Finding{Status: Attention, Summary: fmt.Sprintf("%d of %d semaphore key(s) need attention: %s", len(bad), keys, list(bad)),
		Explain: "Details and the meaning of each problem: pgcoord semaphores verify."}
}

func checkJobs(ctx context.Context, pool *pgxpool.Pool, o Options) Finding {
	all, _, err := page.Collect(-1, pgcoord.MaxListLimit, func(last *singleton.JobStatus, n int) ([]singleton.JobStatus, error) {
		opts := singleton.ListJobsOpts{Limit: n}
		if last != nil {
			opts.After = last.Name
		}
		return singleton.ListJobs(ctx, pool, &opts)
	})
	if err != nil {
		return failed(err)
	}
	jobs := len(all)
	var bad []string
	for _, j := range all {
		if j.Overdue(o.MaxStaleness) {
			bad = append(bad, j.Name)
		}
	}
	if len(bad) == 0 {
		return Finding{Status: OK, Summary: fmt.Sprintf("%d cron job(s), none overdue or failing", jobs)}
	}
	return Finding{Status: Attention, Summary: fmt.Sprintf("%d of %d cron job(s) overdue or failing: %s", len(bad), jobs, list(bad)),
		Explain: "A job that stopped running is a failure too. Details: pgcoord jobs check."}
}

// checkIdempotency reports idempotency keys left in flight by an attempt that died.
func checkIdempotency(ctx context.Context, pool *pgxpool.Pool, _ Options) Finding {
	all, _, err := page.Collect(-1, pgcoord.MaxListLimit, func(last *idempotency.KeyInfo, n int) ([]idempotency.KeyInfo, error) {
		opts := idempotency.ListOpts{Stuck: true, Limit: n}
		if last != nil {
			opts.AfterScope, opts.AfterKey = last.Scope, last.Key
		}
		return idempotency.List(ctx, pool, &opts)
	})
	if err != nil {
		return failed(err)
	}
	var stuck []string
	for _, k := range all {
		stuck = append(stuck, fmt.Sprintf("%s/%s (%d attempt(s), recovery point %q)", k.Scope, k.Key, k.Attempts, k.RecoveryPoint))
	}
	if len(stuck) == 0 {
		return Finding{Status: OK, Summary: "no idempotency key left in flight by a dead attempt"}
	}
	return Finding{Status: Attention, Summary: fmt.Sprintf("%d idempotency key(s) stuck in flight: %s", len(stuck), list(stuck)),
		Explain: "Their attempts died after recording a recovery point, and no client has retried since: the " +
			"operation may be half done. The next retry with the key resumes it at once; " +
			"pgcoord idempotency show SCOPE KEY shows where it stopped."}
}

// checkOutbox reports dead messages and topics whose oldest pending message is older than
// o.OutboxLag.
func checkOutbox(ctx context.Context, pool *pgxpool.Pool, o Options) Finding {
	topics, err := outbox.Stats(ctx, pool, nil)
	if err != nil {
		return failed(err)
	}
	var pending, dead int64
	var bad []string
	for _, t := range topics {
		pending += t.Pending
		dead += t.Dead
		if t.Dead > 0 {
			bad = append(bad, fmt.Sprintf("%s (%d dead)", t.Topic, t.Dead))
		}
		if age := t.OldestPendingAge(); t.Pending > 0 && age > o.OutboxLag {
			bad = append(bad, fmt.Sprintf("%s (oldest pending %v old, %d attempt(s) at most)", t.Topic, age.Round(time.Second), t.MaxAttempts))
		}
	}
	if len(bad) == 0 {
		return Finding{Status: OK, Summary: fmt.Sprintf("%d pending outbox message(s), none dead or older than %v", pending, o.OutboxLag)}
	}
	return Finding{Status: Attention, Summary: fmt.Sprintf("outbox: %d pending, %d dead: %s", pending, dead, list(bad)),
		Explain: "A dead message failed its relay's MaxAttempts deliveries: fix the cause, then pgcoord outbox retry. " +
			"An old pending message means no relay runs for its topic, the relays cannot keep up, or its key waits " +
			"behind a failing message (pgcoord outbox list shows its attempts and last error)."}
}

// retentionTimeout bounds the count of the retention check.
const retentionTimeout = 3 * time.Second

// checkRetention counts the rows `pgcoord gc` would collect at its default retention, and
// suggests running it when they are many.
func checkRetention(ctx context.Context, pool *pgxpool.Pool, _ Options) Finding {
	var res pgcoord.GCResult
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, fmt.Sprintf("SET LOCAL statement_timeout = %d", retentionTimeout.Milliseconds())); err != nil {
			return err
		}
		var err error
		res, err = pgcoord.GC(ctx, tx, &pgcoord.GCOpts{DryRun: true})
		return err
	})
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &pgErr) && pgErr.Code == "57014" && ctx.Err() == nil:
		return Finding{Status: Info, Summary: fmt.Sprintf("counting the rows pgcoord gc would collect took longer than %v", retentionTimeout),
			Explain: "The tables are large. pgcoord gc --dry-run counts them; run pgcoord gc regularly (a daily cron job)."}
	case err != nil:
		return failed(err)
	}
	retention := fmt.Sprintf("%dd", pgcoord.DefaultGCRetention/(24*time.Hour))
	var many []string
	for _, k := range res.Kinds {
		if k.Removed >= manyCollectible {
			many = append(many, fmt.Sprintf("%s %d", k.Kind, k.Removed))
		}
	}
	if len(many) == 0 {
		return Finding{Status: OK, Summary: fmt.Sprintf("%d row(s) for pgcoord gc to collect (retention %s)", res.Total(), retention)}
	}
	return Finding{Status: Info,
		Summary: fmt.Sprintf("%d row(s) for pgcoord gc to collect (retention %s): %s", res.Total(), retention, strings.Join(many, ", ")),
		Explain: "Free leases, idle fence registers, expired permits, old job runs, expired dedupe claims and " +
			"idempotency keys, delivered messages and inbox records accumulate until collected: run pgcoord gc " +
			"regularly (a daily cron job; --dry-run counts first). Collection never lets a stale fence token through."}
}

// manyCollectible is the count of one kind from which the retention check suggests gc.
const manyCollectible = 10000

func list(items []string) string {
	if len(items) > 5 {
		return strings.Join(items[:5], ", ") + fmt.Sprintf(" and %d more", len(items)-5)
	}
	return strings.Join(items, ", ")
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
