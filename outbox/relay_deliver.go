package outbox

import (
	"context"
	"fmt"
	"slices"
	"sync"

	"github.com/pgcoord/pgcoord/internal/dbsqlc"
	"github.com/pgcoord/pgcoord/internal/tracing"
)

// outcome is what became of one claimed message.
type outcome struct {
	id   int64
	err  error // nil: delivered
	done bool  // false: released untried
}

// groupByKey splits rows, in claim order (each key's messages together, by id), into one
// slice per key.
func groupByKey(rows []dbsqlc.PgcoordOutbox) [][]dbsqlc.PgcoordOutbox {
	var groups [][]dbsqlc.PgcoordOutbox
	start := 0
	for i := 1; i <= len(rows); i++ {
		if i == len(rows) || rows[i].Topic != rows[start].Topic || rows[i].Key != rows[start].Key {
			groups = append(groups, rows[start:i])
			start = i
		}
	}
	return groups
}

// deliver runs the handler over the groups, Concurrency keys at a time, and returns the
// outcome of every message.
func (r *Relay) deliver(ctx context.Context, groups [][]dbsqlc.PgcoordOutbox) []outcome {
	results := make([][]outcome, len(groups))
	if r.cfg.Concurrency == 1 || len(groups) == 1 {
		for i, g := range groups {
			results[i] = r.deliverKey(ctx, g)
		}
	} else {
		next := make(chan int)
		var wg sync.WaitGroup
		for range min(r.cfg.Concurrency, len(groups)) {
			wg.Go(func() {
				for i := range next {
					results[i] = r.deliverKey(ctx, groups[i])
				}
			})
		}
		for i := range groups {
			next <- i
		}
		close(next)
		wg.Wait()
	}
	return slices.Concat(results...)
}

// deliverKey delivers the messages of one key in order, stopping at the first failure:
// the messages behind it are released untried, so the key keeps its order.
func (r *Relay) deliverKey(ctx context.Context, msgs []dbsqlc.PgcoordOutbox) []outcome {
	out := make([]outcome, len(msgs))
	stopped := false
	for i, row := range msgs {
		out[i].id = row.ID
		if stopped || ctx.Err() != nil {
			continue
		}
		err := r.handle(ctx, messageFrom(row))
		if err != nil && ctx.Err() != nil {
			stopped = true // stopped by shutdown or the claim's deadline: not the message's fault
			continue
		}
		out[i].done, out[i].err = true, err
		stopped = err != nil
	}
	return out
}

// handle calls the handler, turning a panic into an error. With a Tracer, it does so in a
// span continuing the trace of the message's headers.
func (r *Relay) handle(ctx context.Context, msg Message) (err error) {
	if t := r.cfg.Tracer; t != nil {
		var span tracing.Span
		ctx, span = tracing.Start(t.Extract(ctx, msg.Headers), t, tracing.OutboxDeliver,
			tracing.Str(tracing.AttrTopic, msg.Topic), tracing.Str(tracing.AttrMsgKey, msg.Key),
			tracing.Int(tracing.AttrMsgID, msg.ID), tracing.Int(tracing.AttrAttempt, int64(msg.Attempts)+1),
			tracing.Int(tracing.AttrToken, msg.ClaimToken))
		defer func() { span.End(err) }() // after the recovery below
	}
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("outbox: handler panicked: %v", p)
		}
	}()
	return r.cfg.Handler.Handle(ctx, msg)
}
