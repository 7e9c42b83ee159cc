package bench

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/idempotency"
)

// The idempotency scenarios and their floors. The handler of idempotency.first is the
// bare handler of FloorIdempotencyHandler — one INSERT of an order in a transaction of its
// own — run behind idempotency.Begin in Atomic mode, so the ratio shows what a new key
// costs beyond the handler's own work: none in round trips (the claim rides with the
// handler's BEGIN, the stored response with its COMMIT). A replay's budget is one round trip: FloorIdempotencyLookup is a primary-key read of a stored
// response from a copy of pgcoord_idempotency_keys.
const (
	// FloorIdempotencyHandler is the bare handler: BEGIN; INSERT an order RETURNING id;
	// COMMIT.
	FloorIdempotencyHandler = "idempotency.floor_handler"
	// FloorIdempotencyLookup reads a stored response (status, headers, body) by its
	// (scope, key) from a table shaped like pgcoord_idempotency_keys: one round trip.
	FloorIdempotencyLookup = "idempotency.floor_lookup"
)

func init() {
	Register(Scenario{
		Name: "idempotency.first",
		Description: "a new key: idempotency.Begin (Atomic), the bare handler's INSERT through the attempt's Tx, " +
			"Complete storing a 14-byte JSON response with one header (claim+BEGIN, INSERT, store+COMMIT), through one pool the workers share",
		Floor:     FloorIdempotencyHandler,
		Setup:     setupIdempotencyShared,
		NewWorker: newIdempotencyFirstWorker,
	})
	Register(Scenario{
		Name:        "idempotency.replay",
		Description: "a repeat of a completed key: idempotency.Begin returning the stored response (the claim: one plain read), through one pool the workers share (which coalesces their concurrent calls)",
		Floor:       FloorIdempotencyLookup,
		Setup:       setupIdempotencyShared,
		NewWorker:   newIdempotencyReplayWorker,
	})
	Register(Scenario{
		Name:        FloorIdempotencyHandler,
		Description: "raw SQL, the bare handler: BEGIN, INSERT INTO an orders table RETURNING id, COMMIT",
		Floor:       "floor.select1",
		Setup:       setupIdempotency,
		NewWorker:   newFloorIdempotencyHandlerWorker,
	})
	Register(Scenario{
		Name:        FloorIdempotencyLookup,
		Description: "raw SQL: SELECT status, headers, body of one (scope, key) from a copy of pgcoord_idempotency_keys",
		Floor:       "floor.select1",
		Setup:       setupIdempotency,
		NewWorker:   newFloorIdempotencyLookupWorker,
	})
}

// The tables of the idempotency scenarios: the handler's orders, and the lookup floor's
// copy of the keys table (same columns, constraints and indexes).
const (
	benchOrdersTable    = "bench_idempotency_orders"
	floorIdemKeysTable  = "bench_floor_idempotency_keys"
	benchIdemScope      = "bench"
	benchIdemReplayKeys = 16 // completed keys per replay worker, used in turn
)

func setupIdempotency(ctx context.Context, pool *pgxpool.Pool) error {
	_, err := pool.Exec(ctx, `
		CREATE TABLE IF NOT EXISTS `+benchOrdersTable+` (id bigserial PRIMARY KEY, key text NOT NULL, item text NOT NULL);
		CREATE TABLE IF NOT EXISTS `+floorIdemKeysTable+` (LIKE pgcoord_idempotency_keys INCLUDING ALL)`)
	return err
}

// setupIdempotencyShared is setupIdempotency and the shared pool: idempotency.Begin takes a
// pool, and the workers share one, as the handlers of one process do (concurrent replays
// on it coalesce; an Atomic attempt holds one of its connections until Complete).
func setupIdempotencyShared(ctx context.Context, pool *pgxpool.Pool) error {
	if err := setupIdempotency(ctx, pool); err != nil {
		return err
	}
	return setupSharedPool(ctx, pool)
}

// benchHandler is the bare handler's statement.
const benchHandler = `INSERT INTO ` + benchOrdersTable + ` (key, item) VALUES ($1, 'book') RETURNING id`

// benchResponse is the handler's response for order id.
func benchResponse(id int64) idempotency.Response {
	return idempotency.Response{Status: 201, Header: map[string][]string{"Content-Type": {"application/json"}},
		Body: []byte(`{"order":` + strconv.FormatInt(id, 10) + `}`)}
}

func newIdempotencyFirstWorker(_ context.Context, w Worker) (Op, error) {
	pool, err := sharedPool(w)
	if err != nil {
		return nil, err
	}
	next := freshKeys()
	opts := &idempotency.BeginOpts{Atomic: true}
	return func(ctx context.Context) error {
		key := next()
		fp := idempotency.Fingerprint("POST", "/orders", []byte(key), nil)
		a, err := idempotency.Begin(ctx, pool, benchIdemScope, key, fp, opts)
		if err != nil {
			return fmt.Errorf("bench: idempotency.first: %w", err)
		}
		defer a.Close(ctx)
		if a.Replay() != nil || a.Attempts() != 1 {
			return fmt.Errorf("bench: idempotency.first: the fresh key %q was already used", key)
		}
		var id int64
		if err := a.Tx().QueryRow(ctx, benchHandler, key).Scan(&id); err != nil {
			return fmt.Errorf("bench: idempotency.first: handler: %w", err)
		}
		if err := a.Complete(ctx, benchResponse(id)); err != nil {
			return fmt.Errorf("bench: idempotency.first: %w", err)
		}
		return nil
	}, nil
}

func newIdempotencyReplayWorker(ctx context.Context, w Worker) (Op, error) {
	pool, err := sharedPool(w)
	if err != nil {
		return nil, err
	}
	next := freshKeys()
	keys := make([]string, benchIdemReplayKeys)
	for i := range keys {
		keys[i] = next()
		a, err := idempotency.Begin(ctx, pool, benchIdemScope, keys[i], []byte(keys[i]), nil)
		if err == nil {
			err = a.Complete(ctx, benchResponse(int64(i)))
		}
		if err != nil {
			return nil, fmt.Errorf("bench: idempotency.replay: store %s: %w", keys[i], err)
		}
	}
	var i int
	return func(ctx context.Context) error {
		key := keys[i%len(keys)]
		i++
		a, err := idempotency.Begin(ctx, pool, benchIdemScope, key, []byte(key), nil)
		if err != nil {
			return fmt.Errorf("bench: idempotency.replay: %w", err)
		}
		if a.Replay() == nil || a.Replay().Status != 201 {
			a.Close(ctx)
			return fmt.Errorf("bench: idempotency.replay: %q was not replayed", key)
		}
		return nil
	}, nil
}

func newFloorIdempotencyHandlerWorker(_ context.Context, w Worker) (Op, error) {
	next := freshKeys()
	return func(ctx context.Context) error {
		return pgx.BeginFunc(ctx, w.Conn, func(tx pgx.Tx) error {
			var id int64
			if err := tx.QueryRow(ctx, benchHandler, next()).Scan(&id); err != nil {
				return fmt.Errorf("bench: %s: %w", FloorIdempotencyHandler, err)
			}
			return nil
		})
	}, nil
}

func newFloorIdempotencyLookupWorker(ctx context.Context, w Worker) (Op, error) {
	next := freshKeys()
	keys := make([]string, benchIdemReplayKeys)
	for i := range keys {
		keys[i] = next()
		if _, err := w.Conn.Exec(ctx, `INSERT INTO `+floorIdemKeysTable+`
			(scope, key, fingerprint, state, holder, status, headers, body, created_at, updated_at, completed_at, expires_at)
			VALUES ($1, $2, $3, 'completed', 'bench', 201, '{"Content-Type": ["application/json"]}', '{"order":1}',
			        now(), now(), now(), now() + interval '1 day')`, benchIdemScope, keys[i], []byte(keys[i])); err != nil {
			return nil, fmt.Errorf("bench: %s: %w", FloorIdempotencyLookup, err)
		}
	}
	var i int
	return func(ctx context.Context) error {
		key := keys[i%len(keys)]
		i++
		var (
			status  int
			headers []byte
			body    []byte
		)
		err := w.Conn.QueryRow(ctx, `SELECT status, headers, body FROM `+floorIdemKeysTable+` WHERE scope = $1 AND key = $2`,
			benchIdemScope, key).Scan(&status, &headers, &body)
		if errors.Is(err, pgx.ErrNoRows) || status != 201 {
			return fmt.Errorf("bench: %s: %q not found", FloorIdempotencyLookup, key)
		}
		return err
	}, nil
}
