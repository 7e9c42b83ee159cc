package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/pgcoord/pgcoord/internal/base"
	"github.com/pgcoord/pgcoord/internal/coalesce"
	"github.com/pgcoord/pgcoord/internal/dbarg"
	"github.com/pgcoord/pgcoord/internal/dbsqlc"
	"github.com/pgcoord/pgcoord/internal/tracing"
	"github.com/pgcoord/pgcoord/pgcoord"
)

// check makes this package's argument errors ("ratelimit: cause").
var check = base.Check("ratelimit")

var queries dbsqlc.Queries

// ErrUnknownPolicy is returned (wrapped) when a call names a policy that does not exist.
var ErrUnknownPolicy = errors.New("ratelimit: no such policy")

// Bounds of a call.
const (
	// MaxLimits is the most limits one call checks.
	MaxLimits = 16
	// MaxCost is the largest cost of one call.
	MaxCost = 1_000_000_000
)

// Limit names one key under one policy: the pair a call is charged to.
type Limit struct {
	Policy string // the policy's name
	Key    string // the key, e.g. "key:123"; 1 to 255 bytes without control characters
}

// Decision is the outcome of a call.
type Decision struct {
	// Allowed says the call was admitted and charged.
	Allowed bool
	// Granted is the units charged: the cost when allowed (with AllowAtMost, from 1 to
	// the units asked), 0 when refused.
	Granted int64
	// Policy is the binding policy: when refused, the one that refused (of several, the
	// one whose retry is latest); when allowed, the one with the fewest units left.
	Policy string
	// RetryAfter is, when refused, how long until the same call would be admitted (if no
	// other call charges the keys first); 0 when allowed.
	RetryAfter time.Duration
	// Remaining is the units the binding policy's key admits right after this call.
	Remaining int64
	// ResetAfter is how long until the binding policy's key is at rest again (a full
	// burst).
	ResetAfter time.Duration
	// Quota is the binding policy's rate and burst, as the call read them.
	Quota Quota
}

// Quota is a policy's limit: Rate units per Period, in bursts of up to Burst.
type Quota struct {
	Rate   int64
	Period time.Duration
	Burst  int64
}

// Opts are the options of Allow and AllowAtMost. A nil *Opts means all defaults.
type Opts struct {
	// Tracer, if set, gets a span per call.
	Tracer pgcoord.Tracer
	// Metrics, if set, counts the call's decision (see Metrics).
	Metrics *Metrics
}

// Allow charges cost units to every limit, all or nothing: it is admitted only if every
// enforcing policy admits it, and then every one is charged; if one refuses, none is, and
// the Decision names it. cost must be at least 1 and at most every policy's burst (a
// larger cost could never be admitted: it is an error). db may be the caller's own
// transaction, so the charge commits or rolls back with the caller's writes.
func Allow(ctx context.Context, db pgcoord.DBTX, cost int64, limits []Limit, opts *Opts) (Decision, error) {
	return take(ctx, db, cost, false, limits, opts)
}

// AllowAtMost charges as many units as every enforcing policy admits now, from 1 to n, all
// or nothing, and says how many in Decision.Granted: for a batch consumer that takes what
// it may. It refuses only when not even one unit is admitted.
func AllowAtMost(ctx context.Context, db pgcoord.DBTX, n int64, limits []Limit, opts *Opts) (Decision, error) {
	return take(ctx, db, n, true, limits, opts)
}

func take(ctx context.Context, db pgcoord.DBTX, cost int64, atMost bool, limits []Limit, opts *Opts) (_ Decision, err error) {
	if err := check.DB(db); err != nil {
		return Decision{}, err
	}
	policies, keys, err := validateLimits(cost, limits)
	if err != nil {
		return Decision{}, err
	}
	if opts != nil && opts.Tracer != nil {
		var end func(error)
		ctx, end = startSpan(ctx, opts.Tracer, policies[0], keys[0], cost)
		defer func() { end(err) }()
	}
	o, err := call(ctx, request{db: db, policies: policies, keys: keys, cost: cost, atMost: atMost})
	if err == nil && opts != nil {
		opts.Metrics.record(o.d, limits)
	}
	return o.d, err
}

// startSpan starts the span of a call (named by its first limit) and returns its end.
func startSpan(ctx context.Context, t pgcoord.Tracer, policy, key string, cost int64) (context.Context, func(error)) {
	ctx, span := tracing.Start(ctx, t, tracing.RateTake, tracing.Str(tracing.AttrRatePolicy, policy),
		tracing.Str(tracing.AttrRateKey, key), tracing.Int(tracing.AttrRateCost, cost))
	return ctx, span.End
}

// request is one call of pgcoord_ratelimit_take_each: its pairs, its mode and its cost.
type request struct {
	db             pgcoord.DBTX
	policies, keys []string
	cost           int64
	atMost         bool
	maxWait        pgtype.Interval // a reservation's; NULL for Allow and AllowAtMost
}

// outcome is a call's decision, its slot and the pairs' arrival times before and after
// its charge (nil when refused), or its own error.
type outcome struct {
	d     Decision
	sl    slot
	tats  []time.Time
	bases []time.Time
	err   error
}

// slot is when a call may act: delay after the database judged it, at the instant at.
type slot struct {
	delay time.Duration
	at    time.Time
}

// maxBatch is the most calls one statement decides (pgcoord_ratelimit_take_each's bound).
const maxBatch = 1000

// batches decides concurrent calls on one pool with the same pairs and mode — a hot key —
// in one statement and one commit, in their order of arrival (see internal/coalesce).
var batches = coalesce.New(maxBatch, takeEach)

// call decides r: with a pool, together with the concurrent calls of the same pairs and
// mode; in a transaction or on a connection, alone.
func call(ctx context.Context, r request) (outcome, error) {
	o, err := batches.Call(ctx, r.db, r.mode(), r)
	if err == nil {
		err = o.err
	}
	return o, err
}

// mode names the calls r may be decided with (on its pool): those of the same pairs and
// mode. Names hold no control characters, so NUL separates them.
func (r request) mode() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%t\x00%d\x00%t", r.atMost, r.maxWait.Microseconds, r.maxWait.Valid)
	for i := range r.policies {
		b.WriteString("\x00" + r.policies[i] + "\x00" + r.keys[i])
	}
	return b.String()
}

// takeEach decides calls of the same pairs and mode, in order, in one statement (a single
// call of one pair: RatelimitTakeOne, an UPDATE when that decides it). A call
// whose cost exceeds a burst fails the statement; then each call is decided alone, so
// that only that call fails.
func takeEach(ctx context.Context, rs []request) ([]outcome, error) {
	r := rs[0]
	var rows []dbsqlc.RatelimitTakeEachRow
	var err error
	if len(rs) == 1 && len(r.policies) == 1 && !r.atMost {
		var one []dbsqlc.RatelimitTakeOneRow
		one, err = queries.RatelimitTakeOne(ctx, r.db, dbsqlc.RatelimitTakeOneParams{
			Policy: r.policies[0], Key: r.keys[0], Cost: r.cost, MaxWait: r.maxWait,
		})
		for _, o := range one {
			rows = append(rows, dbsqlc.RatelimitTakeEachRow(o))
		}
	} else {
		costs := make([]int64, len(rs))
		for i, c := range rs {
			costs[i] = c.cost
		}
		rows, err = queries.RatelimitTakeEach(ctx, r.db, dbsqlc.RatelimitTakeEachParams{
			Policies: r.policies, Keys: r.keys, Costs: costs, AtMost: r.atMost, MaxWait: r.maxWait,
		})
	}
	if err != nil {
		err = translate(err)
		if len(rs) == 1 || !errors.Is(err, pgcoord.ErrInvalidArgument) {
			return nil, err
		}
		out := make([]outcome, len(rs))
		for i := range rs {
			os, err := takeEach(ctx, rs[i:i+1])
			if err != nil {
				out[i].err = err
			} else {
				out[i] = os[0]
			}
		}
		return out, nil
	}
	if len(rows) != len(rs) {
		return nil, fmt.Errorf("ratelimit: %d calls got %d answers", len(rs), len(rows))
	}
	out := make([]outcome, len(rows))
	for i, row := range rows {
		out[i] = outcome{
			d: Decision{
				Allowed:    row.Granted > 0,
				Granted:    row.Granted,
				Policy:     row.Policy,
				RetryAfter: dbarg.Duration(row.RetryAfter),
				Remaining:  row.Remaining,
				ResetAfter: dbarg.Duration(row.ResetAfter),
				Quota:      Quota{Rate: row.Rate, Period: dbarg.Duration(row.Period), Burst: row.Burst},
			},
			sl:    slot{delay: dbarg.Duration(row.Delay), at: row.Slot},
			tats:  row.Tats,
			bases: row.Bases,
		}
	}
	return out, nil
}

func validateLimits(cost int64, limits []Limit) (policies, keys []string, err error) {
	if cost < 1 || cost > MaxCost {
		return nil, nil, check.Invalid("cost %d is not between 1 and %d", cost, MaxCost)
	}
	if len(limits) == 0 || len(limits) > MaxLimits {
		return nil, nil, check.Invalid("%d limits: a call checks 1 to %d", len(limits), MaxLimits)
	}
	policies = make([]string, len(limits))
	keys = make([]string, len(limits))
	for i, l := range limits {
		if err := check.Name("rate limit policy", l.Policy); err != nil {
			return nil, nil, err
		}
		if err := check.Name("rate limit key", l.Key); err != nil {
			return nil, nil, err
		}
		for _, m := range limits[:i] {
			if m == l {
				return nil, nil, check.Invalid("limit (%q, %q) is given twice", l.Policy, l.Key)
			}
		}
		policies[i], keys[i] = l.Policy, l.Key
	}
	return policies, keys, nil
}

// translate maps the SQL API's errors to this package's: an unknown policy (P0002) to
// ErrUnknownPolicy, a standby's refusal to pgcoord.ErrReadOnly, a bad argument (22023,
// 22004) to pgcoord.ErrInvalidArgument.
func translate(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "P0002":
			return fmt.Errorf("%w: %w", ErrUnknownPolicy, err)
		case "22023", "22004":
			return fmt.Errorf("%w: %w", pgcoord.ErrInvalidArgument, err)
		}
	}
	return base.TranslateError(err)
}
