package ratelimit

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

// Bounds of a policy (the CHECKs of pgcoord_ratelimit_policies).
const (
	MaxRate   = 1_000_000_000
	MaxBurst  = 1_000_000_000
	MaxPeriod = 366 * 24 * time.Hour
)

// Policy is a rate limit: Rate units per Period, in bursts of up to Burst units.
type Policy struct {
	Name   string
	Rate   int64         // units per Period, 1 to MaxRate
	Period time.Duration // 1 µs to MaxPeriod
	Burst  int64         // the most units admitted at once, 1 to MaxBurst
	// Shadow makes the policy count the calls it would refuse (ShadowRefused) and refuse
	// none: for rolling out a new limit.
	Shadow bool
	// Unlogged keeps the policy's keys in an UNLOGGED table: a call that charges only such
	// keys commits without waiting for a WAL flush, and a crash of the server or a failover
	// puts every key of the policy at rest (a full burst again). It is set when the policy
	// is created: Set refuses to change it (delete the policy, which resets its keys, and
	// create it again).
	Unlogged bool

	// Set by the database (ignored by Set):
	Interval      time.Duration // the emission interval: Period / Rate, rounded up to 1 µs
	ShadowRefused int64         // calls refused in shadow mode since it was turned on
	CreatedAt     time.Time
	UpdatedAt     time.Time
}

func (p Policy) validate() error {
	if err := check.Name("rate limit policy", p.Name); err != nil {
		return err
	}
	switch {
	case p.Rate < 1 || p.Rate > MaxRate:
		return check.Invalid("policy %q: rate %d is not between 1 and %d", p.Name, p.Rate, MaxRate)
	case p.Period < time.Microsecond || p.Period > MaxPeriod:
		return check.Invalid("policy %q: period %v is not between 1µs and %v", p.Name, p.Period, MaxPeriod)
	case p.Period%time.Microsecond != 0:
		return check.Invalid("policy %q: period %v is not a whole number of microseconds", p.Name, p.Period)
	case p.Burst < 1 || p.Burst > MaxBurst:
		return check.Invalid("policy %q: burst %d is not between 1 and %d", p.Name, p.Burst, MaxBurst)
	}
	return nil
}

// Set creates the policy p.Name or changes it; the change applies from the next call, and
// keys keep their state. Turning shadow mode on (or off) restarts ShadowRefused at 0.
func Set(ctx context.Context, db pgcoord.DBTX, p Policy) (Policy, error) {
	if err := check.DB(db); err != nil {
		return Policy{}, err
	}
	if err := p.validate(); err != nil {
		return Policy{}, err
	}
	row, err := queries.RatelimitSet(ctx, db, dbsqlc.RatelimitSetParams{
		Name: p.Name, Rate: p.Rate, Period: dbarg.Interval(p.Period), Burst: p.Burst, Shadow: p.Shadow,
		Unlogged: p.Unlogged,
	})
	if err != nil {
		return Policy{}, translate(err)
	}
	return policyOf(row), nil
}

// Get returns the policy name; ErrUnknownPolicy if there is none.
func Get(ctx context.Context, db pgcoord.DBTX, name string) (Policy, error) {
	if err := check.DB(db); err != nil {
		return Policy{}, err
	}
	if err := check.Name("rate limit policy", name); err != nil {
		return Policy{}, err
	}
	row, err := queries.RatelimitPolicy(ctx, db, name)
	if errors.Is(err, pgx.ErrNoRows) {
		return Policy{}, fmt.Errorf("%w: %q", ErrUnknownPolicy, name)
	}
	if err != nil {
		return Policy{}, err
	}
	return policyOf(dbsqlc.PgcoordRatelimitPolicy(row)), nil
}

// ListOpts are the options of List. A nil *ListOpts means the defaults.
type ListOpts struct {
	// Limit caps the policies returned. Default pgcoord.DefaultListLimit; at most
	// pgcoord.MaxListLimit.
	Limit int
}

// List returns the policies, by name, at most opts.Limit of them.
func List(ctx context.Context, db pgcoord.DBTX, opts *ListOpts) ([]Policy, error) {
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
	rows, err := queries.RatelimitPolicies(ctx, db, limit)
	if err != nil {
		return nil, err
	}
	out := make([]Policy, len(rows))
	for i, r := range rows {
		out[i] = policyOf(dbsqlc.PgcoordRatelimitPolicy(r))
	}
	return out, nil
}

// Delete deletes the policy name and its keys' state; it reports whether there was one.
// A call that names it afterwards fails with ErrUnknownPolicy.
func Delete(ctx context.Context, db pgcoord.DBTX, name string) (bool, error) {
	if err := check.DB(db); err != nil {
		return false, err
	}
	if err := check.Name("rate limit policy", name); err != nil {
		return false, err
	}
	deleted, err := queries.RatelimitDelete(ctx, db, name)
	return deleted, translate(err)
}

// Reset puts a key at rest (a full burst again); it reports whether the key had state.
func Reset(ctx context.Context, db pgcoord.DBTX, l Limit) (bool, error) {
	if err := check.DB(db); err != nil {
		return false, err
	}
	if _, _, err := validateLimits(1, []Limit{l}); err != nil {
		return false, err
	}
	reset, err := queries.RatelimitReset(ctx, db, dbsqlc.RatelimitResetParams{Policy: l.Policy, Key: l.Key})
	return reset, translate(err)
}

// KeyState is a key's state under a policy, judged when it was read.
type KeyState struct {
	Limit
	Remaining  int64         // the units it admits now
	ResetAfter time.Duration // how long until it is at rest (a full burst)
}

// State reads a key's state without charging it; ErrUnknownPolicy if the policy does not
// exist. A key never charged, or at rest, has a full burst.
func State(ctx context.Context, db pgcoord.DBTX, l Limit) (KeyState, error) {
	if err := check.DB(db); err != nil {
		return KeyState{}, err
	}
	if _, _, err := validateLimits(1, []Limit{l}); err != nil {
		return KeyState{}, err
	}
	row, err := queries.RatelimitKey(ctx, db, dbsqlc.RatelimitKeyParams{Policy: l.Policy, Key: l.Key})
	if errors.Is(err, pgx.ErrNoRows) {
		return KeyState{}, fmt.Errorf("%w: %q", ErrUnknownPolicy, l.Policy)
	}
	if err != nil {
		return KeyState{}, err
	}
	return KeyState{Limit: l, Remaining: row.Remaining, ResetAfter: dbarg.Duration(row.ResetAfter)}, nil
}

func policyOf(r dbsqlc.PgcoordRatelimitPolicy) Policy {
	return Policy{
		Name: r.Name, Rate: r.Rate, Period: dbarg.Duration(r.Period), Burst: r.Burst, Shadow: r.Shadow,
		Unlogged: r.Unlogged, Interval: time.Duration(r.IntervalUs) * time.Microsecond, ShadowRefused: r.ShadowRefused,
		CreatedAt: r.CreatedAt, UpdatedAt: r.UpdatedAt,
	}
}
