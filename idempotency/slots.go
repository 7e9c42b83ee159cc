package idempotency

import (
	"runtime"
	"sync"
	"weak"

	"github.com/jackc/pgx/v5/pgxpool"
)

// atomicSlots holds, for each pool that has had an Atomic attempt, the slots of its Atomic
// share: a buffered channel of MaxConns/2 places. An Atomic attempt holds a connection
// while its handler runs, and the handler may need one of its own: with at most half of
// the connections held by attempts, every handler that holds at most one connection at a
// time finds one. The entry goes away with its pool.
var atomicSlots sync.Map // weak.Pointer[pgxpool.Pool] -> chan struct{}

// atomicSlot takes a slot of pool's Atomic share and returns the function that gives it
// back, or ErrBusy when all are taken (it never waits), or an error wrapping
// pgcoord.ErrInvalidArgument for a pool of fewer than 2 connections.
func atomicSlot(pool *pgxpool.Pool) (func(), error) {
	wp := weak.Make(pool)
	v, ok := atomicSlots.Load(wp)
	if !ok {
		n := pool.Stat().MaxConns() / 2
		if n < 1 {
			return nil, check.Invalid("an Atomic attempt holds a connection while its handler runs: its pool needs MaxConns of at least 2, not %d", pool.Stat().MaxConns())
		}
		var loaded bool
		if v, loaded = atomicSlots.LoadOrStore(wp, make(chan struct{}, n)); !loaded {
			runtime.AddCleanup(pool, func(k weak.Pointer[pgxpool.Pool]) { atomicSlots.Delete(k) }, wp)
		}
	}
	slots := v.(chan struct{})
	select {
	case slots <- struct{}{}:
		return func() { <-slots }, nil
	default:
		return nil, ErrBusy
	}
}
