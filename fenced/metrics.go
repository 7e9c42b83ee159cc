package fenced

import (
	"fmt"
	"sync/atomic"
)

// RefusalCounts are the writes this process's calls of this package refused since it
// started. The database cannot keep these counts: a refused write's transaction rolls
// back, taking anything it recorded with it.
type RefusalCounts struct {
	// Stale counts ErrStale returned by Check, Write and Exec (the guard trigger's
	// refusals included).
	Stale int64
	// LeaseLost counts CheckLease calls that found the grant no longer current.
	LeaseLost int64
}

// Refusals returns the counts of the writes refused so far by this process's calls of
// this package, all together: the calls take no options, so their counts are the
// process's. Package metrics exports them (metrics.Opts.Fenced).
func Refusals() RefusalCounts {
	return RefusalCounts{Stale: refusals.stale.Load(), LeaseLost: refusals.leaseLost.Load()}
}

// refusals are the counters behind Refusals.
var refusals struct{ stale, leaseLost atomic.Int64 }

// stale counts a refusal and returns ErrStale with the detail given.
func stale(format string, args ...any) error {
	refusals.stale.Add(1)
	return fmt.Errorf("%w: "+format, append([]any{ErrStale}, args...)...)
}
