package gocronpg

import (
	"context"
	"errors"
	"fmt"

	"github.com/go-co-op/gocron/v2"

	"github.com/pgcoord/pgcoord/internal/base"
	"github.com/pgcoord/pgcoord/leases"
)

// check makes this package's argument errors ("gocronpg: cause").
var check = base.Check("gocronpg")

// ErrNotLeader is returned by Elector.IsLeader while this replica does not lead.
var ErrNotLeader = errors.New("gocronpg: not the leader")

// Elector is a gocron.Elector backed by a leases.Elector: a scheduler given
// gocron.WithDistributedElector(elector) runs its jobs only while this replica leads.
//
// The caller runs the leases.Elector (its Run, in a goroutine, for as long as the
// scheduler runs); the adapter starts nothing. So one leases.Elector can also drive other
// leader-only work through its callbacks, and its lifetime — and resignation at shutdown,
// which hands leadership over at once — stays in the caller's hands. Stop the scheduler
// before cancelling the leases.Elector's Run, so that no job starts after the resignation.
type Elector struct {
	e *leases.Elector
}

var _ gocron.Elector = (*Elector)(nil)

// NewElector returns an Elector asking e. It returns an error wrapping
// pgcoord.ErrInvalidArgument if e is nil.
func NewElector(e *leases.Elector) (*Elector, error) {
	if e == nil {
		return nil, check.Invalid("nil leases.Elector")
	}
	return &Elector{e: e}, nil
}

// IsLeader returns nil if this replica leads now (leases.Elector.IsLeader), and an error
// wrapping ErrNotLeader, naming the leader last observed, otherwise. gocron calls it
// before each job run and skips the run on an error. It runs no SQL.
func (a *Elector) IsLeader(context.Context) error {
	if a.e.IsLeader() {
		return nil
	}
	if l := a.e.ObservedLeader(); l != "" && l != a.e.Holder() {
		return fmt.Errorf("%w: %q leads %q", ErrNotLeader, l, a.e.Name())
	}
	return fmt.Errorf("%w of %q", ErrNotLeader, a.e.Name())
}

// Lease returns the grant this replica leads with, and true, while it leads: a job fences
// its writes with the lease's Token (package fenced), because gocron checks leadership only
// before it starts a job.
func (a *Elector) Lease() (leases.Lease, bool) { return a.e.Leader() }
