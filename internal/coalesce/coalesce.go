// Package coalesce merges the concurrent calls of one process into one round trip: group
// commit for pgcoord's primitives. Calls with the same key that arrive while a batch of that
// key is in flight (in each of its lanes: one by default, see Lanes) wait, and go out
// together, in arrival order, as soon as one returns; a call that finds a lane free goes
// out at once, alone, on its own goroutine and context, so a lone caller pays nothing for
// the mechanism. Call picks the key from the caller's pool: calls on a transaction or a
// connection are never merged. Each runs a batch whose calls take row locks.
//
// Each call keeps its own context. A call whose context ends before its batch is sent is
// dropped from the queue and gets the context's error; one whose context ends while its
// batch is in flight returns at once with an error wrapping both ErrUnknown and the
// context's error: the batch may commit without it knowing. If the batch then answers it,
// the answer goes to the Batcher's orphan function (see Orphans), which can undo what the
// caller no longer wants (release a grant nobody will use). A batch runs until every one of
// its callers has gone, then it is cancelled. A batch that fails gives every caller in it
// the same error; a call's own outcome (a refusal, say) is part of its result.
package coalesce

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ErrUnknown is wrapped by the error of a call whose context ended while its batch was in
// flight: whether the batch committed it is not known.
var ErrUnknown = errors.New("the call was sent; whether it took effect is not known")

// Batcher sends the items of concurrent calls with the same key in batches of at most max
// items, each through run, which returns one result per item, in order. Its zero value is
// not usable: see New.
type Batcher[T, R any] struct {
	run    func(ctx context.Context, items []T) ([]R, error)
	max    int
	lanes  int // batches of one key in flight at once
	orphan func(T, R)

	mu     sync.Mutex
	queues map[string]*queue[T, R] // keys with a batch in flight, and the calls waiting behind it
}

type queue[T, R any] struct {
	inflight int // batches in flight
	waiting  []*call[T, R]
}

type call[T, R any] struct {
	ctx  context.Context
	item T
	sent bool          // taken into a batch (under Batcher.mu)
	gone bool          // returned ErrUnknown before its batch answered (under Batcher.mu)
	told bool          // answered (under Batcher.mu)
	done chan struct{} // closed when res and err are set
	res  R
	err  error
}

// New returns a Batcher that sends batches of at most size (at least 1) items through run.
func New[T, R any](size int, run func(ctx context.Context, items []T) ([]R, error)) *Batcher[T, R] {
	return &Batcher[T, R]{run: run, max: max(size, 1), lanes: 1, queues: map[string]*queue[T, R]{}}
}

// Lanes lets up to n (at least 1) batches of one key be in flight at once: a call goes out
// at once while fewer are, and waits for the first to return otherwise. One lane suits
// calls that queue on one row anyway (a hot rate limit key); more let calls on many rows
// use more than one server process. It returns b.
func (b *Batcher[T, R]) Lanes(n int) *Batcher[T, R] {
	b.lanes = max(n, 1)
	return b
}

// Do sends item with the other calls of key that are waiting, and returns its result.
func (b *Batcher[T, R]) Do(ctx context.Context, key string, item T) (R, error) {
	var zero R
	b.mu.Lock()
	q, ok := b.queues[key]
	if !ok {
		q = &queue[T, R]{}
		b.queues[key] = q
	}
	if q.inflight < b.lanes && len(q.waiting) == 0 {
		// A lane is free: go out at once, alone, as a plain call would.
		q.inflight++
		b.mu.Unlock()
		rs, err := b.send(ctx, []T{item})
		b.next(key)
		if err != nil {
			return zero, err
		}
		return rs[0], nil
	}
	c := &call[T, R]{ctx: ctx, item: item, done: make(chan struct{})}
	q.waiting = append(q.waiting, c)
	b.mu.Unlock()
	select {
	case <-c.done:
		return c.res, c.err
	case <-ctx.Done():
	}
	b.mu.Lock()
	sent, told := c.sent, c.told
	switch {
	case !sent:
		q.waiting = slices.DeleteFunc(q.waiting, func(w *call[T, R]) bool { return w == c })
	case !told:
		c.gone = true
	}
	b.mu.Unlock()
	if !sent {
		return zero, ctx.Err()
	}
	if told {
		<-c.done
		if c.err == nil { // it was answered meanwhile: its outcome is known
			return c.res, nil
		}
	}
	return zero, fmt.Errorf("%w: %w", ErrUnknown, ctx.Err())
}

// Orphans sets f to receive the results of calls whose callers had gone (ErrUnknown)
// before their batch answered them, on a goroutine of its own: to undo, with a context of
// its own, what nobody will use. It returns b.
func (b *Batcher[T, R]) Orphans(f func(T, R)) *Batcher[T, R] {
	b.orphan = f
	return b
}

// Call sends item: if db is a *pgxpool.Pool, with the concurrent calls of the same mode
// on that pool (Do); otherwise (a transaction or a connection, which the caller's own
// statements share) alone, at once, as a batch of one.
func (b *Batcher[T, R]) Call(ctx context.Context, db any, mode string, item T) (R, error) {
	if pool, ok := db.(*pgxpool.Pool); ok {
		return b.Do(ctx, fmt.Sprintf("%p\x00%s", pool, mode), item)
	}
	var zero R
	rs, err := b.send(ctx, []T{item})
	if err != nil {
		return zero, err
	}
	return rs[0], nil
}

// Waiting returns how many calls of key wait behind its batch in flight.
func (b *Batcher[T, R]) Waiting(key string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	if q, ok := b.queues[key]; ok {
		return len(q.waiting)
	}
	return 0
}

// next sends the calls waiting behind key's batch that just returned, as the next batch, or
// frees its lane if none wait.
func (b *Batcher[T, R]) next(key string) {
	b.mu.Lock()
	q := b.queues[key]
	q.inflight--
	if len(q.waiting) == 0 {
		if q.inflight == 0 {
			delete(b.queues, key)
		}
		b.mu.Unlock()
		return
	}
	q.inflight++
	n := min(len(q.waiting), b.max)
	batch := slices.Clone(q.waiting[:n])
	q.waiting = slices.Delete(q.waiting, 0, n)
	for _, c := range batch {
		c.sent = true
	}
	b.mu.Unlock()
	go b.sendCalls(key, batch)
}

// sendCalls sends batch, answers each of its calls, and goes on with key's next batch.
func (b *Batcher[T, R]) sendCalls(key string, batch []*call[T, R]) {
	ctx, stop := batchContext(batch)
	items := make([]T, len(batch))
	for i, c := range batch {
		items[i] = c.item
	}
	rs, err := b.send(ctx, items)
	stop()
	for i, c := range batch {
		b.mu.Lock()
		if err != nil {
			c.err = err
		} else {
			c.res = rs[i]
		}
		c.told = true
		gone := c.gone
		b.mu.Unlock()
		close(c.done)
		if gone && err == nil && b.orphan != nil {
			go b.orphan(c.item, c.res)
		}
	}
	b.next(key)
}

// send runs items as one batch and checks that it answered each.
func (b *Batcher[T, R]) send(ctx context.Context, items []T) ([]R, error) {
	rs, err := b.run(ctx, items)
	if err == nil && len(rs) != len(items) {
		err = fmt.Errorf("coalesce: a batch of %d items returned %d results", len(items), len(rs))
	}
	return rs, err
}

// batchContext returns the context of a batch: it carries the values of the first call's
// context, has no deadline of its own, and is cancelled once every call's context has
// ended. stop releases it.
func batchContext[T, R any](batch []*call[T, R]) (context.Context, func()) {
	ctx, cancel := context.WithCancel(context.WithoutCancel(batch[0].ctx))
	alive := atomic.Int64{}
	alive.Store(int64(len(batch)))
	stops := make([]func() bool, len(batch))
	for i, c := range batch {
		stops[i] = context.AfterFunc(c.ctx, func() {
			if alive.Add(-1) == 0 {
				cancel()
			}
		})
	}
	return ctx, func() {
		for _, s := range stops {
			s()
		}
		cancel()
	}
}

// LockTimeout is the lock_timeout of a batch whose calls take row locks (see Each): it
// holds the rows its first calls wrote while the next ones run, so it must not wait long
// for a row that a transaction waiting for one of its own might hold. It is far longer
// than another grant's commit and far shorter than deadlock_timeout (1 s by default), so
// that a batch in a cycle of lock waits gives up, and is sent again call by call, before
// the other party is chosen to die.
const LockTimeout = "100ms"

// Each runs the calls of one batch for a run function whose calls take row locks: one
// alone; several together, in the order of their keys (arrival order among equal keys), so
// that two batches take rows in one order. together gets the calls in that order and
// returns one result per call, in that order. If the batch fails in the database (a
// *pgconn.PgError: its statement, and with it its transaction, rolled back), each call is
// sent alone and gets its own outcome; if it fails otherwise (its connection), whether it
// committed is not known, and every call gets the error. Calls sent again alone must be
// idempotent: a backend killed as its batch committed reports an error too.
func Each[T, R any](ctx context.Context, calls []T, key func(T) string,
	alone func(context.Context, T) R, together func(context.Context, []T) ([]R, error),
) ([]R, error) {
	out := make([]R, len(calls))
	if len(calls) == 1 {
		out[0] = alone(ctx, calls[0])
		return out, nil
	}
	order := make([]int, len(calls))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return strings.Compare(key(calls[a]), key(calls[b])) })
	sorted := make([]T, len(calls))
	for pos, i := range order {
		sorted[pos] = calls[i]
	}
	rs, err := together(ctx, sorted)
	var pgErr *pgconn.PgError
	switch {
	case err == nil && len(rs) == len(calls):
		for pos, i := range order {
			out[i] = rs[pos]
		}
	case err == nil:
		return nil, fmt.Errorf("coalesce: a batch of %d calls returned %d results", len(calls), len(rs))
	case errors.As(err, &pgErr) && ctx.Err() == nil:
		for i, c := range calls {
			out[i] = alone(ctx, c)
		}
	default:
		return nil, err
	}
	return out, nil
}

// Positions places the rows of a batch of n calls, each naming its call's position (from
// 1), as the calls' results: a call with no row gets the zero R.
func Positions[Row, R any](n int, rows []Row, err error, result func(Row) (int32, R)) ([]R, error) {
	if err != nil {
		return nil, err
	}
	out := make([]R, n)
	for _, row := range rows {
		i, r := result(row)
		if i < 1 || int(i) > n {
			return nil, fmt.Errorf("coalesce: a batch of %d calls answered for position %d", n, i)
		}
		out[i-1] = r
	}
	return out, nil
}

// Outcome is the answer to one call of a primitive whose statements return a row or none:
// the row, whether there was one (granted, held, found), or the call's own error.
type Outcome[Row any] struct {
	Row Row
	OK  bool
	Err error
}

// Send sends item through b (see Call) and returns its outcome, the batch's error
// included.
func Send[T, Row any](ctx context.Context, b *Batcher[T, Outcome[Row]], db any, mode string, item T) Outcome[Row] {
	o, err := b.Call(ctx, db, mode, item)
	if err != nil {
		return Outcome[Row]{Err: err}
	}
	return o
}

// Found is the outcome of a statement sent alone that returns one row or none.
func Found[Row any](row Row, err error) Outcome[Row] {
	if errors.Is(err, pgx.ErrNoRows) {
		return Outcome[Row]{}
	}
	return Outcome[Row]{Row: row, OK: err == nil, Err: err}
}

// Done is the outcome of a statement sent alone that took effect (ok) or not.
func Done[Row any](ok bool, err error) Outcome[Row] {
	return Outcome[Row]{OK: ok && err == nil, Err: err}
}

// Rows is the outcome of each call of a batch of n from the rows it returned, each naming
// its call's position (see Positions): a call with no row gets none.
func Rows[R, Row any](n int, rows []R, err error, split func(R) (int32, Row)) ([]Outcome[Row], error) {
	return Positions(n, rows, err, func(r R) (int32, Outcome[Row]) {
		i, row := split(r)
		return i, Outcome[Row]{Row: row, OK: true}
	})
}
