package listen

import (
	"context"
	"errors"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// Jitter spreads d by ±20% so waiters do not retry in lockstep.
func Jitter(d time.Duration) time.Duration {
	return time.Duration(float64(d) * (0.8 + 0.4*rand.Float64()))
}

// Ambiguous reports whether err leaves unknown whether a statement committed: the
// connection failed after the statement may have been sent. A grant in that state is
// recovered by asking again as the same holder.
func Ambiguous(ctx context.Context, err error) bool {
	if ctx.Err() != nil {
		return false
	}
	var pgErr *pgconn.PgError
	return !errors.As(err, &pgErr) && !pgconn.SafeToRetry(err)
}
