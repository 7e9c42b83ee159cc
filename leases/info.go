package leases

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgcoord/pgcoord/internal/dbarg"
	"github.com/pgcoord/pgcoord/internal/dbsqlc"
	"github.com/pgcoord/pgcoord/pgcoord"
)

// Info is the state of a lease as an operator sees it: held or free, by whom, until when.
type Info struct {
	Name string
	// Token is the fence token of the current or most recent grant.
	Token int64
	// Holder is the current holder; empty when the lease is free (released or expired by
	// an operator). An expired but untaken grant keeps its holder: see Held.
	Holder   string
	Metadata map[string]string
	// AcquiredAt, RenewedAt, ExpiresAt and ReleasedAt are by the database clock; zero when
	// they do not apply.
	AcquiredAt, RenewedAt, ExpiresAt, ReleasedAt time.Time
	// ExpiredBy names who forced the last grant to expire (see Expire); empty otherwise.
	ExpiredBy string
	// NearMisses counts the renewals of every grant of the name that arrived with less
	// than a quarter of the grant's time left, by the database clock: a holder that paused
	// or a database that answered slowly came close to losing the lease. LastNearMissAt is
	// the latest (zero if none). ForcedExpiries counts Expire calls that freed a grant.
	NearMisses     int64
	LastNearMissAt time.Time
	ForcedExpiries int64
	// DBNow is the database clock when the row was read.
	DBNow time.Time
}

// Held reports whether the lease had an unexpired holder when it was read.
func (i Info) Held() bool { return i.Holder != "" && i.ExpiresAt.After(i.DBNow) }

// Remaining is how long the grant had left when it was read, by the database clock; zero
// if it was not held.
func (i Info) Remaining() time.Duration {
	if !i.Held() {
		return 0
	}
	return i.ExpiresAt.Sub(i.DBNow)
}

func infoFrom(r dbsqlc.GetLeaseRow) Info {
	i := Info{
		Name: r.Name, Token: r.FenceToken, Metadata: decodeMetadata(r.Metadata),
		AcquiredAt: r.AcquiredAt, DBNow: r.DbNow,
		NearMisses: r.NearMisses, ForcedExpiries: r.ForcedExpiries,
	}
	i.LastNearMissAt = dbarg.Deref(r.LastNearMissAt)
	i.Holder = dbarg.Deref(r.Holder)
	i.ExpiredBy = dbarg.Deref(r.ExpiredBy)
	i.RenewedAt = dbarg.Deref(r.RenewedAt)
	i.ExpiresAt = dbarg.Deref(r.ExpiresAt)
	i.ReleasedAt = dbarg.Deref(r.ReleasedAt)
	return i
}

// Get returns the state of the lease name, or ErrNotFound if it was never granted.
func Get(ctx context.Context, db pgcoord.DBTX, name string) (Info, error) {
	if err := check.Name("lease", name); err != nil {
		return Info{}, err
	}
	if err := check.DB(db); err != nil {
		return Info{}, err
	}
	row, err := queries.GetLease(ctx, db, name)
	if errors.Is(err, pgx.ErrNoRows) {
		return Info{}, fmt.Errorf("%w: %q", ErrNotFound, name)
	}
	if err != nil {
		return Info{}, fmt.Errorf("leases: get %q: %w", name, err)
	}
	return infoFrom(row), nil
}

// ListOpts are the options of List. A nil *ListOpts lists the first DefaultListLimit
// leases in name order.
type ListOpts struct {
	// Held lists only leases with an unexpired holder; Expired only grants that expired
	// without being released. They are mutually exclusive.
	Held, Expired bool
	// After lists leases whose name sorts after it: pass the last name of one page to get
	// the next.
	After string
	// Limit caps the number of leases returned. Default DefaultListLimit; at most
	// MaxListLimit.
	Limit int
	// Prefix, if set, lists only the leases whose name starts with it, character for
	// character ('%' and '_' are plain characters). At most 255 bytes, as a name.
	Prefix string
}

// DefaultListLimit and MaxListLimit bound one page of List (pgcoord's, for every package).
const (
	DefaultListLimit = pgcoord.DefaultListLimit
	MaxListLimit     = pgcoord.MaxListLimit
)

// List returns leases in name order, one page at a time (see ListOpts.After), never nil.
func List(ctx context.Context, db pgcoord.DBTX, opts *ListOpts) ([]Info, error) {
	if err := check.DB(db); err != nil {
		return nil, err
	}
	var o ListOpts
	if opts != nil {
		o = *opts
	}
	if o.Held && o.Expired {
		return nil, check.Invalid("list: Held and Expired are mutually exclusive")
	}
	limit, err := check.ListLimit(o.Limit)
	if err != nil {
		return nil, fmt.Errorf("leases: %w", err)
	}
	if o.Prefix != "" {
		if err := check.Name("prefix of a lease", o.Prefix); err != nil {
			return nil, err
		}
	}
	rows, err := queries.ListLeases(ctx, db, dbsqlc.ListLeasesParams{
		After: o.After, Prefix: o.Prefix, HeldOnly: o.Held, ExpiredOnly: o.Expired, MaxRows: limit,
	})
	if err != nil {
		return nil, fmt.Errorf("leases: list: %w", err)
	}
	out := make([]Info, 0, len(rows))
	for _, r := range rows {
		out = append(out, infoFrom(dbsqlc.GetLeaseRow(r)))
	}
	return out, nil
}

// Expire is the operator's forced expiry of the lease name: it becomes free at once and a
// waiting Acquire is woken; the old holder's Renew, Release and in-database checks
// (fenced.CheckLease) fail with ErrLost from then on, and the next grant gets a higher
// token, so fenced writes reject the old holder. by names the operator, for the record.
// It returns the lease as it was, or ErrNotFound if the lease was never granted or has no
// holder (released, or already expired by an operator). A grant that expired by time but
// was not taken since still has its holder: Expire frees it and records who did.
func Expire(ctx context.Context, db pgcoord.DBTX, name, by string) (Info, error) {
	if err := check.Name("lease", name); err != nil {
		return Info{}, err
	}
	if err := check.DB(db); err != nil {
		return Info{}, err
	}
	if by == "" {
		by = "operator"
	}
	r, err := queries.ExpireLease(ctx, db, dbsqlc.ExpireLeaseParams{Name: name, ExpiredBy: by})
	if errors.Is(err, pgx.ErrNoRows) {
		return Info{}, fmt.Errorf("%w: %q is not held", ErrNotFound, name)
	}
	if err != nil {
		return Info{}, fmt.Errorf("leases: expire %q: %w", name, err)
	}
	return infoFrom(dbsqlc.GetLeaseRow(r)), nil
}
