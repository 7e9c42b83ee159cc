package semaphore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgcoord/pgcoord/internal/base"
	"github.com/pgcoord/pgcoord/internal/dbarg"
	"github.com/pgcoord/pgcoord/internal/dbsqlc"
	"github.com/pgcoord/pgcoord/internal/listen"
	"github.com/pgcoord/pgcoord/pgcoord"
)

// SetLimitOpts are the options of SetLimit. A nil *SetLimitOpts means the defaults.
type SetLimitOpts struct {
	// Weight is the key's share in fair admission (Next): a key of weight 3 is admitted
	// three times as often as one of weight 1 while both have demand and room. 0 keeps the
	// key's weight (1 for a new key); otherwise 1..MaxWeight.
	Weight int
}

// SetLimit sets the limit of key (and its weight, if opts.Weight is set), creating the key
// if needed; it takes effect for the next admission. Raising the limit wakes the key's
// waiters at once (it notifies the semaphore channel). Lowering it revokes nothing: permits
// already held stay valid until released or expired, and new admissions wait until fewer
// than the new limit are live. To revoke permits, Drain the key.
func SetLimit(ctx context.Context, db pgcoord.DBTX, key string, limit int, opts *SetLimitOpts) error {
	if err := validateKey(key); err != nil {
		return err
	}
	if err := validateLimit(limit); err != nil {
		return err
	}
	if err := check.DB(db); err != nil {
		return err
	}
	var weight *int32
	if opts != nil && opts.Weight != 0 {
		if opts.Weight < 1 || opts.Weight > MaxWeight {
			return check.Invalid("weight %d is outside 1..%d", opts.Weight, MaxWeight)
		}
		w := int32(opts.Weight)
		weight = &w
	}
	if _, err := queries.SemaphoreSetLimit(ctx, db, dbsqlc.SemaphoreSetLimitParams{
		Key: key, PermitLimit: int32(limit), Weight: weight,
	}); err != nil {
		return fmt.Errorf("semaphore: set limit of %q: %w", key, err)
	}
	return nil
}

// AddDemandOpts are the options of AddDemand. A nil *AddDemandOpts means the defaults.
type AddDemandOpts struct {
	// Limit is the key's limit if AddDemand creates the key. Default 1; at most MaxLimit.
	// An existing key keeps its limit.
	Limit int
}

// AddDemand adds units to the work not yet done for key (negative units take work away;
// demand never goes below zero), creating the key if needed. Next admits only to keys with
// a unit of demand that no live permit of Next has reserved, and Done consumes a unit when
// its job is done. Call it in the transaction that enqueues (or cancels) the work, so the
// count and the queue agree: pass that pgx.Tx as db. It locks the key's row until that
// transaction ends, so call it last in a short transaction: admissions to the key wait
// for it, Next included (and every Next of the schema behind that one).
//
// A key that had no demand starts at the system's virtual time (that of the key served
// last): a tenant returning after an idle spell is served at once, but idling earns it no
// credit.
func AddDemand(ctx context.Context, db pgcoord.DBTX, key string, units int64, opts *AddDemandOpts) error {
	if err := validateKey(key); err != nil {
		return err
	}
	if err := check.DB(db); err != nil {
		return err
	}
	limit := 1
	if opts != nil && opts.Limit != 0 {
		limit = opts.Limit
	}
	if err := validateLimit(limit); err != nil {
		return err
	}
	if _, err := queries.SemaphoreAddDemand(ctx, db, dbsqlc.SemaphoreAddDemandParams{
		Key: key, Units: units, PermitLimit: int32(limit),
	}); err != nil {
		return fmt.Errorf("semaphore: add demand to %q: %w", key, err)
	}
	return nil
}

// NextOpts are the options of Next. A nil *NextOpts means the defaults.
type NextOpts struct {
	// Holder identifies the holder of the permit. Default: a new identity per call
	// (pgcoord.NewHolderID). If set, it must be unique per job: a holder that already holds
	// a live permit (of one of Keys, if set) gets that permit back instead of a new
	// admission, and no other unit of demand is reserved for it.
	Holder string
	// Keys restricts Next to these keys (a worker that serves some tenants only). Default
	// (nil or empty): every key.
	Keys []string
	// SafetyMargin as in AcquireOpts. Default: a tenth of the TTL.
	SafetyMargin time.Duration
	// SyncCommit as in AcquireOpts. Default "": the server's setting.
	SyncCommit string
	// RatePolicy, if set, names a rate limit policy (package ratelimit) whose key is the
	// semaphore key: a key is then limited by its rate as well as its concurrency. Next
	// passes over a key the policy refuses now, as over a key at its limit (its place in
	// the fair order is kept), and charges one unit to the key it admits, in the same
	// transaction. A policy that does not exist is an error.
	RatePolicy string
	// Metrics, if set, receives the latency of admissions (see Metrics). Default nil: not
	// counted.
	Metrics *Metrics
}

// Next is fair admission across keys, in one round trip: it admits the caller, for ttl, to
// the key that has a unit of demand (AddDemand) that no live permit of Next has reserved,
// is under its limit with nobody in line for it, and has the smallest virtual time; the
// permit reserves that unit, and Next returns it. ErrNoWork means no key could be served;
// try again later (after a notification of your queue, or a short pause), rather than
// waiting idle on one tenant.
//
// The caller then takes one job of Permit.Key from its own queue, marking it as taken
// under Permit.Token, runs it, and in the transaction that removes the job from the queue
// calls Done, which consumes the unit; a deferred Release covers every other ending (it
// is harmless after Done). Until Done commits the unit stays in the key's demand, held by
// the permit: if the permit ends any other way — Release, expiry because the worker died
// or stalled, Drain — the unit goes back, and the job, whose mark names a permit that is
// no longer live (SQL: pgcoord_semaphore_held), can be taken again. So no job is stranded
// without demand, whatever point a worker dies at; a job may run more than once (its
// worker died after running it, or lost its permit while running it): fence its effects
// with Permit.Token. See the package documentation for the worker's code.
//
// If the reply is lost after the admission committed (a connection cut), Next asks once
// more as the same holder and gets its own permit back.
func Next(ctx context.Context, db pgcoord.DBTX, ttl time.Duration, opts *NextOpts) (Permit, error) {
	if err := validateTTL(ttl); err != nil {
		return Permit{}, err
	}
	if err := check.DB(db); err != nil {
		return Permit{}, err
	}
	var o NextOpts
	if opts != nil {
		o = *opts
	}
	var err error
	if o.Holder, err = holderOrNew(o.Holder); err != nil {
		return Permit{}, err
	}
	if o.SafetyMargin, err = safetyMargin(o.SafetyMargin, ttl); err != nil {
		return Permit{}, err
	}
	if err := check.SyncCommit(o.SyncCommit); err != nil {
		return Permit{}, err
	}
	for _, k := range o.Keys {
		if err := validateKey(k); err != nil {
			return Permit{}, err
		}
	}
	if o.RatePolicy != "" {
		if err := check.Name("rate limit policy", o.RatePolicy); err != nil {
			return Permit{}, err
		}
	}
	if len(o.Keys) == 0 {
		o.Keys = nil // NULL: every key
	}
	start := time.Now()
	for attempt := 0; ; attempt++ {
		sent := time.Now()
		row, err := queries.SemaphoreNext(ctx, db, dbsqlc.SemaphoreNextParams{
			Holder: o.Holder, Ttl: dbarg.Interval(ttl), Keys: o.Keys, SyncCommit: o.SyncCommit, RatePolicy: o.RatePolicy,
		})
		switch {
		case err == nil:
			o.Metrics.admitted(row.Key, time.Since(start))
			return permitFrom(dbsqlc.SemaphoreAcquireRow(row), sent, o.SafetyMargin), nil
		case errors.Is(err, pgx.ErrNoRows):
			return Permit{}, ErrNoWork
		case attempt == 0 && listen.Ambiguous(ctx, err):
			continue // the admission may have committed: ask again as the same holder
		default:
			return Permit{}, fmt.Errorf("semaphore: next: %w", base.TranslateError(err))
		}
	}
}
