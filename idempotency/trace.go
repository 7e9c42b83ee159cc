package idempotency

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/internal/tracing"
)

// beginTraced is begin in a span of o.Tracer, which records the outcome and, for a
// replay, an event with the stored status.
func beginTraced(ctx context.Context, pool *pgxpool.Pool, scope, key string, fingerprint []byte, o BeginOpts) (*Attempt, error) {
	ctx, span := tracing.Start(ctx, o.Tracer, tracing.IdemBegin,
		tracing.Str(tracing.AttrScope, scope), tracing.Str(tracing.AttrIdemKey, key))
	a, err := begin(ctx, pool, scope, key, fingerprint, o)
	var outcome string
	switch {
	case err == nil && a.replay != nil:
		outcome = "replay"
		span.Event(tracing.EventIdemReplay, tracing.Int(tracing.AttrStatus, int64(a.replay.Status)))
	case err == nil && a.attempts > 1:
		outcome = "recovery"
	case err == nil:
		outcome = "first"
	case errors.Is(err, ErrInFlight):
		outcome = "in_flight"
	case errors.Is(err, ErrMismatch):
		outcome = "mismatch"
	case errors.Is(err, ErrExpired):
		outcome = "expired"
	}
	if outcome != "" {
		span.Set(tracing.Str(tracing.AttrOutcome, outcome))
	}
	if err == nil && a.replay == nil {
		span.Set(tracing.Int(tracing.AttrAttempt, int64(a.attempts)))
	}
	span.End(err)
	return a, err
}
