package semaphore

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/pgcoord/pgcoord/internal/dbsqlc"
	"github.com/pgcoord/pgcoord/pgcoord"
)

// Drain is the operator's revocation of every permit of key (`pgcoord semaphores drain`):
// the permits are deleted at once, their holders' Renew, Release and Done return ErrLost
// from then on, the units of demand that permits of Next reserved go back, waiters are
// woken, and the next admission's fence token is higher than all of theirs, so fenced
// writes refuse the old holders. A holder learns of it only at its next renewal: until then
// it keeps running, so the limit can be exceeded for up to one renewal interval unless its
// writes are fenced. It returns the revoked permits (with ExpiresAt as it was, and no
// TrustUntil); an empty slice, never nil, if none was held or the key does not exist.
func Drain(ctx context.Context, db pgcoord.DBTX, key string) ([]Permit, error) {
	if err := validateKey(key); err != nil {
		return nil, err
	}
	if err := check.DB(db); err != nil {
		return nil, err
	}
	rows, err := queries.SemaphoreDrain(ctx, db, key)
	if err != nil {
		return nil, fmt.Errorf("semaphore: drain %q: %w", key, err)
	}
	out := make([]Permit, 0, len(rows))
	for _, r := range rows {
		out = append(out, Permit{Key: r.Key, Holder: r.Holder, Token: r.FenceToken, AcquiredAt: r.AcquiredAt, ExpiresAt: r.ExpiresAt})
	}
	return out, nil
}

// KeyStatus is the state of one semaphore key as an operator sees it, read in one
// statement at DBNow.
type KeyStatus struct {
	// Key is the semaphore's key.
	Key string
	// Limit is the most permits the key admits at once; Weight its share in fair
	// admission (Next).
	Limit, Weight int
	// Token is the fence token of the key's latest permit (0 if none was ever granted).
	Token int64
	// Held counts live permits. Expired counts permits past their expiry that no
	// admission has reclaimed yet: slots leaked by holders that died or stopped renewing,
	// freed by the key's next admission. Waiters counts Acquire calls in line whose
	// registration is live.
	Held, Expired, Waiters int
	// OldestWaiterSince is when the first live waiter joined the line; OldestPermitAt when
	// the oldest live permit was granted. Zero when there is none.
	OldestWaiterSince, OldestPermitAt time.Time
	// Demand counts the key's units of work not yet done, as reported with AddDemand and
	// consumed by Done: the jobs still queued and those in hand — taken under a live
	// permit of Next that reserved one unit each, and not yet done. A unit whose permit
	// ended without Done (released, expired, drained) is queued again.
	Demand int64
	// VTime is the key's virtual time in fair admission: it grows by 1/Weight with each
	// admission by Next; the key with demand and the smallest VTime is served first.
	VTime float64
	// Admitted counts admissions since the key was created; Refused counts refusals
	// decided under the key's lock (rounds of waiting Acquires, lost races). A TryAcquire
	// refused from plain reads writes nothing and is counted only by Metrics.
	Admitted, Refused int64
	// Waited counts the key's admissions of the last 5 to 10 minutes by DBNow (the current
	// 5-minute window and the one before it), recorded in the database at admission, so
	// every process sees them. WaitP50 and WaitP99 are the median and the 99th percentile
	// of their waits: how long each holder stood in line before it was admitted, from the
	// first refused attempt of its blocking Acquire, by the database clock; 0 for one that
	// never stood in line (TryAcquire, Next, an Acquire admitted at once). They come from a
	// histogram with two buckets per power of two of milliseconds, each reported as its
	// geometric middle: within about 20% of the true wait. A wait under 1 ms reports as 0,
	// one of more than 2^24 ms (about 4.7 hours) as 2^24 ms. Both are 0 when Waited is 0.
	Waited           int64
	WaitP50, WaitP99 time.Duration
	// DBNow is the database clock when the status was read.
	DBNow time.Time
}

// waitBuckets is the number of buckets of the admission-wait histogram (the length of
// pgcoord_semaphores.waits, see 00004_semaphores.sql): bucket 0 holds waits under 1 ms,
// bucket j in 1..waitBuckets-2 those in [2^((j-1)/2), 2^(j/2)) ms, the last one the rest.
const waitBuckets = 50

// waitBucketValue is the wait that bucket j of the histogram reports: its geometric
// middle, within 2^(1/4) (about 19%) of both its bounds; 0 for the first bucket, and the
// lower bound of the last, which has no upper bound.
func waitBucketValue(j int) time.Duration {
	var exp float64 // the wait is 2^exp ms
	switch {
	case j <= 0:
		return 0
	case j >= waitBuckets-1:
		exp = float64(waitBuckets-2) / 2
	default:
		exp = (2*float64(j) - 1) / 4
	}
	return time.Duration(math.Round(math.Exp2(exp) * float64(time.Millisecond)))
}

// waitStats reads a histogram of admission waits (counts per bucket, as waitBuckets
// describes): the number of waits counted and their median and 99th percentile. The
// q-quantile is the value of the bucket holding the ceil(q*n)-th smallest wait.
func waitStats(hist []int32) (n int64, p50, p99 time.Duration) {
	for _, c := range hist {
		n += int64(max(c, 0))
	}
	if n == 0 {
		return 0, 0, 0
	}
	quantile := func(q float64) time.Duration {
		rank := max(int64(math.Ceil(q*float64(n))), 1)
		var seen int64
		for j, c := range hist {
			seen += int64(max(c, 0))
			if seen >= rank {
				return waitBucketValue(j)
			}
		}
		return waitBucketValue(len(hist) - 1) // not reached: seen ends at n >= rank
	}
	return n, quantile(0.50), quantile(0.99)
}

// OverLimit reports whether more permits are live than the limit allows: possible, for a
// while, after the limit was lowered (lowering revokes nothing).
func (s KeyStatus) OverLimit() bool { return s.Held > s.Limit }

func statusFrom(r dbsqlc.ListSemaphoresRow) KeyStatus {
	s := KeyStatus{
		Key: r.Key, Limit: int(r.PermitLimit), Weight: int(r.Weight), Token: r.FenceToken,
		Held: int(r.Held), Expired: int(r.Expired), Waiters: int(r.Waiters),
		Demand: r.Demand, VTime: r.Vtime, Admitted: r.Admitted, Refused: r.Refused, DBNow: r.DbNow,
	}
	s.Waited, s.WaitP50, s.WaitP99 = waitStats(r.RecentWaits)
	// The query reads 'epoch' when there is none.
	if s.Waiters > 0 {
		s.OldestWaiterSince = r.OldestWaiterSince
	}
	if s.Held > 0 {
		s.OldestPermitAt = r.OldestPermitAt
	}
	return s
}

// ListOpts are the options of List. A nil *ListOpts lists the first DefaultListLimit keys
// in key order.
type ListOpts struct {
	// After lists keys that sort after it: pass the last key of one page to get the next.
	After string
	// Limit caps the number of keys returned. Default DefaultListLimit; at most
	// MaxListLimit.
	Limit int
	// Prefix, if set, lists only the keys that start with it, character for character
	// ('%' and '_' are plain characters). At most 255 bytes, as a key.
	Prefix string
}

// DefaultListLimit and MaxListLimit bound one page of List (pgcoord's, for every package).
const (
	DefaultListLimit = pgcoord.DefaultListLimit
	MaxListLimit     = pgcoord.MaxListLimit
)

// List returns the status of semaphore keys in key order, one page at a time (see
// ListOpts.After), never nil.
func List(ctx context.Context, db pgcoord.DBTX, opts *ListOpts) ([]KeyStatus, error) {
	if err := check.DB(db); err != nil {
		return nil, err
	}
	var o ListOpts
	if opts != nil {
		o = *opts
	}
	limit, err := check.ListLimit(o.Limit)
	if err != nil {
		return nil, fmt.Errorf("semaphore: %w", err)
	}
	if o.Prefix != "" {
		if err := check.Name("prefix of a semaphore key", o.Prefix); err != nil {
			return nil, err
		}
	}
	rows, err := queries.ListSemaphores(ctx, db, dbsqlc.ListSemaphoresParams{
		After: o.After, Prefix: o.Prefix, MaxRows: limit,
	})
	if err != nil {
		return nil, fmt.Errorf("semaphore: list: %w", err)
	}
	out := make([]KeyStatus, 0, len(rows))
	for _, r := range rows {
		out = append(out, statusFrom(r))
	}
	return out, nil
}

// Get returns the status of key, or ErrNotFound if no such key exists.
func Get(ctx context.Context, db pgcoord.DBTX, key string) (KeyStatus, error) {
	if err := validateKey(key); err != nil {
		return KeyStatus{}, err
	}
	if err := check.DB(db); err != nil {
		return KeyStatus{}, err
	}
	rows, err := queries.ListSemaphores(ctx, db, dbsqlc.ListSemaphoresParams{OnlyKey: &key, MaxRows: 1})
	if err != nil {
		return KeyStatus{}, fmt.Errorf("semaphore: get %q: %w", key, err)
	}
	if len(rows) == 0 {
		return KeyStatus{}, fmt.Errorf("%w: %q", ErrNotFound, key)
	}
	return statusFrom(rows[0]), nil
}

// PermitInfo is a permit as an operator sees it.
type PermitInfo struct {
	// Permit is the permit; its TrustUntil is zero (that is the holder's own judgement).
	Permit
	// RenewedAt is when the permit was last renewed, by the database clock; zero if never.
	RenewedAt time.Time
	// Reserved reports whether the permit was admitted by Next: it holds one unit of the
	// key's demand, which Done consumes and any other ending gives back.
	Reserved bool
	// DBNow is the database clock when the permit was read: the permit is live if
	// ExpiresAt is after it, and otherwise a leaked slot that the key's next admission
	// reclaims.
	DBNow time.Time
}

// Live reports whether the permit had not expired when it was read.
func (p PermitInfo) Live() bool { return p.ExpiresAt.After(p.DBNow) }

// Permits returns the permits of key in the order they were granted, live and expired
// (not yet reclaimed) alike; an empty slice, never nil, if there is none or no such key.
func Permits(ctx context.Context, db pgcoord.DBTX, key string) ([]PermitInfo, error) {
	if err := validateKey(key); err != nil {
		return nil, err
	}
	if err := check.DB(db); err != nil {
		return nil, err
	}
	rows, err := queries.ListPermits(ctx, db, key)
	if err != nil {
		return nil, fmt.Errorf("semaphore: permits of %q: %w", key, err)
	}
	out := make([]PermitInfo, 0, len(rows))
	for _, r := range rows {
		pi := PermitInfo{
			Permit:   Permit{Key: r.Key, Holder: r.Holder, Token: r.FenceToken, AcquiredAt: r.AcquiredAt, ExpiresAt: r.ExpiresAt},
			Reserved: r.Reserved,
			DBNow:    r.DbNow,
		}
		if r.RenewedAt != nil {
			pi.RenewedAt = *r.RenewedAt
		}
		out = append(out, pi)
	}
	return out, nil
}
