// Package dbarg converts between the Go values of pgcoord's public API and the argument and
// result types of the sqlc-generated queries.
package dbarg

import (
	"time"

	"github.com/jackc/pgx/v5/pgtype"
)

// Interval is d as a Postgres interval, to microsecond precision.
func Interval(d time.Duration) pgtype.Interval {
	return pgtype.Interval{Microseconds: d.Microseconds(), Valid: true}
}

// Duration converts an interval read from the database (a month counted as 30 days).
func Duration(iv pgtype.Interval) time.Duration {
	return time.Duration(iv.Microseconds)*time.Microsecond +
		time.Duration(iv.Days)*24*time.Hour + time.Duration(iv.Months)*30*24*time.Hour
}

// Deref returns *p, or the zero value for a nil p (a NULL column).
func Deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}
