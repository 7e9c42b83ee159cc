package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/leases"
)

// The lease scenarios and their floors.
//
// The floors specific to leases are named leases.floor_* rather than floor.*: the floor
// feature is the set of global references (floor.select1, floor.lease), and these three
// only make sense beside a lease scenario. Each is measured against floor.select1 when it
// is selected itself, which gives its cost in round trips.
const (
	// FloorLeaseContended is leases.contended's floor: the same loop on one key with the
	// hand-written upsert acquire of floor.lease.
	FloorLeaseContended = "leases.floor_contended"
	// FloorNotify is leases.handoff's floor: a raw LISTEN/NOTIFY round trip.
	FloorNotify = "leases.floor_notify"
	// FloorRenewDurable is leases.renew's floor: the same renewal as a plain UPDATE with a
	// durable commit.
	FloorRenewDurable = "leases.floor_renew_durable"
)

func init() {
	Register(Scenario{
		Name:        "leases.acquire_release",
		Description: "leases.TryAcquire then leases.Release of a key per worker, each one autocommit round trip",
		Floor:       "floor.lease",
		NewWorker:   newAcquireReleaseWorker,
	})
	Register(Scenario{
		Name: "leases.contended",
		Description: "all workers on one key: an op is one success — TryAcquire retried at once on ErrHeld " +
			"until granted, then Release — so ops/s is successes/s and failed attempts only add latency",
		Floor:     FloorLeaseContended,
		NewWorker: newContendedWorker,
	})
	Register(Scenario{
		Name: "leases.handoff",
		Description: "Release of a lease another session waits for in leases.Acquire, until that Acquire returns; " +
			"an op also waits for the waiter to block again (3 cheap round trips), so its latency bounds the handoff from above",
		Floor:     FloorNotify,
		NewWorker: newHandoffWorker,
	})
	Register(Scenario{
		Name:        "leases.renew",
		Description: "leases.Renew of a held lease with RenewOpts.AsyncCommit (synchronous_commit off), a key per worker",
		Floor:       FloorRenewDurable,
		NewWorker:   newRenewWorker,
	})

	Register(Scenario{
		Name: FloorLeaseContended,
		Description: "raw SQL on one key for all workers: the upsert acquire of floor.lease retried at once until it " +
			"returns a token, then the compare-and-release (a refused upsert still locks the row and commits)",
		Floor:     "floor.select1",
		Setup:     setupFloorLeaseContended,
		NewWorker: newFloorLeaseContendedWorker,
	})
	Register(Scenario{
		Name: FloorNotify,
		Description: "raw LISTEN/NOTIFY round trip: SELECT pg_notify (autocommit) on the worker's connection until " +
			"another session listening on the channel receives it",
		Floor:     "floor.select1",
		NewWorker: newFloorNotifyWorker,
	})
	Register(Scenario{
		Name:        FloorRenewDurable,
		Description: "raw renewal of a held pgcoord lease: one UPDATE of pgcoord_leases scoped to the grant, durable commit",
		Floor:       "floor.select1",
		NewWorker:   newFloorRenewDurableWorker,
	})
}

// benchTTL is the TTL of bench leases: far longer than any op, so none expires under a
// worker by accident.
const benchTTL = 30 * time.Second

// benchHolder is a stable holder identity per scenario and worker, like floor.lease's.
func benchHolder(scenario string, w Worker) string {
	return fmt.Sprintf("%s/worker-%d", scenario, w.ID)
}

// uniqueLeaseName returns a lease name no earlier measurement of this Run used: workers
// that leave a lease held when their measurement ends (renew, handoff) must not find it
// held in the next one.
func uniqueLeaseName(scenario string, w Worker) (string, error) {
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	return fmt.Sprintf("%s/%d/%s", scenario, w.ID, hex.EncodeToString(b[:])), nil
}

// leases.acquire_release

func newAcquireReleaseWorker(_ context.Context, w Worker) (Op, error) {
	name := fmt.Sprintf("leases.acquire_release/%d", w.ID)
	opts := &leases.AcquireOpts{Holder: benchHolder("leases.acquire_release", w)}
	return func(ctx context.Context) error {
		l, err := leases.TryAcquire(ctx, w.Conn, name, benchTTL, opts)
		if err != nil {
			return fmt.Errorf("bench: leases.acquire_release: acquire of %q (only this worker uses it): %w", name, err)
		}
		if err := leases.Release(ctx, w.Conn, l, nil); err != nil {
			return fmt.Errorf("bench: leases.acquire_release: %w", err)
		}
		return nil
	}, nil
}

// leases.contended

// ContendedKey is the one lease all workers of leases.contended compete for.
const ContendedKey = "leases.contended"

// contendedPatience bounds how long one op of a contended scenario retries: far beyond any
// fair wait, so only a lease that is never released (a bug) ends it.
const contendedPatience = benchTTL

func newContendedWorker(_ context.Context, w Worker) (Op, error) {
	opts := &leases.AcquireOpts{Holder: benchHolder("leases.contended", w)}
	return func(ctx context.Context) error {
		deadline := time.Now().Add(contendedPatience)
		for {
			l, err := leases.TryAcquire(ctx, w.Conn, ContendedKey, benchTTL, opts)
			if errors.Is(err, leases.ErrHeld) {
				if time.Now().After(deadline) {
					return fmt.Errorf("bench: leases.contended: refused for %v", contendedPatience)
				}
				continue // a failed attempt: no commit, try again at once
			}
			if err != nil {
				return fmt.Errorf("bench: leases.contended: %w", err)
			}
			if err := leases.Release(ctx, w.Conn, l, nil); err != nil {
				return fmt.Errorf("bench: leases.contended: %w", err)
			}
			return nil
		}
	}, nil
}

// floorContendedTable is leases.floor_contended's table, shaped like floor.lease's.
const floorContendedTable = "bench_floor_lease_contended"

func setupFloorLeaseContended(ctx context.Context, pool *pgxpool.Pool) error {
	_, err := pool.Exec(ctx, `CREATE TABLE `+floorContendedTable+` (
		name       text PRIMARY KEY,
		holder     text,
		token      bigint NOT NULL,
		expires_at timestamptz -- NULL: free
	)`)
	return err
}

var (
	floorContendedAcquire = strings.Replace(floorLeaseAcquire, floorLeaseTable, floorContendedTable, 1)
	floorContendedRelease = strings.Replace(floorLeaseRelease, floorLeaseTable, floorContendedTable, 1)
)

func newFloorLeaseContendedWorker(_ context.Context, w Worker) (Op, error) {
	const name = "contended"
	holder := fmt.Sprintf("worker-%d", w.ID)
	return func(ctx context.Context) error {
		deadline := time.Now().Add(contendedPatience)
		for {
			var token int64
			err := w.Conn.QueryRow(ctx, floorContendedAcquire, name, holder).Scan(&token)
			if errors.Is(err, pgx.ErrNoRows) {
				if time.Now().After(deadline) {
					return fmt.Errorf("bench: %s: refused for %v", FloorLeaseContended, contendedPatience)
				}
				continue
			}
			if err != nil {
				return fmt.Errorf("bench: %s: acquire: %w", FloorLeaseContended, err)
			}
			tag, err := w.Conn.Exec(ctx, floorContendedRelease, name, holder, token)
			if err != nil {
				return fmt.Errorf("bench: %s: release: %w", FloorLeaseContended, err)
			}
			if tag.RowsAffected() != 1 {
				return fmt.Errorf("bench: %s: release of token %d changed nothing", FloorLeaseContended, token)
			}
			return nil
		}
	}, nil
}

// leases.renew

func newRenewWorker(ctx context.Context, w Worker) (Op, error) {
	name, err := uniqueLeaseName("leases.renew", w)
	if err != nil {
		return nil, err
	}
	l, err := leases.TryAcquire(ctx, w.Conn, name, benchTTL, nil)
	if err != nil {
		return nil, fmt.Errorf("bench: leases.renew: acquire: %w", err)
	}
	opts := &leases.RenewOpts{AsyncCommit: true}
	return func(ctx context.Context) error {
		next, err := leases.Renew(ctx, w.Conn, l, benchTTL, opts)
		if err != nil {
			return fmt.Errorf("bench: leases.renew: %w", err)
		}
		l = next
		return nil
	}, nil
}

// floorRenew renews one grant, scoped to it as pgcoord_lease_renew is, by the database
// clock, with the session's (durable) synchronous_commit.
const floorRenew = `UPDATE pgcoord_leases SET expires_at = now() + $4::interval, renewed_at = now()
WHERE name = $1 AND holder = $2 AND fence_token = $3 AND expires_at > now()`

func newFloorRenewDurableWorker(ctx context.Context, w Worker) (Op, error) {
	name, err := uniqueLeaseName(FloorRenewDurable, w)
	if err != nil {
		return nil, err
	}
	// Taking the lease is setup, not measured.
	l, err := leases.TryAcquire(ctx, w.Conn, name, benchTTL, nil)
	if err != nil {
		return nil, fmt.Errorf("bench: %s: acquire: %w", FloorRenewDurable, err)
	}
	ttl := benchTTL.String()
	return func(ctx context.Context) error {
		tag, err := w.Conn.Exec(ctx, floorRenew, l.Name, l.Holder, l.Token, ttl)
		if err != nil {
			return fmt.Errorf("bench: %s: %w", FloorRenewDurable, err)
		}
		if tag.RowsAffected() != 1 {
			return fmt.Errorf("bench: %s: renewal of %q token %d changed nothing", FloorRenewDurable, l.Name, l.Token)
		}
		return nil
	}, nil
}

// leases.handoff
//
// A handoff needs a second session per worker: the one blocked in leases.Acquire (which
// takes a pool and holds one of its connections while it waits). Each worker gets a side
// pool of one connection, opened from its own connection's config and shared with the
// same worker's leases.floor_notify, where it is the listening session: the scenario and its
// floor run in alternate rounds, so at most one of them uses it at a time, and a bench at
// concurrency c opens at most c extra connections. A side pool closes itself once idle
// for sideIdle, since workers have no end-of-measurement hook.
//
// One op of leases.handoff, on one lease per worker:
//
//	the waiter goroutine is blocked in leases.Acquire on the side pool (the op waits for the
//	   registration of its wait to return, seen by a query tracer on the side pool)
//	the op releases the current grant on the worker's connection       <- op latency starts
//	the release notifies; the waiter's Acquire is granted and returns  <- the handoff
//	the op takes the new grant as current; the waiter calls Acquire again and blocks
//
// The waiter lives for one round (it is tied to the round's context), so nothing holds the
// side connection during the floor's rounds.

// sideIdle is how long a side pool stays open without use.
const sideIdle = 2 * time.Second

// sidePool is a worker's extra session.
type sidePool struct {
	cfg *pgxpool.Config
	key *pgx.Conn

	mu       sync.Mutex
	pool     *pgxpool.Pool // nil when closed
	users    int           // ops and waiters using pool now
	lastUsed time.Time
}

var sidePools struct {
	sync.Mutex
	m map[*pgx.Conn]*sidePool
}

// sideFor returns the side pool of w's connection, creating it (and its connection) if
// needed.
func sideFor(ctx context.Context, w Worker) (*sidePool, error) {
	key := w.Conn.Conn()
	sidePools.Lock()
	sp, ok := sidePools.m[key]
	if !ok {
		cc := key.Config() // a copy: search_path, application_name and all
		cfg, err := pgxpool.ParseConfig(cc.ConnString())
		if err != nil {
			sidePools.Unlock()
			return nil, fmt.Errorf("bench: side connection: %w", err)
		}
		cc.Tracer = waitTracer{next: cc.Tracer}
		// The copy still delivers notifications to the worker connection's buffer (pgx sets
		// OnNotification only when it is nil): let the side connection buffer its own.
		cc.OnNotification = nil
		cfg.ConnConfig = cc
		cfg.MaxConns, cfg.MinConns = 1, 0
		sp = &sidePool{cfg: cfg, key: key}
		if sidePools.m == nil {
			sidePools.m = map[*pgx.Conn]*sidePool{}
		}
		sidePools.m[key] = sp
	}
	sidePools.Unlock()
	// Open and connect now, so that no measured op pays for connecting.
	p, err := sp.use()
	if err != nil {
		return nil, err
	}
	defer sp.done()
	c, err := p.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("bench: side connection: %w", err)
	}
	c.Release()
	return sp, nil
}

// use returns the open pool, reopening it if it was closed for idleness; call done after.
func (sp *sidePool) use() (*pgxpool.Pool, error) {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	if sp.pool == nil {
		p, err := pgxpool.NewWithConfig(context.Background(), sp.cfg)
		if err != nil {
			return nil, fmt.Errorf("bench: side connection: %w", err)
		}
		sp.pool = p
		go sp.closeWhenIdle()
	}
	sp.users++
	sp.lastUsed = time.Now()
	return sp.pool, nil
}

func (sp *sidePool) done() {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	sp.users--
	sp.lastUsed = time.Now()
}

// closeWhenIdle closes the pool once nobody has used it for sideIdle.
func (sp *sidePool) closeWhenIdle() {
	tick := time.NewTicker(sideIdle / 4)
	defer tick.Stop()
	for range tick.C {
		sp.mu.Lock()
		if sp.users > 0 || time.Since(sp.lastUsed) < sideIdle {
			sp.mu.Unlock()
			continue
		}
		p := sp.pool
		sp.pool = nil
		sp.mu.Unlock()
		sidePools.Lock()
		if sidePools.m[sp.key] == sp {
			delete(sidePools.m, sp.key)
		}
		sidePools.Unlock()
		p.Close()
		return
	}
}

// waitTracer calls the function stored in a query's context under waitHookKey when a call
// of pgcoord_lease_wait returns: the sign that a waiting leases.Acquire has registered and
// listens. It passes every query on to next, if any.
type waitTracer struct{ next pgx.QueryTracer }

type (
	waitHookKey  struct{}
	waitQueryKey struct{}
)

func (t waitTracer) TraceQueryStart(ctx context.Context, conn *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	if t.next != nil {
		ctx = t.next.TraceQueryStart(ctx, conn, data)
	}
	if ctx.Value(waitHookKey{}) != nil && strings.Contains(data.SQL, "pgcoord_lease_wait(") {
		ctx = context.WithValue(ctx, waitQueryKey{}, true)
	}
	return ctx
}

func (t waitTracer) TraceQueryEnd(ctx context.Context, conn *pgx.Conn, data pgx.TraceQueryEndData) {
	if t.next != nil {
		t.next.TraceQueryEnd(ctx, conn, data)
	}
	if ctx.Value(waitQueryKey{}) != nil && data.Err == nil {
		if hook, ok := ctx.Value(waitHookKey{}).(func()); ok {
			hook()
		}
	}
}

// handoffPatience bounds each wait of a handoff op: for the waiter to block, and for the
// handoff itself. Far beyond any fair wait; hitting it is a bug worth failing the bench.
const handoffPatience = 10 * time.Second

// handoffWorker is the state of one leases.handoff worker.
type handoffWorker struct {
	w    Worker
	side *sidePool
	name string
	cur  leases.Lease // the grant the op releases next; zero before the first op
	wt   *waiter      // this round's waiter
	seen int64        // wt.waits when the waiter was last granted the lease
}

// waiter is the goroutine that waits in leases.Acquire, for one round.
type waiter struct {
	ctx   context.Context // the round's
	waits atomic.Int64    // calls of pgcoord_lease_wait that returned
	wake  chan struct{}   // signalled (without blocking) when waits grows
	got   chan acquired   // an Acquire returned
}

type acquired struct {
	lease leases.Lease
	err   error
	waits int64 // waiter.waits when Acquire returned
}

func newHandoffWorker(ctx context.Context, w Worker) (Op, error) {
	side, err := sideFor(ctx, w)
	if err != nil {
		return nil, err
	}
	name, err := uniqueLeaseName("leases.handoff", w)
	if err != nil {
		return nil, err
	}
	h := &handoffWorker{w: w, side: side, name: name}
	return h.op, nil
}

func (h *handoffWorker) op(ctx context.Context) error {
	if h.wt == nil || h.wt.ctx != ctx {
		if err := h.startRound(ctx); err != nil {
			return err
		}
	}
	wt := h.wt
	timer := time.NewTimer(handoffPatience)
	defer timer.Stop()
	// Wait until the waiter has registered its wait (a pgcoord_lease_wait call returned
	// since it was last granted the lease): it now listens and will be notified.
	for wt.waits.Load() <= h.seen {
		select {
		case <-wt.wake:
		case r := <-wt.got:
			return fmt.Errorf("bench: leases.handoff: waiter returned (%v) while %q token %d was held", r.err, h.name, h.cur.Token)
		case <-timer.C:
			return fmt.Errorf("bench: leases.handoff: waiter not blocked after %v", handoffPatience)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if err := leases.Release(ctx, h.w.Conn, h.cur, nil); err != nil {
		return fmt.Errorf("bench: leases.handoff: %w", err)
	}
	select {
	case r := <-wt.got:
		if r.err != nil {
			return fmt.Errorf("bench: leases.handoff: waiter: %w", r.err)
		}
		if r.lease.Token <= h.cur.Token {
			return fmt.Errorf("bench: leases.handoff: token %d after %d", r.lease.Token, h.cur.Token)
		}
		h.cur, h.seen = r.lease, r.waits
	case <-timer.C:
		return fmt.Errorf("bench: leases.handoff: no handoff within %v of the release", handoffPatience)
	case <-ctx.Done():
		return ctx.Err()
	}
	return nil
}

// startRound takes the lease on the worker's connection if this worker has no grant yet and
// starts the round's waiter.
func (h *handoffWorker) startRound(ctx context.Context) error {
	if h.cur.Name == "" {
		l, err := leases.TryAcquire(ctx, h.w.Conn, h.name, benchTTL, nil)
		if err != nil {
			return fmt.Errorf("bench: leases.handoff: first acquire of %q: %w", h.name, err)
		}
		h.cur = l
	}
	pool, err := h.side.use()
	if err != nil {
		return err
	}
	wt := &waiter{ctx: ctx, wake: make(chan struct{}, 1), got: make(chan acquired, 1)}
	h.wt, h.seen = wt, 0
	wctx := context.WithValue(ctx, waitHookKey{}, func() {
		wt.waits.Add(1)
		select {
		case wt.wake <- struct{}{}:
		default:
		}
	})
	// The poll interval only matters if a notification is lost; the lease never expires
	// under a waiter, so a long one keeps the waiter quiet.
	opts := &leases.AcquireOpts{PollInterval: handoffPatience}
	go func() {
		defer h.side.done()
		for {
			l, err := leases.Acquire(wctx, pool, h.name, benchTTL, opts)
			select {
			case wt.got <- acquired{l, err, wt.waits.Load()}:
			case <-ctx.Done(): // the op that would take it failed
				return
			}
			if err != nil {
				return // the round is over (or the bench failed)
			}
		}
	}()
	return nil
}

// leases.floor_notify

func newFloorNotifyWorker(ctx context.Context, w Worker) (Op, error) {
	side, err := sideFor(ctx, w)
	if err != nil {
		return nil, err
	}
	var schema string
	if err := w.Conn.QueryRow(ctx, "SELECT current_schema()").Scan(&schema); err != nil {
		return nil, err
	}
	// The bench schema's name is unique per Run: so is the channel.
	channel := fmt.Sprintf("%s_notify_%d", schema, w.ID)
	var (
		seq       int64
		listening *pgx.Conn // the side connection that LISTENs, if any
	)
	return func(ctx context.Context) error {
		pool, err := side.use()
		if err != nil {
			return err
		}
		defer side.done()
		c, err := pool.Acquire(ctx)
		if err != nil {
			return fmt.Errorf("bench: %s: %w", FloorNotify, err)
		}
		defer c.Release()
		if c.Conn() != listening {
			if _, err := c.Exec(ctx, "LISTEN "+pgx.Identifier{channel}.Sanitize()); err != nil {
				return fmt.Errorf("bench: %s: %w", FloorNotify, err)
			}
			listening = c.Conn()
		}
		seq++
		payload := strconv.FormatInt(seq, 10)
		if _, err := w.Conn.Exec(ctx, "SELECT pg_notify($1, $2)", channel, payload); err != nil {
			return fmt.Errorf("bench: %s: notify: %w", FloorNotify, err)
		}
		wctx, cancel := context.WithTimeout(ctx, handoffPatience)
		defer cancel()
		for {
			n, err := c.Conn().WaitForNotification(wctx)
			if err != nil {
				return fmt.Errorf("bench: %s: waiting for notification %s: %w", FloorNotify, payload, err)
			}
			if n.Channel == channel && n.Payload == payload {
				return nil
			}
		}
	}, nil
}
