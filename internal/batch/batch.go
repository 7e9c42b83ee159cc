// Package batch runs pgcoord's garbage collectors: a DELETE of at most a batch of rows,
// repeated, each its own statement — with a pool, its own short transaction — so that a
// collection never holds locks for long nor leaves one huge transaction's worth of dead
// rows behind.
package batch

import "context"

// Delete calls del, which deletes at most size rows and returns how many it deleted, until
// a call deletes fewer than size, and returns the total. With dryRun it calls count once
// instead, which returns how many rows del would delete, and deletes nothing. progress, if
// not nil, receives the total after each call that deleted rows (with dryRun, the count).
// Delete stops at the first error or when ctx ends, and returns the total so far with the
// error.
func Delete(ctx context.Context, size int, dryRun bool, progress func(int64),
	count, del func(context.Context) (int64, error)) (total int64, err error) {
	if progress == nil {
		progress = func(int64) {}
	}
	if dryRun {
		n, err := count(ctx)
		if err != nil {
			return 0, err
		}
		progress(n)
		return n, nil
	}
	for {
		if err := ctx.Err(); err != nil {
			return total, err
		}
		n, err := del(ctx)
		if err != nil {
			return total, err
		}
		total += n
		if n > 0 {
			progress(total)
		}
		if n < int64(size) {
			return total, nil
		}
	}
}
