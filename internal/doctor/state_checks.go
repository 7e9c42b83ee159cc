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
