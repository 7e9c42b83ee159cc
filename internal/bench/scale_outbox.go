package bench

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/outbox"
)

// The outbox's scale scenarios: scale.relays.N, N relays sharing one standing backlog
// (does adding relays add throughput?), and outbox.throughput's drain beside N delivered
// messages that GC has not pruned yet (scale.outbox_drain.N) or beside N keys parked
// behind a delayed message (scale.outbox_parked.N), which every claim walks past.

// The shape of scale.relays: the backlog and its keys (divided by scaleDivisor in tests),
// the relays' claims, and how many messages one op delivers (as many as eight full claims,
// so that each of 8 relays claims once per op and 1 relay eight times).
const (
	scaleRelayBacklog    = 200000
	scaleRelayKeys       = 20000
	scaleRelayBatch      = OutboxClaimBatch
	scaleRelayOpMessages = 8 * scaleRelayBatch
)

// The scale scenarios' topics.
const (
	scaleRelayTopic  = "bench.scale.relays"
	scaleDrainTopic  = "bench.scale.drain"
	scaleParkedTopic = "bench.scale.parked"
)

// loadOutbox runs one statement that writes messages, then vacuums and analyzes the outbox
// as autovacuum would before long (its insert thresholds are low).
func loadOutbox(ctx context.Context, pool *pgxpool.Pool, sql string, args ...any) error {
	if _, err := pool.Exec(ctx, sql, args...); err != nil {
		return fmt.Errorf("load pgcoord_outbox: %w", err)
	}
	_, err := pool.Exec(ctx, "VACUUM ANALYZE pgcoord_outbox")
	return err
}

// writeRelayMessages writes n messages of scale.relays behind the backlog, each to a random
// one of its keys: plain rows in one statement (no per-key lock: a standing backlog, not
// an enqueue, is what is measured).
const writeRelayMessages = `INSERT INTO pgcoord_outbox (topic, key, payload)
SELECT $1, 'k' || floor(random() * $2::int)::int, $3 FROM generate_series(1, $4::int)`

// loadRelayBacklog writes scale.relays' standing backlog; the size (relays) does not change it.
func loadRelayBacklog(ctx context.Context, pool *pgxpool.Pool, _ int) error {
	return loadOutbox(ctx, pool, writeRelayMessages, scaleRelayTopic, scaled(scaleRelayKeys), outboxPayload, scaled(scaleRelayBacklog))
}

// loadDeliveredMessages writes n delivered messages of scale.outbox_drain's topic, over the
// keys its workers write to.
func loadDeliveredMessages(ctx context.Context, pool *pgxpool.Pool, n int) error {
	return loadOutbox(ctx, pool, `
		INSERT INTO pgcoord_outbox (topic, key, payload, state, delivered_at)
		SELECT $1, 'w' || (g % 8) || '-' || (g % $2::int), $3, 'delivered', pgcoord_now()
		  FROM generate_series(1, $4::int) g`, scaleDrainTopic, OutboxKeys, outboxPayload, n)
}

// loadParkedKeys writes n keys of scale.outbox_parked's topic, each with one message due in
// a day: a reminder per order, say. Its key's later messages would wait behind it; a claim
// passes over the key.
func loadParkedKeys(ctx context.Context, pool *pgxpool.Pool, n int) error {
	return loadOutbox(ctx, pool, `
		INSERT INTO pgcoord_outbox (topic, key, payload, available_at)
		SELECT $1, 'parked-' || g, $2, pgcoord_now() + interval '1 day'
		  FROM generate_series(1, $3::int) g`, scaleParkedTopic, outboxPayload, n)
}

// noopRelay returns a relay of topic on pool whose handler delivers everything. It leaves
// its partition group when w's measurement ends.
func noopRelay(w Worker, pool *pgxpool.Pool, topic, claimant string, batch int) (*outbox.Relay, error) {
	r, err := outbox.NewRelay(pool, &outbox.Config{
		Handler:   outbox.HandlerFunc(func(context.Context, outbox.Message) error { return nil }),
		BatchSize: batch, Claimant: claimant, Topics: []string{topic},
	})
	if err != nil {
		return nil, err
	}
	w.Cleanup(func() { leaveRelay(r) })
	return r, nil
}

// settleRelay makes r, a relay of topic, join its partition group (a batch: it delivers what its partitions
// hold) and waits until it holds every partition the group's plan gives it, so that a
// measurement starts with the relays settled, as long-running relays are: relays that all
// join at its start would spend its first second moving partitions (each move waits for
// its holder's batch under way). Without batches running, a move takes a heartbeat.
func settleRelay(ctx context.Context, pool *pgxpool.Pool, r *outbox.Relay, topic string) error {
	deadline := time.Now().Add(time.Minute)
	for {
		if _, err := r.RunBatch(ctx); err != nil {
			return err
		}
		var held, planned int
		if err := pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE holder = $2 AND expires_at > pgcoord_now()),
		                                     count(*) FILTER (WHERE target = $2)
		                                FROM pgcoord_partitions WHERE group_name = $1`,
			outbox.GroupName([]string{topic}), r.Claimant()).Scan(&held, &planned); err != nil {
			return err
		}
		if planned > 0 && held == planned {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("relay %s holds %d of its %d partitions after a minute", r.Claimant(), held, planned)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// leaveRelay makes r leave its partition group, which stops its heartbeats. On a pool
// closed for idleness the group is not told: the relay's lease expires instead.
func leaveRelay(r *outbox.Relay) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = r.Leave(ctx)
}

// deliverOwn runs relay's batches until it has delivered want messages more than before,
// or a claim finds none (other relays took the rest).
func deliverOwn(ctx context.Context, relay *outbox.Relay, want int64) error {
	before := relay.Stats().Delivered
	for relay.Stats().Delivered-before < want {
		claimed, err := relay.RunBatch(ctx)
		if err != nil {
			return fmt.Errorf("relay: %w", err)
		}
		if claimed == 0 {
			break
		}
	}
	if s := relay.Stats(); s.Failed+s.Fenced+s.Released > 0 {
		return fmt.Errorf("relay stats %+v: a no-op handler must deliver everything", s)
	}
	return nil
}

// onPool keeps what a worker builds on its pool (relays), building it again when the
// pool was closed for idleness and reopened, after dropping what it built on the old one.
type onPool[T any] struct {
	pool *pgxpool.Pool
	v    T
	drop func(T)
}

func (o *onPool[T]) get(pool *pgxpool.Pool, build func(*pgxpool.Pool) (T, error)) (T, error) {
	if o.pool != pool {
		if o.pool != nil && o.drop != nil {
			o.drop(o.v)
		}
		v, err := build(pool)
		if err != nil {
			return v, err
		}
		o.pool, o.v = pool, v
	}
	return o.v, nil
}

func newScaleRelaysOp(w Worker, n int) scaleOp {
	relays := onPool[[]*outbox.Relay]{drop: func(rs []*outbox.Relay) {
		for _, r := range rs {
			leaveRelay(r)
		}
	}}
	want := int64(scaled(scaleRelayOpMessages))
	return func(ctx context.Context, pool *pgxpool.Pool) error {
		rs, err := relays.get(pool, func(pool *pgxpool.Pool) ([]*outbox.Relay, error) {
			rs := make([]*outbox.Relay, n)
			for i := range rs {
				var err error
				// One claimant per relay and worker for the whole bench: a relay built again
				// takes the place (and the partitions) of the one before.
				if rs[i], err = noopRelay(w, pool, scaleRelayTopic, "scale-relays-"+strconv.Itoa(w.ID)+"-"+strconv.Itoa(i), scaleRelayBatch); err != nil {
					return nil, err
				}
			}
			return rs, nil
		})
		if err != nil {
			return fmt.Errorf("bench: scale.relays: %w", err)
		}
		var delivered atomic.Int64
		errs := make([]error, len(rs))
		var wg sync.WaitGroup
		for i, r := range rs {
			wg.Go(func() {
				for delivered.Load() < want {
					k, err := r.RunBatch(ctx)
					if err != nil {
						errs[i] = err
						return
					}
					if k == 0 {
						return
					}
					delivered.Add(int64(k))
				}
			})
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			return fmt.Errorf("bench: scale.relays: %w", err)
		}
		d := delivered.Load()
		if d == 0 {
			return errors.New("bench: scale.relays: no relay claimed anything from the standing backlog")
		}
		for _, r := range rs {
			if s := r.Stats(); s.Failed+s.Fenced+s.Released > 0 {
				return fmt.Errorf("bench: scale.relays: relay stats %+v: a no-op handler must deliver everything", s)
			}
		}
		// As many behind the backlog, so that it stands at its size.
		if _, err := pool.Exec(ctx, writeRelayMessages, scaleRelayTopic, scaled(scaleRelayKeys), outboxPayload, d); err != nil {
			return fmt.Errorf("bench: scale.relays: refill the backlog: %w", err)
		}
		setUnits(ctx, d)
		return nil
	}
}

// newEnqueueDeliverOp returns the op of scale.outbox_drain and scale.outbox_parked (named
// name): outbox.throughput's loop on topic, whatever the size loaded beside it.
func newEnqueueDeliverOp(name, topic string) func(w Worker, n int) scaleOp {
	return func(w Worker, _ int) scaleOp {
		relay := onPool[*outbox.Relay]{drop: leaveRelay}
		n := 0
		return func(ctx context.Context, pool *pgxpool.Pool) error {
			r, err := relay.get(pool, func(pool *pgxpool.Pool) (*outbox.Relay, error) {
				return noopRelay(w, pool, topic, name+"-"+strconv.Itoa(w.ID), OutboxClaimBatch)
			})
			if err != nil {
				return fmt.Errorf("bench: %s: %w", name, err)
			}
			msgs := outboxBatch(w, topic, &n)
			if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				_, err := outbox.EnqueueBatch(ctx, tx, msgs)
				return err
			}); err != nil {
				return fmt.Errorf("bench: %s: enqueue: %w", name, err)
			}
			if err := deliverOwn(ctx, r, OutboxBatchMessages); err != nil {
				return fmt.Errorf("bench: %s: %w", name, err)
			}
			return nil
		}
	}
}
