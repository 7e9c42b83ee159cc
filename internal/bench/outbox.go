package bench

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/outbox"
)

// The outbox scenarios and their raw-SQL floors (named outbox.floor_*).
const (
	// FloorOutboxInsert is outbox.enqueue's floor: the same transaction with plain INSERTs
	// of the same rows into a copy of pgcoord_outbox (same columns, indexes and storage
	// parameters; no key lock, no wake-up check).
	FloorOutboxInsert = "outbox.floor_insert"
	// FloorOutboxInsertBatch is outbox.enqueue_batch's floor: one multi-row INSERT.
	FloorOutboxInsertBatch = "outbox.floor_insert_batch"
	// FloorOutboxThroughput is outbox.throughput's floor: the usual hand-written outbox,
	// a multi-row INSERT, then claims of the oldest 1000 pending rows with FOR UPDATE SKIP
	// LOCKED and one UPDATE marking them delivered, with no per-key order and no fencing.
	FloorOutboxThroughput = "outbox.floor_throughput"
)

// Shapes of the outbox scenarios.
const (
	// OutboxTxMessages is how many messages one outbox.enqueue transaction writes, one
	// statement each.
	OutboxTxMessages = 10
	// OutboxBatchMessages is how many messages one op of outbox.enqueue_batch and
	// outbox.throughput writes in one statement, and delivers.
	OutboxBatchMessages = 100
	// OutboxKeys is how many ordering keys each worker spreads its messages over.
	OutboxKeys = 1000
	// OutboxClaimBatch is the batch size of the throughput scenarios' claims.
	OutboxClaimBatch = 1000
)

// The floors' outbox tables: a copy of pgcoord_outbox for the enqueue floors, which leave
// every row pending, and a hand-written outbox for the throughput floor, which delivers them.
const (
	floorOutboxTable      = "bench_outbox"
	floorOutboxRelayTable = "bench_outbox_relay"
)

// The scenarios' topics: the enqueue scenarios leave their messages pending, and
// outbox.throughput deletes them before it measures, so its relays see only its own.
const (
	outboxEnqueueTopic    = "bench.enqueue"
	outboxThroughputTopic = "bench.throughput"
)

func init() {
	Register(Scenario{
		Name: "outbox.enqueue",
		Description: fmt.Sprintf("a transaction of %d outbox.Enqueue calls (one statement each, keys spread per worker), "+
			"then COMMIT: ops/s is transactions/s", OutboxTxMessages),
		Floor:     FloorOutboxInsert,
		NewWorker: newOutboxEnqueueWorker,
	})
	Register(Scenario{
		Name:        FloorOutboxInsert,
		Description: fmt.Sprintf("raw SQL: a transaction of %d single-row INSERTs of the same rows into a copy of pgcoord_outbox (no lock, no wake-up check), then COMMIT", OutboxTxMessages),
		Floor:       "floor.select1",
		Setup:       setupOutboxFloor,
		NewWorker:   newOutboxFloorInsertWorker,
	})
	Register(Scenario{
		Name: "outbox.enqueue_batch",
		Description: fmt.Sprintf("one outbox.EnqueueBatch of %d messages in a transaction, then COMMIT: ops/s x %d is messages/s",
			OutboxBatchMessages, OutboxBatchMessages),
		Floor:     FloorOutboxInsertBatch,
		NewWorker: newOutboxEnqueueBatchWorker,
	})
	Register(Scenario{
		Name:        FloorOutboxInsertBatch,
		Description: fmt.Sprintf("raw SQL: one INSERT of %d rows (unnest) into a copy of pgcoord_outbox (no lock, no wake-up check), in a transaction", OutboxBatchMessages),
		Floor:       "floor.select1",
		Setup:       setupOutboxFloor,
		NewWorker:   newOutboxFloorInsertBatchWorker,
	})
	Register(Scenario{
		Name: "outbox.throughput",
		Description: fmt.Sprintf("end to end (on an outbox cleared of the enqueue scenarios' messages and vacuumed): each worker commits an EnqueueBatch of %d messages, then runs batches of its own "+
			"relay (claims of up to %d, a no-op handler, outcomes marked) until it has delivered %d or none is left: "+
			"ops/s x %d is messages/s", OutboxBatchMessages, OutboxClaimBatch, OutboxBatchMessages, OutboxBatchMessages),
		Floor:     FloorOutboxThroughput,
		Setup:     setupSharedPool,
		NewWorker: newOutboxThroughputWorker,
	})
	Register(Scenario{
		Name: FloorOutboxThroughput,
		Description: fmt.Sprintf("raw SQL in the loop of outbox.throughput: an INSERT of %d rows, then claims of the oldest %d "+
			"pending rows (FOR UPDATE SKIP LOCKED) each marked delivered by one UPDATE, no key order, no fencing",
			OutboxBatchMessages, OutboxClaimBatch),
		Floor:     "floor.select1",
		Setup:     setupOutboxFloor,
		NewWorker: newOutboxFloorThroughputWorker,
	})
}

func setupOutboxFloor(ctx context.Context, pool *pgxpool.Pool) error {
	// The enqueue floors write the very rows Enqueue writes, into a copy of pgcoord_outbox:
	// its columns, defaults, indexes (the per-key one too) and storage parameters; so the
	// ratio is the price of the API itself — validation, the per-key ordering lock, the
	// wake-up check. The throughput floor is the usual
	// hand-written outbox: an id index only, no key order.
	_, err := pool.Exec(ctx, `
		CREATE TABLE IF NOT EXISTS `+floorOutboxTable+` (LIKE pgcoord_outbox INCLUDING ALL);
		DO $$ BEGIN
			EXECUTE format('ALTER TABLE `+floorOutboxTable+` SET (%s)',
				(SELECT array_to_string(reloptions, ', ') FROM pg_class WHERE oid = 'pgcoord_outbox'::regclass));
		END $$;
		CREATE TABLE IF NOT EXISTS `+floorOutboxRelayTable+` (
			id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
			topic        text NOT NULL,
			key          text NOT NULL,
			payload      bytea NOT NULL,
			headers      jsonb NOT NULL DEFAULT '{}',
			state        text NOT NULL DEFAULT 'pending',
			created_at   timestamptz NOT NULL DEFAULT now(),
			delivered_at timestamptz
		);
		CREATE INDEX IF NOT EXISTS `+floorOutboxRelayTable+`_pending ON `+floorOutboxRelayTable+` (id) WHERE state = 'pending'`)
	return err
}

// outboxPayload is the payload of every bench message: a small JSON document.
var outboxPayload = []byte(`{"event":"order_placed","order":"o-123456","total_cents":1999}`)

// outboxKey is the n-th key of worker w.
func outboxKey(w Worker, n int) string { return fmt.Sprintf("w%d-%d", w.ID, n%OutboxKeys) }

// outboxInTx runs fn in a transaction on the worker's connection and commits.
func outboxInTx(ctx context.Context, w Worker, name string, fn func(tx pgx.Tx) error) error {
	if err := pgx.BeginFunc(ctx, w.Conn, fn); err != nil {
		return fmt.Errorf("bench: %s: %w", name, err)
	}
	return nil
}

func newOutboxEnqueueWorker(_ context.Context, w Worker) (Op, error) {
	n := 0
	return func(ctx context.Context) error {
		return outboxInTx(ctx, w, "outbox.enqueue", func(tx pgx.Tx) error {
			for range OutboxTxMessages {
				n++
				m := outbox.Message{Topic: outboxEnqueueTopic, Key: outboxKey(w, n), Payload: outboxPayload, JSON: true}
				if _, err := outbox.Enqueue(ctx, tx, m); err != nil {
					return err
				}
			}
			return nil
		})
	}, nil
}

// floorOutboxInsert writes the row Enqueue writes: the same topic, key, payload and JSON
// flag, the headers and times by the columns' defaults.
const floorOutboxInsert = `INSERT INTO ` + floorOutboxTable + ` (topic, key, payload, is_json) VALUES ($1, $2, $3, $4) RETURNING id`

func newOutboxFloorInsertWorker(_ context.Context, w Worker) (Op, error) {
	n := 0
	return func(ctx context.Context) error {
		return outboxInTx(ctx, w, FloorOutboxInsert, func(tx pgx.Tx) error {
			for range OutboxTxMessages {
				n++
				var id int64
				if err := tx.QueryRow(ctx, floorOutboxInsert, outboxEnqueueTopic, outboxKey(w, n), outboxPayload, true).Scan(&id); err != nil {
					return err
				}
			}
			return nil
		})
	}, nil
}

// outboxBatch returns the next batch of worker w's messages to topic.
func outboxBatch(w Worker, topic string, n *int) []outbox.Message {
	msgs := make([]outbox.Message, OutboxBatchMessages)
	for i := range msgs {
		*n++
		msgs[i] = outbox.Message{Topic: topic, Key: outboxKey(w, *n), Payload: outboxPayload, JSON: true}
	}
	return msgs
}

func newOutboxEnqueueBatchWorker(_ context.Context, w Worker) (Op, error) {
	n := 0
	return func(ctx context.Context) error {
		msgs := outboxBatch(w, outboxEnqueueTopic, &n)
		return outboxInTx(ctx, w, "outbox.enqueue_batch", func(tx pgx.Tx) error {
			_, err := outbox.EnqueueBatch(ctx, tx, msgs)
			return err
		})
	}, nil
}

const floorOutboxInsertBatch = `INSERT INTO %s (topic, key, payload)
SELECT 'bench', k, p FROM unnest($1::text[], $2::bytea[]) AS m(k, p)`

// floorInsertBatch inserts worker w's next batch of messages into table in one statement.
func floorInsertBatch(ctx context.Context, w Worker, name, table string, n *int) error {
	keys := make([]string, OutboxBatchMessages)
	payloads := make([][]byte, OutboxBatchMessages)
	for i := range keys {
		*n++
		keys[i], payloads[i] = outboxKey(w, *n), outboxPayload
	}
	return outboxInTx(ctx, w, name, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, fmt.Sprintf(floorOutboxInsertBatch, table), keys, payloads)
		return err
	})
}

func newOutboxFloorInsertBatchWorker(_ context.Context, w Worker) (Op, error) {
	n := 0
	return func(ctx context.Context) error {
		return floorInsertBatch(ctx, w, FloorOutboxInsertBatch, floorOutboxTable, &n)
	}, nil
}

func newOutboxThroughputWorker(ctx context.Context, w Worker) (Op, error) {
	rp, err := sharedPool(w)
	if err != nil {
		return nil, fmt.Errorf("bench: outbox.throughput: %w", err)
	}
	if w.ID == 0 {
		// Start from an outbox without the enqueue scenarios' backlog, vacuumed, as a
		// production outbox under autovacuum would be.
		for _, sql := range []string{`DELETE FROM pgcoord_outbox WHERE topic = '` + outboxEnqueueTopic + `'`, `VACUUM pgcoord_outbox`} {
			if _, err := w.Conn.Exec(ctx, sql); err != nil {
				return nil, fmt.Errorf("bench: outbox.throughput: clear the enqueue scenarios' messages: %w", err)
			}
		}
	}
	relay, err := noopRelay(w, rp, outboxThroughputTopic, benchHolder("outbox.throughput", w), OutboxClaimBatch)
	if err != nil {
		return nil, err
	}
	if err := settleRelay(ctx, rp, relay, outboxThroughputTopic); err != nil {
		return nil, fmt.Errorf("bench: outbox.throughput: %w", err)
	}
	n := 0
	return func(ctx context.Context) error {
		msgs := outboxBatch(w, outboxThroughputTopic, &n)
		err := outboxInTx(ctx, w, "outbox.throughput", func(tx pgx.Tx) error {
			_, err := outbox.EnqueueBatch(ctx, tx, msgs)
			return err
		})
		if err != nil {
			return err
		}
		if err := deliverOwn(ctx, relay, OutboxBatchMessages); err != nil {
			return fmt.Errorf("bench: outbox.throughput: %w", err)
		}
		return nil
	}, nil
}

const (
	floorOutboxClaim = `UPDATE ` + floorOutboxRelayTable + ` SET state = 'claimed'
WHERE id IN (SELECT id FROM ` + floorOutboxRelayTable + ` WHERE state = 'pending' ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED)
RETURNING id, topic, key, payload`
	floorOutboxMark = `UPDATE ` + floorOutboxRelayTable + ` SET state = 'delivered', delivered_at = now() WHERE id = ANY ($1)`
)

func newOutboxFloorThroughputWorker(_ context.Context, w Worker) (Op, error) {
	n := 0
	return func(ctx context.Context) error {
		if err := floorInsertBatch(ctx, w, FloorOutboxThroughput, floorOutboxRelayTable, &n); err != nil {
			return err
		}
		for delivered := 0; delivered < OutboxBatchMessages; {
			rows, err := w.Conn.Query(ctx, floorOutboxClaim, OutboxClaimBatch)
			if err != nil {
				return fmt.Errorf("bench: %s: claim: %w", FloorOutboxThroughput, err)
			}
			var ids []int64
			for rows.Next() {
				var id int64
				var topic, key string
				var payload []byte
				if err := rows.Scan(&id, &topic, &key, &payload); err != nil {
					rows.Close()
					return err
				}
				ids = append(ids, id) // "delivered" to a no-op handler
			}
			if err := rows.Err(); err != nil {
				return fmt.Errorf("bench: %s: claim: %w", FloorOutboxThroughput, err)
			}
			if len(ids) == 0 {
				break
			}
			if _, err := w.Conn.Exec(ctx, floorOutboxMark, ids); err != nil {
				return fmt.Errorf("bench: %s: mark: %w", FloorOutboxThroughput, err)
			}
			delivered += len(ids)
		}
		return nil
	}, nil
}
