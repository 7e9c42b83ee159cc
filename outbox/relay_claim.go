package outbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgcoord/pgcoord/internal/base"
	"github.com/pgcoord/pgcoord/internal/dbarg"
	"github.com/pgcoord/pgcoord/internal/dbsqlc"
	"github.com/pgcoord/pgcoord/internal/listen"
)

// cursor is the key after which the next claim resumes its walk (of the buckets of the
// relay's partitions, see pgcoord_outbox_claim): keys are served round robin, so a deep backlog of
// some keys never starves the others.
type cursor struct{ topic, key string }

func (c cursor) atStart() bool { return c == cursor{} }

// batch claims one batch from the relay's cursor, delivers it and records the outcomes;
// it returns how many messages it claimed, and whether the claim started from the first
// key (so that claiming nothing means nothing is ready).
func (r *Relay) batch(ctx context.Context) (n int, fromStart bool, err error) {
	defer r.ranBatch()
	defer r.startBatch()()
	r.mu.Lock()
	cur := r.cur
	r.mu.Unlock()
	sent := time.Now()
	rows, err := r.claim(ctx, cur)
	if err != nil {
		return 0, cur.atStart(), err
	}
	// The rows come in claim order: key by key, in the order the claim walked them, each
	// key's messages by id.
	next := cursor{} // the walk found every ready key: start again from the first
	if r.maybeCut(rows) {
		// A limit may have cut the walk short (what it cut off lies after the last key in
		// claim order): resume after that key.
		last := rows[len(rows)-1]
		next = cursor{last.Topic, last.Key}
	}
	r.mu.Lock()
	r.cur = next
	r.mu.Unlock()
	if len(rows) == 0 {
		return 0, cur.atStart(), nil
	}
	r.stats.claims.Add(1)
	r.stats.claimed.Add(int64(len(rows)))
	token := dbarg.Deref(rows[0].ClaimToken)

	// Deliver until a tenth of the TTL before the claim ends, by the local clock counted
	// from the moment the claim was sent.
	dctx, cancel := context.WithDeadline(ctx, sent.Add(r.cfg.ClaimTTL-r.cfg.ClaimTTL/10))
	defer cancel()
	outcomes := r.deliver(dctx, groupByKey(rows))
	return len(rows), cur.atStart(), r.settle(ctx, token, rows, outcomes)
}

// claim claims a batch of the relay's partitions from cur: none when it has no partition
// yet (OnAssign wakes Run when one is granted; behind a pooler, where no notification
// does, the member heartbeats first). When the database finds that the relay
// holds none of the partitions its member lists (its grants lapsed: the member missed a
// heartbeat, or the database clock jumped), the member heartbeats at once, and the claim is
// made again with what it holds then.
func (r *Relay) claim(ctx context.Context, cur cursor) ([]dbsqlc.PgcoordOutbox, error) {
	m, err := r.join(ctx)
	if err != nil || m == nil {
		return nil, err // m is nil while a Leave is under way: claim nothing
	}
	for try := 0; ; try++ {
		owned := m.Owned()
		if len(owned) == 0 {
			if try == 0 && listen.Pooled(r.pool) {
				// Behind a transaction pooler no notification tells the member that a
				// partition was released to it: it asks now, and the next batch claims.
				if err := m.Sync(ctx); err != nil {
					return nil, fmt.Errorf("outbox: the relay's heartbeat failed: %w", err)
				}
			}
			return nil, nil
		}
		partitions := make([]int32, len(owned))
		for i, p := range owned {
			partitions[i] = int32(p.ID)
		}
		rows, err := queries.OutboxClaim(ctx, r.pool, dbsqlc.OutboxClaimParams{
			Claimant: r.cfg.Claimant, MaxRows: int32(r.cfg.BatchSize), KeyLimit: int32(r.cfg.KeyBatchSize),
			MaxBytes: int64(r.cfg.BatchBytes), Ttl: dbarg.Interval(r.cfg.ClaimTTL), Topics: r.topics(),
			AfterTopic: cur.topic, AfterKey: cur.key, GroupName: r.group, Partitions: partitions,
		})
		var pgErr *pgconn.PgError
		if try == 0 && errors.As(err, &pgErr) && pgErr.Code == "PGP01" {
			if err := m.Sync(ctx); err != nil {
				return nil, fmt.Errorf("outbox: claim: the relay's grants lapsed, and its heartbeat failed: %w", err)
			}
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("outbox: claim: %w", base.TranslateError(err))
		}
		return rows, nil
	}
}

func (r *Relay) topics() []string {
	if len(r.cfg.Topics) == 0 {
		return nil
	}
	return r.cfg.Topics
}

// maybeCut reports whether a claim of rows may have been cut short by BatchSize or
// BatchBytes: it has BatchSize messages, or its payloads come within one message's
// largest payload of BatchBytes.
func (r *Relay) maybeCut(rows []dbsqlc.PgcoordOutbox) bool {
	if len(rows) == 0 {
		return false
	}
	bytes := 0
	for _, row := range rows {
		bytes += len(row.Payload)
	}
	return len(rows) == r.cfg.BatchSize || bytes > r.cfg.BatchBytes-MaxPayload
}
