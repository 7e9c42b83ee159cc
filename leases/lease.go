package leases

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"time"

	"github.com/pgcoord/pgcoord/internal/base"
	"github.com/pgcoord/pgcoord/internal/dbarg"
	"github.com/pgcoord/pgcoord/internal/dbsqlc"
	"github.com/pgcoord/pgcoord/internal/listen"
	"github.com/pgcoord/pgcoord/internal/tracing"
	"github.com/pgcoord/pgcoord/pgcoord"
)

// Errors returned by this package. Driver errors are wrapped, so a *pgconn.PgError stays
// reachable with errors.As.
var (
	// ErrHeld means another holder has the lease and it has not expired.
	ErrHeld = errors.New("leases: held by another holder")
	// ErrLost means the grant a call names (name + holder + token) is no longer current:
	// the lease was released, expired, taken over or expired by an operator. A Renew or
	// Release that returns it changed nothing. Do returns an error wrapping it when the
	// lease was lost while its function ran (or its trust deadline passed), whatever the
	// function returned.
	ErrLost = errors.New("leases: lease lost")
	// ErrNotFound means no lease of that name was ever granted.
	ErrNotFound = errors.New("leases: no such lease")
)

// MaxTTL is the longest lease pgcoord grants. A lease is meant to be renewed; a TTL of hours
// usually means a crashed holder would block everyone for that long.
const MaxTTL = 24 * time.Hour

// MinTTL is the shortest lease pgcoord grants.
const MinTTL = time.Millisecond

// MaxMetadataBytes bounds a grant's metadata (host, pid, app and AcquireOpts.Metadata) as
// JSON text; the database refuses metadata whose stored form exceeds 8192 bytes too.
const MaxMetadataBytes = 8192

// Lease is one grant of a named lease to one holder. It is a plain value: pass it to Renew,
// Release and fenced.CheckLease, and send Token with every write the lease protects.
type Lease struct {
	// Name is the lease's name.
	Name string
	// Holder identifies the holder of this grant.
	Holder string
	// Token is the fence token of this grant: higher than every earlier grant of Name.
	Token int64
	// Metadata describes the holder for operators (host, pid, app, and any keys given in
	// AcquireOpts.Metadata).
	Metadata map[string]string
	// AcquiredAt is when the lease was granted, by the database clock.
	AcquiredAt time.Time
	// ExpiresAt is when the grant expires unless renewed, by the database clock.
	ExpiresAt time.Time
	// TrustUntil is the local instant (with Go's monotonic clock reading) after which the
	// holder must stop trusting the lease even if it has heard nothing: the start of the
	// request that granted or renewed it, plus the TTL the database reported left, minus
	// the safety margin. It never trusts the lease longer than the database does.
	TrustUntil time.Time
}

// Trusted reports whether the holder may still rely on the lease by its own clock
// (time.Now() before TrustUntil). It is a local judgement only: fence every write anyway.
func (l Lease) Trusted() bool { return time.Now().Before(l.TrustUntil) }

// AcquireOpts are the options of TryAcquire, Acquire and Do. A nil *AcquireOpts means the
// defaults.
type AcquireOpts struct {
	// Holder identifies the holder. Default: a new identity per call ("host/pid/random"),
	// so two calls never share a grant. Set it to a stable identity (a worker's name) to
	// make acquisition re-entrant: a holder that calls again while it holds the lease gets
	// its existing grant back, with the same token, instead of ErrHeld.
	Holder string
	// Metadata is stored with the grant for operators, on top of host, pid and app: at most
	// MaxMetadataBytes as JSON, else an error wrapping pgcoord.ErrInvalidArgument.
	Metadata map[string]string
	// SafetyMargin is subtracted from the TTL to give the local trust deadline. Default:
	// a tenth of the TTL. It must be less than the TTL.
	SafetyMargin time.Duration
	// PollInterval bounds how long Acquire waits between attempts when no notification
	// arrives (behind a transaction-mode pooler, or when a holder dies without releasing).
	// Default 1s, with ±20% jitter.
	PollInterval time.Duration
	// NoListen makes Acquire poll only, without LISTEN. Behind a transaction-mode pooler,
	// where notifications are not delivered, the pool's first wait finds the pooler and
	// polls without it; NoListen only saves that one check.
	NoListen bool
	// SyncCommit is the synchronous_commit level of the grant's commit: "on" (wait until
	// the synchronous standbys have flushed it), "remote_write" or "remote_apply". It lets a
	// server run with synchronous_commit = local for ordinary traffic while grants survive
	// a failover to a synchronous standby (see docs/failover.md). When db is the caller's
	// transaction, the level applies to that whole transaction's commit. Default "": the
	// server's setting. Other values return an error wrapping pgcoord.ErrInvalidArgument.
	SyncCommit string
	// Tracer, if set, traces the call (see pgcoord.Tracer): Acquire, TryAcquire, and Do's
	// acquisition, renewals and loss. Default nil: not traced.
	Tracer pgcoord.Tracer
}

func (o *AcquireOpts) withDefaults(ttl time.Duration) (AcquireOpts, error) {
	var v AcquireOpts
	if o != nil {
		v = *o
	}
	if err := check.SyncCommit(v.SyncCommit); err != nil {
		return v, err
	}
	if v.Holder == "" {
		v.Holder = base.NewHolderID()
	} else if err := check.Name("holder", v.Holder); err != nil {
		return v, err
	}
	if n := len(encodeMetadata(v.Metadata).json); n > MaxMetadataBytes {
		return v, check.Invalid("metadata is %d bytes of JSON, more than the maximum of %d", n, MaxMetadataBytes)
	}
	if v.SafetyMargin == 0 {
		v.SafetyMargin = ttl / 10
	}
	if v.SafetyMargin < 0 || v.SafetyMargin >= ttl {
		return v, check.Invalid("safety margin %v must be between 0 and the TTL %v", v.SafetyMargin, ttl)
	}
	if v.PollInterval == 0 {
		v.PollInterval = time.Second
	}
	if v.PollInterval < 0 {
		return v, check.Invalid("negative poll interval %v", v.PollInterval)
	}
	return v, nil
}

var (
	hostname, _ = os.Hostname()
	appName     = filepath.Base(os.Args[0])
)

func validate(name string, ttl time.Duration) error {
	if err := check.Name("lease", name); err != nil {
		return err
	}
	if ttl < MinTTL || ttl > MaxTTL {
		return check.Invalid("TTL %v is outside %v..%v", ttl, MinTTL, MaxTTL)
	}
	return nil
}

// validateGrant refuses a Lease that names no grant pgcoord could have made: a bad name or
// holder (pgcoord.ErrInvalidName), a token below 1 (pgcoord.ErrInvalidArgument).
func validateGrant(l Lease) error {
	if err := check.Name("lease", l.Name); err != nil {
		return err
	}
	if err := check.Name("holder", l.Holder); err != nil {
		return err
	}
	if l.Token < 1 {
		return check.Invalid("fence token %d is not positive", l.Token)
	}
	return nil
}

// TryAcquire grants the lease name to the caller for ttl if it is free or expired, in one
// round trip, and returns the grant with a fence token higher than any before. If another
// holder has it, it returns ErrHeld; that failed attempt writes nothing and locks nothing.
//
// If the reply is lost after the grant committed (a connection cut), TryAcquire retries
// once with the same holder identity and gets its own grant back instead of ErrHeld.
// Expiry is judged by the database clock.
func TryAcquire(ctx context.Context, db pgcoord.DBTX, name string, ttl time.Duration, opts *AcquireOpts) (Lease, error) {
	if err := validate(name, ttl); err != nil {
		return Lease{}, err
	}
	if err := check.DB(db); err != nil {
		return Lease{}, err
	}
	generated := opts == nil || opts.Holder == ""
	o, err := opts.withDefaults(ttl)
	if err != nil {
		return Lease{}, err
	}
	if o.Tracer == nil {
		return tryAcquire(ctx, db, name, ttl, o, generated)
	}
	ctx, span := tracing.Start(ctx, o.Tracer, tracing.LeaseTryAcquire,
		tracing.Str(tracing.AttrLease, name), tracing.Str(tracing.AttrHolder, o.Holder))
	l, err := tryAcquire(ctx, db, name, ttl, o, generated)
	if err == nil {
		span.Set(tracing.Int(tracing.AttrToken, l.Token))
	}
	span.End(err)
	return l, err
}

func tryAcquire(ctx context.Context, db pgcoord.DBTX, name string, ttl time.Duration, o AcquireOpts, generated bool) (Lease, error) {
	meta := encodeMetadata(o.Metadata)
	for attempt := 0; ; attempt++ {
		start := time.Now()
		r := acquire(ctx, acquireCall{db: db, name: name, holder: o.Holder, generated: generated, ttl: dbarg.Interval(ttl),
			meta: meta.json, syncCommit: o.SyncCommit})
		switch err := r.Err; {
		case r.OK:
			return leaseFrom(r.Row, meta.values, start, o.SafetyMargin), nil
		case err == nil:
			return Lease{}, fmt.Errorf("%w: %q", ErrHeld, name)
		case attempt == 0 && listen.Ambiguous(ctx, err):
			continue // the grant may have committed: ask again as the same holder
		default:
			return Lease{}, fmt.Errorf("leases: acquire %q: %w", name, base.TranslateError(err))
		}
	}
}

// RenewOpts are the options of Renew. A nil *RenewOpts means the defaults.
type RenewOpts struct {
	// AsyncCommit commits the renewal without waiting for the WAL flush
	// (synchronous_commit = off for that transaction): faster by the cost of a WAL flush
	// (1.3-1.5x here with 1-8 workers; see docs/benchmarks.md).
	// Losing the renewal in a crash only shortens the lease. Never set it when db is a
	// transaction that also carries other writes: they would lose durability too.
	AsyncCommit bool
	// SafetyMargin as in AcquireOpts. Default: a tenth of the TTL.
	SafetyMargin time.Duration
	// Tracer, if set, traces the renewal (see pgcoord.Tracer). Default nil: not traced.
	Tracer pgcoord.Tracer
}

// Renew extends the grant l to ttl from now (by the database clock), in one round trip,
// and returns the renewed grant with a new ExpiresAt and TrustUntil. It returns ErrLost,
// having changed nothing, if l is no longer current — including when it has expired, even
// if nobody took it since: a holder that let its lease expire must acquire it again. A
// Lease with a bad name or holder, or a token below 1 — no grant at all — is refused before
// any SQL runs (pgcoord.ErrInvalidName, pgcoord.ErrInvalidArgument).
func Renew(ctx context.Context, db pgcoord.DBTX, l Lease, ttl time.Duration, opts *RenewOpts) (_ Lease, err error) {
	if err := validate(l.Name, ttl); err != nil {
		return Lease{}, err
	}
	if err := validateGrant(l); err != nil {
		return Lease{}, err
	}
	if err := check.DB(db); err != nil {
		return Lease{}, err
	}
	var o RenewOpts
	if opts != nil {
		o = *opts
	}
	if o.SafetyMargin == 0 {
		o.SafetyMargin = ttl / 10
	}
	if o.SafetyMargin < 0 || o.SafetyMargin >= ttl {
		return Lease{}, check.Invalid("safety margin %v must be between 0 and the TTL %v", o.SafetyMargin, ttl)
	}
	if o.Tracer != nil {
		var span tracing.Span
		ctx, span = tracing.Start(ctx, o.Tracer, tracing.LeaseRenew, tracing.Str(tracing.AttrLease, l.Name),
			tracing.Str(tracing.AttrHolder, l.Holder), tracing.Int(tracing.AttrToken, l.Token))
		defer func() { span.End(err) }()
	}
	start := time.Now()
	r := renew(ctx, renewCall{db: db, name: l.Name, holder: l.Holder, token: l.Token, ttl: dbarg.Interval(ttl), durable: !o.AsyncCommit})
	if r.Err != nil {
		return Lease{}, fmt.Errorf("leases: renew %q: %w", l.Name, base.TranslateError(r.Err))
	}
	if !r.OK {
		return Lease{}, fmt.Errorf("%w: %q token %d", ErrLost, l.Name, l.Token)
	}
	return leaseFrom(r.Row, l.Metadata, start, o.SafetyMargin), nil
}

// ReleaseOpts are the options of Release. It has none yet: pass nil.
type ReleaseOpts struct{}

// Release frees the grant l in one round trip, waking a waiting Acquire. It is scoped to
// the grant (name + holder + token): if l is no longer current it changes nothing and
// returns ErrLost, so a late release never frees the next holder's lease. Meant for defer.
// opts may be nil (ReleaseOpts has no options yet). A Lease that names no grant is
// refused as by Renew.
func Release(ctx context.Context, db pgcoord.DBTX, l Lease, opts *ReleaseOpts) error {
	if err := validateGrant(l); err != nil {
		return err
	}
	if err := check.DB(db); err != nil {
		return err
	}
	r := release(ctx, releaseCall{db: db, name: l.Name, holder: l.Holder, token: l.Token})
	if r.Err != nil {
		return fmt.Errorf("leases: release %q: %w", l.Name, base.TranslateError(r.Err))
	}
	if !r.OK {
		return fmt.Errorf("%w: %q token %d was not current at release", ErrLost, l.Name, l.Token)
	}
	return nil
}

// leaseFrom turns a granted row into a Lease with the holder's metadata. start is the
// local instant the request was sent: the trust deadline counts the TTL left by the
// database clock from there.
func leaseFrom(r dbsqlc.AcquireLeaseRow, meta map[string]string, start time.Time, margin time.Duration) Lease {
	l := Lease{Name: r.Name, Token: r.FenceToken, Holder: dbarg.Deref(r.Holder), Metadata: maps.Clone(meta), AcquiredAt: r.AcquiredAt}
	if r.ExpiresAt != nil {
		l.ExpiresAt = *r.ExpiresAt
		l.TrustUntil = start.Add(r.ExpiresAt.Sub(r.DbNow) - margin)
	}
	return l
}

// metadata is a holder's metadata, both as given to Lease and as stored.
type metadata struct {
	values map[string]string
	json   []byte
}

// defaultMetadata describes this process; most grants store exactly this.
var defaultMetadata = newMetadata(nil)

// encodeMetadata returns the metadata of a grant: this process's, plus extra.
func encodeMetadata(extra map[string]string) metadata {
	if len(extra) == 0 {
		return defaultMetadata
	}
	return newMetadata(extra)
}

func newMetadata(extra map[string]string) metadata {
	m := map[string]string{"host": hostname, "pid": fmt.Sprint(os.Getpid()), "app": appName}
	for k, v := range extra {
		m[k] = v
	}
	b, _ := json.Marshal(m) // a map of strings always marshals
	return metadata{values: m, json: b}
}

// decodeMetadata reads the metadata column, which SQL callers may have filled with any
// JSON object; non-string values are shown as JSON.
func decodeMetadata(b []byte) map[string]string {
	var raw map[string]json.RawMessage
	if json.Unmarshal(b, &raw) != nil {
		return map[string]string{}
	}
	m := make(map[string]string, len(raw))
	for k, v := range raw {
		var s string
		if json.Unmarshal(v, &s) == nil {
			m[k] = s
		} else {
			m[k] = string(v)
		}
	}
	return m
}

var queries dbsqlc.Queries
