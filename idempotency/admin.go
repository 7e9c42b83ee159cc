package idempotency

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgcoord/pgcoord/internal/base"
	"github.com/pgcoord/pgcoord/internal/batch"
	"github.com/pgcoord/pgcoord/internal/dbarg"
	"github.com/pgcoord/pgcoord/internal/dbsqlc"
	"github.com/pgcoord/pgcoord/pgcoord"
)

// check makes this package's argument errors ("idempotency: cause").
var check = base.Check("idempotency")

// Defaults and bounds of GCOpts.
const (
	DefaultGCBatch = 1000
	MaxGCBatch     = 100000
)

// GCOpts are the options of GC. A nil *GCOpts means the defaults.
type GCOpts struct {
	// Tombstone is how long the tombstone of a deleted key refuses the key. Default
	// DefaultTombstone (30 days); at most MaxRetention.
	Tombstone time.Duration
	// Batch is how many keys one statement deletes at most. Default DefaultGCBatch
	// (1000); at most MaxGCBatch.
	Batch int
	// DryRun deletes nothing: GC returns how many keys it would delete now.
	DryRun bool
	// Progress, if set, is called after each batch with the number deleted so far (with
	// DryRun, once with the count).
	Progress func(deleted int64)
}

// GC deletes the keys whose retention has passed, by the database clock, and returns how
// many it deleted. Each deleted key leaves a tombstone — (scope, key, fingerprint), kept
// GCOpts.Tombstone — so that a retry arriving after the key is gone is refused with
// ErrExpired rather than executed again; expired tombstones are deleted too. It works in
// batches of GCOpts.Batch, each one statement (its own short transaction with a pool), until
// a batch comes up short. A key whose attempt is still running is skipped. It stops at the
// first error or when ctx ends, returning the number deleted so far with the error.
//
// A nil db or an option out of range returns an error wrapping pgcoord.ErrInvalidArgument
// before any SQL runs.
func GC(ctx context.Context, db pgcoord.DBTX, opts *GCOpts) (deleted int64, err error) {
	if err := check.DB(db); err != nil {
		return 0, err
	}
	var o GCOpts
	if opts != nil {
		o = *opts
	}
	if o.Batch == 0 {
		o.Batch = DefaultGCBatch
	}
	if o.Tombstone == 0 {
		o.Tombstone = DefaultTombstone
	}
	if o.Batch < 1 || o.Batch > MaxGCBatch {
		return 0, check.Invalid("GC batch %d is outside 1..%d", o.Batch, MaxGCBatch)
	}
	if o.Tombstone < 0 || o.Tombstone > MaxRetention {
		return 0, check.Invalid("tombstone %v is outside 0..%v", o.Tombstone, MaxRetention)
	}
	deleted, err = batch.Delete(ctx, o.Batch, o.DryRun, o.Progress,
		func(ctx context.Context) (int64, error) { return queries.IdempotencyCountExpired(ctx, db) },
		func(ctx context.Context) (int64, error) {
			return queries.IdempotencyGC(ctx, db, dbsqlc.IdempotencyGCParams{
				Batch: int32(o.Batch), Tombstone: dbarg.Interval(o.Tombstone)})
		})
	if err != nil {
		return deleted, fmt.Errorf("idempotency: GC: %w", base.TranslateError(err))
	}
	return deleted, nil
}

// KeyInfo describes a key for operators (List, Get).
type KeyInfo struct {
	Scope, Key    string
	Fingerprint   []byte
	State         string // StateInFlight or StateCompleted
	Holder        string // the attempt that holds (or last held) the key
	Attempts      int    // attempts that have held the key
	RecoveryPoint string // the last recovery point recorded; "" if none
	// Held reports whether a live attempt holds the key (its lease has not lapsed). An
	// in-flight key that nobody holds is stuck: see Stuck.
	Held        bool
	Status      int // the stored status; 0 while in flight
	BodyBytes   int // the stored body's size
	Response    *Response
	CreatedAt   time.Time
	UpdatedAt   time.Time
	CompletedAt time.Time // zero while in flight
	ExpiresAt   time.Time
	DBNow       time.Time // the database clock when read
}

// Stuck reports whether the key is in flight but held by no live attempt: its holder's
// lease lapsed (it died) or it gave up after a recovery point, and no retry has come to
// recover it yet. The next attempt with the key recovers it at once.
func (k KeyInfo) Stuck() bool { return k.State == StateInFlight && !k.Held }

// ListOpts are the options of List. A nil *ListOpts means the defaults.
type ListOpts struct {
	// AfterScope and AfterKey start the list after this (scope, key), for paging: pass the
	// last one of the previous page.
	AfterScope, AfterKey string
	// Limit is the page size: default pgcoord.DefaultListLimit, at most
	// pgcoord.MaxListLimit.
	Limit int
	// InFlight lists only keys in flight; Stuck only those nobody holds (KeyInfo.Stuck).
	InFlight, Stuck bool
	// ScopePrefix, if set, lists only the keys whose scope starts with it, character for
	// character ('%' and '_' are plain characters). At most 255 bytes, as a scope.
	ScopePrefix string
}

// List returns keys in (scope, key) order, without their stored responses (KeyInfo.Response
// is nil; BodyBytes says the body's size). An attempt's first phase is not committed, so a
// key appears in flight only once its attempt committed a recovery point; see the package
// documentation. An option out of range returns an error wrapping
// pgcoord.ErrInvalidArgument before any SQL runs.
func List(ctx context.Context, db pgcoord.DBTX, opts *ListOpts) ([]KeyInfo, error) {
	if err := check.DB(db); err != nil {
		return nil, err
	}
	var o ListOpts
	if opts != nil {
		o = *opts
	}
	limit, err := check.ListLimit(o.Limit)
	if err != nil {
		return nil, err
	}
	if o.ScopePrefix != "" {
		if err := check.Name("prefix of an idempotency scope", o.ScopePrefix); err != nil {
			return nil, err
		}
	}
	rows, err := queries.IdempotencyList(ctx, db, dbsqlc.IdempotencyListParams{
		AfterScope: o.AfterScope, AfterKey: o.AfterKey, ScopePrefix: o.ScopePrefix, InFlightOnly: o.InFlight, StuckOnly: o.Stuck, MaxRows: limit})
	if err != nil {
		return nil, fmt.Errorf("idempotency: list: %w", err)
	}
	out := make([]KeyInfo, 0, len(rows))
	for _, r := range rows {
		out = append(out, KeyInfo{
			Scope: r.Scope, Key: r.Key, Fingerprint: r.Fingerprint, State: r.State, Holder: r.Holder,
			Attempts: int(r.Attempts), RecoveryPoint: dbarg.Deref(r.RecoveryPoint), Held: r.Held,
			Status: int(dbarg.Deref(r.Status)), BodyBytes: int(r.BodyBytes), CreatedAt: r.CreatedAt,
			UpdatedAt: r.UpdatedAt, CompletedAt: dbarg.Deref(r.CompletedAt), ExpiresAt: r.ExpiresAt, DBNow: r.DbNow,
		})
	}
	return out, nil
}

// Get returns one key with its stored response (Response is nil while in flight), or
// ErrNotFound. A bad scope or key returns an error wrapping pgcoord.ErrInvalidName before
// any SQL runs.
func Get(ctx context.Context, db pgcoord.DBTX, scope, key string) (KeyInfo, error) {
	if err := check.Name("idempotency scope", scope); err != nil {
		return KeyInfo{}, err
	}
	if err := ValidateKey(key); err != nil {
		return KeyInfo{}, err
	}
	if err := check.DB(db); err != nil {
		return KeyInfo{}, err
	}
	r, err := queries.IdempotencyGet(ctx, db, dbsqlc.IdempotencyGetParams{Scope: scope, Key: key})
	if errors.Is(err, pgx.ErrNoRows) {
		return KeyInfo{}, fmt.Errorf("%w: %s/%s", ErrNotFound, scope, key)
	}
	if err != nil {
		return KeyInfo{}, fmt.Errorf("idempotency: get %s/%s: %w", scope, key, err)
	}
	k := KeyInfo{
		Scope: r.Scope, Key: r.Key, Fingerprint: r.Fingerprint, State: r.State, Holder: r.Holder,
		Attempts: int(r.Attempts), RecoveryPoint: dbarg.Deref(r.RecoveryPoint), Held: r.Held && r.State == StateInFlight,
		Status: int(dbarg.Deref(r.Status)), BodyBytes: len(r.Body), CreatedAt: r.CreatedAt,
		UpdatedAt: r.UpdatedAt, CompletedAt: dbarg.Deref(r.CompletedAt), ExpiresAt: r.ExpiresAt, DBNow: r.DbNow,
	}
	if r.State == StateCompleted {
		if k.Response, err = toResponse(r.Status, r.Headers, r.Body); err != nil {
			return k, fmt.Errorf("idempotency: stored response of %s/%s: %w", scope, key, err)
		}
	}
	return k, nil
}
