package ratelimit

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/internal/dbarg"
	"github.com/pgcoord/pgcoord/internal/dbsqlc"
	"github.com/pgcoord/pgcoord/pgcoord"
)

// MaxWait is the longest a reservation may wait for its slot.
const MaxWait = 24 * time.Hour

// ErrTooLong is returned by Wait when the call's slot would come after its context's
// deadline: nothing was charged.
var ErrTooLong = errors.New("ratelimit: the next free slot comes after the context's deadline")

// Reservation is a slot in time that Reserve charged: act after Delay.
type Reservation struct {
	Decision
	// Delay is how long after the call its slot comes (0: now); the call's binding policy
	// (Decision.Policy) is the one whose slot is latest.
	Delay time.Duration
	// At is the slot's instant by the database clock (when refused: the instant the same
	// call would be admitted). Compare it with other reservations' At, not with this
	// process's clock.
	At time.Time

	limits []Limit
	tats   []time.Time // each limit's arrival time after the charge...
	bases  []time.Time // ...and before it: what Cancel puts back
}

// Reserve charges cost units to every limit at its next free slot, all or nothing, if no
// slot is more than maxWait (0 to MaxWait) away; otherwise it charges nothing and the
// Decision says when to retry. Calls on a key get slots in the order they reach its row:
// first come, first served, across processes. Act after r.Delay; if you will not act,
// Cancel. db may be the caller's transaction, but then the keys stay locked until it
// ends: Wait, which commits at once, is the usual way to wait.
func Reserve(ctx context.Context, db pgcoord.DBTX, cost int64, limits []Limit, maxWait time.Duration, opts *Opts) (_ Reservation, err error) {
	if err := check.DB(db); err != nil {
		return Reservation{}, err
	}
	policies, keys, err := validateLimits(cost, limits)
	if err != nil {
		return Reservation{}, err
	}
	if maxWait < 0 || maxWait > MaxWait {
		return Reservation{}, check.Invalid("max wait %v is not between 0 and %v", maxWait, MaxWait)
	}
	if opts != nil && opts.Tracer != nil {
		var end func(error)
		ctx, end = startSpan(ctx, opts.Tracer, policies[0], keys[0], cost)
		defer func() { end(err) }()
	}
	o, err := call(ctx, request{db: db, policies: policies, keys: keys, cost: cost, maxWait: dbarg.Interval(maxWait)})
	if err != nil {
		return Reservation{}, err
	}
	if opts != nil {
		opts.Metrics.record(o.d, limits)
	}
	return Reservation{Decision: o.d, Delay: o.sl.delay, At: o.sl.at, limits: limits, tats: o.tats, bases: o.bases}, nil
}

// Cancel gives a reservation's units back, on every key where no later call has charged
// since (there the key is as if the reservation had not been made); on a key charged
// since, the slot goes unused: the limit is never exceeded, and a cancelled slot never
// moves a later caller's. Cancel a reservation only before acting on it.
func (r Reservation) Cancel(ctx context.Context, db pgcoord.DBTX) error {
	if !r.Allowed {
		return nil
	}
	if err := check.DB(db); err != nil {
		return err
	}
	policies := make([]string, len(r.limits))
	keys := make([]string, len(r.limits))
	for i, l := range r.limits {
		policies[i], keys[i] = l.Policy, l.Key
	}
	_, err := queries.RatelimitCancel(ctx, db, dbsqlc.RatelimitCancelParams{
		Policies: policies, Keys: keys, Tats: r.tats, Bases: r.bases,
	})
	return translate(err)
}

// cancelReservation cancels r for a call whose ctx may have ended, bounded by 5 s.
func cancelReservation(ctx context.Context, pool *pgxpool.Pool, r Reservation) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	_ = r.Cancel(cctx, pool)
}

// Wait waits in line for cost units of every limit: it reserves the next free slots
// (committed at once, with pool), sleeps until they come, holding no connection, and
// returns the reservation it waited for. It returns ErrTooLong if the slot would come
// after ctx's deadline (or more than MaxWait away): as the database judged it, charging
// nothing, or — when the call first waited for the keys' locks, so that its slot turns out
// to lie past the deadline only once the reply arrives — cancelling the reservation (see
// Reservation.Cancel: its units go back unless a later call reserved since). If ctx ends
// while it sleeps, it cancels the reservation and returns ctx's error.
func Wait(ctx context.Context, pool *pgxpool.Pool, cost int64, limits []Limit, opts *Opts) (Reservation, error) {
	if pool == nil {
		return Reservation{}, check.Invalid("nil pool")
	}
	maxWait := MaxWait
	dl, hasDeadline := ctx.Deadline()
	if hasDeadline {
		maxWait = min(max(time.Until(dl), 0), MaxWait)
	}
	r, err := Reserve(ctx, pool, cost, limits, maxWait.Truncate(time.Microsecond), opts)
	if err != nil {
		return Reservation{}, err
	}
	if !r.Allowed {
		return r, ErrTooLong
	}
	if hasDeadline && time.Now().Add(r.Delay).After(dl) {
		// The call waited (for the keys' locks) long enough that its slot, within the max
		// wait when the database judged it, now lies past the deadline: give it back.
		cancelReservation(ctx, pool, r)
		return r, ErrTooLong
	}
	// The slot is Delay after the database judged the call, which was before its reply
	// arrived: sleeping Delay from now can only be late, never early.
	if r.Delay > 0 {
		t := time.NewTimer(r.Delay)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			cancelReservation(ctx, pool, r)
			return Reservation{}, ctx.Err()
		}
	}
	return r, nil
}
