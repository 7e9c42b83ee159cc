package bench

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/semaphore"
)

// The semaphore scenarios and their floors.
//
// Like the lease floors, the semaphore floors are named semaphore.floor_* rather than
// floor.*: floor.* is the set of the two global references.
const (
	// FloorSemaphoreAdmission is semaphore.acquire_release's floor: the same admission and
	// release in hand-written SQL, one statement each.
	FloorSemaphoreAdmission = "semaphore.floor_admission"
	// FloorSemaphoreContended is semaphore.contended's floor: the cheapest correct
	// hand-written semaphore under contention (K slot rows per key, claimed with SKIP
	// LOCKED) run in the same contended loop.
	FloorSemaphoreContended = "semaphore.floor_contended"
)

// SemaphoreLimit is the limit K of the semaphore scenarios' keys.
const SemaphoreLimit = 4

// SemaphoreContendedKey is the one key all workers of semaphore.contended compete for.
const SemaphoreContendedKey = "semaphore.contended"

func init() {
	Register(Scenario{
		Name: "semaphore.acquire_release",
		Description: "semaphore.TryAcquire then semaphore.Release of a permit of a key per worker (limit 4), through one " +
			"pool the workers share (which coalesces their concurrent calls: alone, each is one autocommit round trip)",
		Floor:     FloorSemaphoreAdmission,
		Setup:     setupSharedPool,
		NewWorker: newSemAcquireReleaseWorker,
	})
	Register(Scenario{
		Name: "semaphore.contended",
		Description: "all workers on one key with limit 4: an op is one permit granted — TryAcquire retried after a " +
			"jittered backoff of up to " + semBackoff.String() + " on ErrFull, a SELECT 1 while holding it, then Release — " +
			"so ops/s is permits granted/s; an op fails if more than 4 are ever held at once",
		Floor:     FloorSemaphoreContended,
		NewWorker: newSemContendedWorker,
	})
	Register(Scenario{
		Name: FloorSemaphoreAdmission,
		Description: "raw-SQL semaphore on a key per worker (limit 4): one statement admits (takes a slot in the key's " +
			"row if fewer than 4 are held, bumps its token, inserts the permit), one releases",
		Floor:     "floor.select1",
		Setup:     setupSemFloor,
		NewWorker: newSemFloorAdmissionWorker,
	})
	Register(Scenario{
		Name: FloorSemaphoreContended,
		Description: "raw SQL on one key with limit 4 for all workers, in the loop of semaphore.contended (same backoff, " +
			"hold and limit check): the key is 4 slot rows; one UPDATE claims a free or expired slot (FOR UPDATE SKIP " +
			"LOCKED: a refusal waits for no lock and writes nothing), one frees it",
		Floor:     "floor.select1",
		Setup:     setupSemSlots,
		NewWorker: newSemFloorContendedWorker,
	})
}

// semBackoff is the most a contended worker waits after a refusal before it tries again.
// Without it, the refused workers (28 of 32) would hammer the key's row, and every
// refusal of semaphore.TryAcquire locks it and commits (it counts the refusal).
const semBackoff = 100 * time.Microsecond

// semPatience bounds how long one contended op retries: far beyond any fair wait, so only
// a permit that is never released (a bug) ends it.
const semPatience = 30 * time.Second

// semTTL is the TTL of bench permits: far longer than any op.
const semTTL = 30 * time.Second

// semHeld counts the permits of a contended key that the workers of one measurement hold
// at once, as they see it: up after a grant returns, down before the release is sent. The
// database granted them, so a count above the limit is a permit granted beyond it.
type semHeld struct {
	cur, max atomic.Int64
}

// enter counts a grant and returns the number held now.
func (h *semHeld) enter() int64 {
	n := h.cur.Add(1)
	for {
		m := h.max.Load()
		if n <= m || h.max.CompareAndSwap(m, n) {
			return n
		}
	}
}

func (h *semHeld) leave() { h.cur.Add(-1) }

// semTrackers holds the counters by scenario and bench schema: two Runs in one process
// (parallel tests) use different schemas, hence different keys, and must not share one.
var semTrackers struct {
	sync.Mutex
	m map[[2]string]*semHeld
}

func semTracker(scenario, searchPath string) *semHeld {
	semTrackers.Lock()
	defer semTrackers.Unlock()
	k := [2]string{scenario, searchPath}
	h, ok := semTrackers.m[k]
	if !ok {
		if semTrackers.m == nil {
			semTrackers.m = map[[2]string]*semHeld{}
		}
		h = &semHeld{}
		semTrackers.m[k] = h
	}
	return h
}

// SemaphoreMaxHeld returns the most permits of its key that the workers of scenario
// (semaphore.contended or semaphore.floor_contended) held at once, over the measurements
// of the Run whose bench pool is pool (pass the pool given to Options.AfterRun).
func SemaphoreMaxHeld(pool *pgxpool.Pool, scenario string) int64 {
	return semTracker(scenario, pool.Config().ConnConfig.RuntimeParams["search_path"]).max.Load()
}

func semWorkerTracker(scenario string, w Worker) *semHeld {
	return semTracker(scenario, w.Conn.Conn().Config().RuntimeParams["search_path"])
}

// semaphore.acquire_release

func newSemAcquireReleaseWorker(_ context.Context, w Worker) (Op, error) {
	pool, err := sharedPool(w)
	if err != nil {
		return nil, err
	}
	key := fmt.Sprintf("semaphore.acquire_release/%d", w.ID)
	opts := &semaphore.AcquireOpts{Holder: benchHolder("semaphore.acquire_release", w)}
	return func(ctx context.Context) error {
		p, err := semaphore.TryAcquire(ctx, pool, key, SemaphoreLimit, semTTL, opts)
		if err != nil {
			return fmt.Errorf("bench: semaphore.acquire_release: acquire of %q (only this worker uses it): %w", key, err)
		}
		if err := semaphore.Release(ctx, pool, p); err != nil {
			return fmt.Errorf("bench: semaphore.acquire_release: %w", err)
		}
		return nil
	}, nil
}

// semaphore.contended

// semHold is the work done while holding a permit: one SELECT 1, so that permits overlap for
// a round trip and the limit is really exercised.
func semHold(ctx context.Context, w Worker) error {
	var one int
	return w.Conn.QueryRow(ctx, "SELECT 1").Scan(&one)
}

// semWait waits the jittered backoff after a refusal, or until ctx is done.
func semWait(ctx context.Context, t *time.Timer) error {
	t.Reset(time.Duration(rand.Int64N(int64(semBackoff))) + 1)
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// semContendedLoop runs one contended op: acquire (retrying refusals after a backoff)
// until granted, check the limit, hold, release.
func semContendedLoop(ctx context.Context, name string, held *semHeld, timer *time.Timer,
	acquire func(context.Context) (granted bool, err error), hold, release func(context.Context) error) error {
	deadline := time.Now().Add(semPatience)
	for {
		granted, err := acquire(ctx)
		if err != nil {
			return fmt.Errorf("bench: %s: acquire: %w", name, err)
		}
		if granted {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("bench: %s: refused for %v", name, semPatience)
		}
		if err := semWait(ctx, timer); err != nil {
			return fmt.Errorf("bench: %s: %w", name, err)
		}
	}
	n := held.enter()
	herr := hold(ctx)
	held.leave()
	rerr := release(ctx)
	switch {
	case n > SemaphoreLimit:
		return fmt.Errorf("bench: %s: %d permits held at once, more than the limit of %d", name, n, SemaphoreLimit)
	case herr != nil:
		return fmt.Errorf("bench: %s: hold: %w", name, herr)
	case rerr != nil:
		return fmt.Errorf("bench: %s: release: %w", name, rerr)
	}
	return nil
}

func newSemContendedWorker(_ context.Context, w Worker) (Op, error) {
	const name = "semaphore.contended"
	held := semWorkerTracker(name, w)
	opts := &semaphore.AcquireOpts{Holder: benchHolder(name, w)}
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	var p semaphore.Permit
	acquire := func(ctx context.Context) (bool, error) {
		var err error
		p, err = semaphore.TryAcquire(ctx, w.Conn, SemaphoreContendedKey, SemaphoreLimit, semTTL, opts)
		if errors.Is(err, semaphore.ErrFull) {
			return false, nil
		}
		return err == nil, err
	}
	release := func(ctx context.Context) error { return semaphore.Release(ctx, w.Conn, p) }
	return func(ctx context.Context) error {
		return semContendedLoop(ctx, name, held, timer, acquire, func(ctx context.Context) error { return semHold(ctx, w) }, release)
	}, nil
}

// semaphore.floor_admission
//
// pgcoord's data model written by hand: a row per key and a row per permit. The key's row
// also counts the permits held, so that the admission is one UPDATE of that row
// conditioned on held < permit_limit, which Postgres re-checks on the row's newest
// version after waiting for its lock (READ COMMITTED's EvalPlanQual): the limit holds
// under any concurrency. Counting the permit rows in that same statement instead would
// be wrong: the count reads the statement's snapshot, taken before the lock was granted,
// and misses permits committed meanwhile. (pgcoord's plpgsql admission counts the permit
// rows in a later statement of its function, after the lock, which sees them.) No bench
// permit expires, so the floor does not reclaim expired ones.

const (
	semFloorKeys    = "bench_semaphore_keys"
	semFloorPermits = "bench_semaphore_permits"
)

func setupSemFloor(ctx context.Context, pool *pgxpool.Pool) error {
	if _, err := pool.Exec(ctx, `CREATE TABLE `+semFloorKeys+` (
			key          text PRIMARY KEY,
			permit_limit integer NOT NULL,
			held         integer NOT NULL DEFAULT 0 CHECK (held >= 0),
			fence_token  bigint NOT NULL DEFAULT 0
		)`); err != nil {
		return err
	}
	_, err := pool.Exec(ctx, `CREATE TABLE `+semFloorPermits+` (
			key         text NOT NULL REFERENCES `+semFloorKeys+` (key),
			holder      text NOT NULL,
			fence_token bigint NOT NULL,
			acquired_at timestamptz NOT NULL,
			expires_at  timestamptz NOT NULL,
			PRIMARY KEY (key, holder)
		)`)
	return err
}

// semFloorAdmit admits $2 to key $1 if fewer permits than its limit are held, in one
// statement, and returns the permit's token; no row if the key is full.
const semFloorAdmit = `WITH slot AS (
	UPDATE ` + semFloorKeys + ` SET held = held + 1, fence_token = fence_token + 1
	 WHERE key = $1 AND held < permit_limit
	RETURNING fence_token
)
INSERT INTO ` + semFloorPermits + ` (key, holder, fence_token, acquired_at, expires_at)
SELECT $1, $2, fence_token, now(), now() + interval '30 seconds' FROM slot
RETURNING fence_token`

// semFloorRelease frees the permit (key, holder, token) and its count, in one statement.
const semFloorRelease = `WITH gone AS (
	DELETE FROM ` + semFloorPermits + ` WHERE key = $1 AND holder = $2 AND fence_token = $3 RETURNING key
)
UPDATE ` + semFloorKeys + ` k SET held = held - 1 FROM gone WHERE k.key = gone.key`

func newSemFloorAdmissionWorker(ctx context.Context, w Worker) (Op, error) {
	const name = FloorSemaphoreAdmission
	key := fmt.Sprintf("%s/%d", name, w.ID)
	holder := benchHolder(name, w)
	// The key's row, if an earlier measurement did not create it.
	_, err := w.Conn.Exec(ctx, `INSERT INTO `+semFloorKeys+` (key, permit_limit) VALUES ($1, $2) ON CONFLICT (key) DO NOTHING`,
		key, SemaphoreLimit)
	if err != nil {
		return nil, fmt.Errorf("bench: %s: %w", name, err)
	}
	return func(ctx context.Context) error {
		var token int64
		err := w.Conn.QueryRow(ctx, semFloorAdmit, key, holder).Scan(&token)
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("bench: %s: acquire of %q refused, but only this worker uses it", name, key)
		}
		if err != nil {
			return fmt.Errorf("bench: %s: acquire: %w", name, err)
		}
		tag, err := w.Conn.Exec(ctx, semFloorRelease, key, holder, token)
		if err != nil {
			return fmt.Errorf("bench: %s: release: %w", name, err)
		}
		if tag.RowsAffected() != 1 {
			return fmt.Errorf("bench: %s: release of %q token %d changed nothing", name, key, token)
		}
		return nil
	}, nil
}

// semaphore.floor_contended
//
// semaphore.floor_admission run this way (a key row counting the permits held) serializes
// every release behind the acquirers on that row: under 32 contenders it was several times
// slower than pgcoord itself, which makes it no floor. A careful
// hand-written semaphore for a hot key is K slot rows: an acquire claims any free or
// expired slot, skipping those another session is claiming, and a release touches only its
// own slot. It has no waiters, no counters and no fairness across keys, so it is a floor in
// the strict sense: less work than pgcoord's admission can be.

const (
	semSlotsTable    = "bench_semaphore_slots"
	semSlotsSequence = "bench_semaphore_slot_tokens" // tokens only go up (per key too)
)

func setupSemSlots(ctx context.Context, pool *pgxpool.Pool) error {
	if _, err := pool.Exec(ctx, `CREATE TABLE `+semSlotsTable+` (
			key         text NOT NULL,
			slot        integer NOT NULL,
			holder      text,       -- NULL: free
			fence_token bigint,
			expires_at  timestamptz,
			PRIMARY KEY (key, slot)
		)`); err != nil {
		return err
	}
	_, err := pool.Exec(ctx, `CREATE SEQUENCE `+semSlotsSequence)
	return err
}

// semSlotClaim claims a free or expired slot of key $1 for $2 and returns the slot and the
// token; no row when every slot is held or being claimed.
const semSlotClaim = `UPDATE ` + semSlotsTable + ` s
   SET holder = $2, fence_token = nextval('` + semSlotsSequence + `'), expires_at = now() + interval '30 seconds'
 WHERE (s.key, s.slot) = (SELECT key, slot FROM ` + semSlotsTable + `
                           WHERE key = $1 AND (holder IS NULL OR expires_at <= now())
                           LIMIT 1 FOR UPDATE SKIP LOCKED)
RETURNING s.slot, s.fence_token`

// semSlotFree frees the slot if it is still this grant (key, slot, holder, token).
const semSlotFree = `UPDATE ` + semSlotsTable + ` SET holder = NULL, expires_at = NULL
 WHERE key = $1 AND slot = $2 AND holder = $3 AND fence_token = $4`

func newSemFloorContendedWorker(ctx context.Context, w Worker) (Op, error) {
	const key = "contended"
	_, err := w.Conn.Exec(ctx, `INSERT INTO `+semSlotsTable+` (key, slot) SELECT $1, g FROM generate_series(1, $2::int) g
		ON CONFLICT (key, slot) DO NOTHING`, key, SemaphoreLimit)
	if err != nil {
		return nil, fmt.Errorf("bench: %s: %w", FloorSemaphoreContended, err)
	}
	held := semWorkerTracker(FloorSemaphoreContended, w)
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	holder := benchHolder(FloorSemaphoreContended, w)
	var (
		slot  int32
		token int64
	)
	admit := func(ctx context.Context) (bool, error) {
		err := w.Conn.QueryRow(ctx, semSlotClaim, key, holder).Scan(&slot, &token)
		if errors.Is(err, pgx.ErrNoRows) {
			return false, nil
		}
		return err == nil, err
	}
	release := func(ctx context.Context) error {
		tag, err := w.Conn.Exec(ctx, semSlotFree, key, slot, holder, token)
		if err != nil {
			return err
		}
		if tag.RowsAffected() != 1 {
			return fmt.Errorf("release of slot %d token %d changed nothing", slot, token)
		}
		return nil
	}
	hold := func(ctx context.Context) error { return semHold(ctx, w) }
	return func(ctx context.Context) error {
		return semContendedLoop(ctx, FloorSemaphoreContended, held, timer, admit, hold, release)
	}, nil
}
