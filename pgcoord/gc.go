package pgcoord

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/pgcoord/pgcoord/internal/base"
	"github.com/pgcoord/pgcoord/internal/dbsqlc"
)

// check makes this package's argument errors ("pgcoord: cause").
var check = base.Check("pgcoord")

// Retention bounds of GC.
const (
	// DefaultGCRetention is GC's retention when GCOpts.OlderThan is zero: 30 days. It bounds
	// storage while staying far longer than any retry, redelivery or paused holder a
	// deployment should expect: an inbox record outlives every redelivery of its message,
	// and a write with a grant more than 30 days old to a resource without a fence register
	// is the only write the retired floor may refuse (see GC). A longer retention keeps more
	// rows and refuses fewer such writes; a shorter one the reverse.
	DefaultGCRetention = 30 * 24 * time.Hour
	// MinGCRetention and MaxGCRetention bound GCOpts.OlderThan.
	MinGCRetention = time.Second
	MaxGCRetention = 36500 * 24 * time.Hour
	// DefaultGCBatch and MaxGCBatch bound GCOpts.Batch: the rows of each kind one statement
	// deletes.
	DefaultGCBatch = 10000
	MaxGCBatch     = 100000
)

// GCKinds are the kinds of rows GC collects, in the order GCResult lists them.
func GCKinds() []string {
	return []string{"leases", "fences", "permits", "semaphores", "job_runs", "dedupe", "idempotency", "outbox", "inbox", "singletons", "outbox_keys", "ratelimit", "schedule_handlers", "partition_members"}
}

// GCOpts are the options of GC. A nil *GCOpts means all defaults.
type GCOpts struct {
	// OlderThan is the retention: rows idle, finished or delivered longer ago than this, by
	// the database clock, are deleted. Default DefaultGCRetention (30 days);
	// MinGCRetention to MaxGCRetention. Dedupe claims and idempotency keys carry their own
	// expiry and are deleted past it.
	OlderThan time.Duration
	// Batch is how many rows of each kind one statement deletes at most. Default
	// DefaultGCBatch (10000); at most MaxGCBatch.
	Batch int
	// DryRun deletes nothing: GC returns how many rows of each kind it would delete now,
	// counted in one statement.
	DryRun bool
	// Progress, if set, is called after each batch with the totals so far (with DryRun,
	// once with the counts).
	Progress func(GCResult)
}

// GCCount is how many rows of one kind GC removed (or, in a dry run, would remove).
type GCCount struct {
	Kind    string // one of GCKinds
	Removed int64
}

// GCResult is the outcome of GC: one count per kind, in the order of GCKinds.
type GCResult struct {
	Kinds []GCCount
}

// Total is the sum of the counts of every kind.
func (r GCResult) Total() int64 {
	var n int64
	for _, k := range r.Kinds {
		n += k.Removed
	}
	return n
}

// Removed is the count of one kind (0 for a kind GC does not report).
func (r GCResult) Removed(kind string) int64 {
	for _, k := range r.Kinds {
		if k.Kind == kind {
			return k.Removed
		}
	}
	return 0
}

// GC collects what pgcoord no longer needs, by the database clock, so that tables of
// per-entity names (a lease per order, a register per resource, a semaphore key per
// tenant) and logs of work done stay bounded. It calls the SQL function pgcoord_gc until
// every kind has fewer than a batch of rows left, and returns the rows removed per kind.
// Pass a pool, so each batch is its own short transaction; pass a pgx.Tx to make the whole
// collection part of it. It runs concurrently with every other call.
//
// What is collected, for a retention R (GCOpts.OlderThan):
//
//   - leases: lease rows free — released, or expired and not renewed — for longer than R;
//   - fences: fence registers not written for longer than R;
//   - permits: semaphore permits expired, and waiters gone, for longer than R;
//   - semaphores: keys with no demand, permit or waiter, not changed for longer than R,
//     whose limit was never set with SetLimit (configured keys are kept);
//   - job_runs: runs finished (or abandoned) longer than R ago, except each job's latest;
//   - dedupe: dedupe claims past their own retention;
//   - idempotency: idempotency keys past their own retention (each leaves a tombstone for
//     R, which refuses a very late retry) and tombstones past theirs;
//   - outbox: messages delivered longer than R ago (dead messages are kept for operators);
//   - inbox: inbox records applied longer than R ago;
//   - singletons: the lock generations of singleton.RunOnce/RunSession jobs not run for
//     longer than R and not held (a job run again starts a new generation);
//   - outbox_keys: the per-key order rows of outbox keys with no pending message, of any
//     age, except those a writer holds (skipped, never waited for);
//   - ratelimit: the rows of rate limit keys at rest (their arrival time is past: they
//     carry no state), of any age, except those a call holds;
//   - schedule_handlers: registrations of schedule handlers (package schedules) that ran
//     out longer than R ago, left by Schedulers that stopped without unregistering;
//   - partition_members: members of partition groups (package partition) whose lease ran
//     out longer than R ago, left in groups no member heartbeats any more.
//
// Job definitions, configured semaphore keys, partition groups, dead messages and the audit log are never
// collected, nor the pending runs of schedules (a run waiting to start has not finished).
//
// Collection never lets a fence token repeat, nor a stale one through: tokens come from
// one schema-wide counter, so a collected name's next grant gets a higher token than any
// before it; a collected lease hands its newest grant to the register of the same name and
// to the retired floor, and a collected register hands its token to the floor, which a
// resource without a register checks against. The floor's one cost: a write with a grant
// older than R, to a resource that has no register (never written, or collected), may be
// refused (fenced.ErrStale) although no newer holder wrote — unless the grant is still the
// newest of a lease row named like the resource (GC keeps a lease row while it is held and
// until it was free for R). Choose R longer than any holder may stay paused.
//
// In a dry run GC counts, in one statement, every row it would collect now, and deletes
// nothing. Bad options return an error wrapping ErrInvalidArgument before any SQL runs.
// When ctx ends or a batch fails, GC returns the totals so far with the error.
func GC(ctx context.Context, db DBTX, opts *GCOpts) (GCResult, error) {
	var o GCOpts
	if opts != nil {
		o = *opts
	}
	if err := check.DB(db); err != nil {
		return GCResult{}, err
	}
	switch {
	case o.OlderThan == 0:
		o.OlderThan = DefaultGCRetention
	case o.OlderThan < MinGCRetention || o.OlderThan > MaxGCRetention:
		return GCResult{}, check.Invalid("gc: retention %v is outside %v..%v", o.OlderThan, MinGCRetention, MaxGCRetention)
	}
	switch {
	case o.Batch == 0:
		o.Batch = DefaultGCBatch
	case o.Batch < 0 || o.Batch > MaxGCBatch:
		return GCResult{}, check.Invalid("gc: batch %d is outside 1..%d", o.Batch, MaxGCBatch)
	}
	args := dbsqlc.GCParams{
		OlderThan: pgtype.Interval{Microseconds: o.OlderThan.Microseconds(), Valid: true},
		Batch:     int32(o.Batch),
		DryRun:    o.DryRun,
	}
	res := GCResult{Kinds: make([]GCCount, 0, len(GCKinds()))}
	for {
		if err := ctx.Err(); err != nil {
			return res, fmt.Errorf("pgcoord: gc: %w", err)
		}
		rows, err := queries.GC(ctx, db, args)
		if err != nil {
			return res, fmt.Errorf("pgcoord: gc: %w", base.TranslateError(err))
		}
		more := false
		for _, r := range rows {
			res.add(r.Kind, r.Removed)
			if r.Removed >= int64(o.Batch) {
				more = true
			}
		}
		if o.Progress != nil {
			o.Progress(res.clone())
		}
		if o.DryRun || !more {
			return res, nil
		}
	}
}

// add adds n to kind's count, appending the kind on first sight.
func (r *GCResult) add(kind string, n int64) {
	for i := range r.Kinds {
		if r.Kinds[i].Kind == kind {
			r.Kinds[i].Removed += n
			return
		}
	}
	r.Kinds = append(r.Kinds, GCCount{Kind: kind, Removed: n})
}

func (r GCResult) clone() GCResult {
	return GCResult{Kinds: append([]GCCount(nil), r.Kinds...)}
}
