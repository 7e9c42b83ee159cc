package outbox

import (
	"context"
	"fmt"
	"time"

	"github.com/pgcoord/pgcoord/internal/base"
	"github.com/pgcoord/pgcoord/internal/dbarg"
	"github.com/pgcoord/pgcoord/internal/dbsqlc"
)

// settle records the outcomes of one claim in one statement.
func (r *Relay) settle(ctx context.Context, token int64, rows []dbsqlc.PgcoordOutbox, outcomes []outcome) error {
	arg := dbsqlc.OutboxSettleParams{
		Token: token, Delivered: []int64{}, Failed: []int64{}, Errors: []string{}, Released: []int64{},
		MaxAttempts: int32(r.cfg.MaxAttempts), Backoff: dbarg.Interval(r.cfg.Backoff),
		MaxBackoff: dbarg.Interval(r.cfg.MaxBackoff),
	}
	attempts := make(map[int64]int32, len(rows))
	for _, row := range rows {
		attempts[row.ID] = row.Attempts
	}
	for _, o := range outcomes {
		switch {
		case !o.done:
			arg.Released = append(arg.Released, o.id)
		case o.err == nil:
			arg.Delivered = append(arg.Delivered, o.id)
		default:
			arg.Failed = append(arg.Failed, o.id)
			arg.Errors = append(arg.Errors, o.err.Error())
		}
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	got, err := queries.OutboxSettle(sctx, r.pool, arg)
	if err != nil {
		return fmt.Errorf("outbox: record outcomes of claim %d: %w", token, base.TranslateError(err))
	}
	// Counted as the database recorded them: the outcomes it refused (the claim was taken
	// over) are Fenced, not Delivered, Failed or Released, so the counts add up to Claimed.
	r.stats.delivered.Add(int64(got.Delivered))
	r.stats.failed.Add(int64(got.Failed))
	r.stats.dead.Add(int64(got.Dead))
	r.stats.released.Add(int64(got.Released))
	log := r.cfg.Logger
	fenced := len(outcomes) - int(got.Delivered+got.Failed+got.Released)
	if fenced > 0 {
		r.stats.fenced.Add(int64(fenced))
		log.Warn("outbox: outcomes refused: the claim was taken over by another relay", "claimant", r.cfg.Claimant,
			"claim_token", token, "refused", fenced, "of", len(outcomes))
	}
	for i, id := range arg.Failed {
		switch {
		case fenced > 0:
			log.Warn("outbox: delivery failed; its outcome may have been refused", "id", id, "error", arg.Errors[i])
		case int(attempts[id])+1 >= r.cfg.MaxAttempts:
			log.Error("outbox: message is dead", "id", id, "attempts", attempts[id]+1, "error", arg.Errors[i])
		default:
			log.Warn("outbox: delivery failed; will retry", "id", id, "attempts", attempts[id]+1, "error", arg.Errors[i])
		}
	}
	return nil
}
