package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
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
		Name: "leases.acquire_release",
		Description: "leases.TryAcquire then leases.Release of a key per worker, through one pool the workers share " +
			"(which coalesces their concurrent calls: alone, each is one autocommit round trip)",
		Floor:     "floor.lease",
		Setup:     setupSharedPool,
		NewWorker: newAcquireReleaseWorker,
	})
	Register(Scenario{
		Name: "leases.contended",
		Description: "all workers on one key, through one pool they share: an op is one success — TryAcquire " +
			"retried at once on ErrHeld until granted, then Release — so ops/s is successes/s and failed attempts only add latency",
		Floor:     FloorLeaseContended,
		Setup:     setupSharedPool,
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
	pool, err := sharedPool(w)
	if err != nil {
		return nil, err
	}
	name := fmt.Sprintf("leases.acquire_release/%d", w.ID)
	opts := &leases.AcquireOpts{Holder: benchHolder("leases.acquire_release", w)}
	return func(ctx context.Context) error {
		l, err := leases.TryAcquire(ctx, pool, name, benchTTL, opts)
		if err != nil {
			return fmt.Errorf("bench: leases.acquire_release: acquire of %q (only this worker uses it): %w", name, err)
		}
		if err := leases.Release(ctx, pool, l, nil); err != nil {
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
	pool, err := sharedPool(w)
	if err != nil {
		return nil, err
	}
	opts := &leases.AcquireOpts{Holder: benchHolder("leases.contended", w)}
	return func(ctx context.Context) error {
		deadline := time.Now().Add(contendedPatience)
		for {
			l, err := leases.TryAcquire(ctx, pool, ContendedKey, benchTTL, opts)
			if errors.Is(err, leases.ErrHeld) {
				if time.Now().After(deadline) {
					return fmt.Errorf("bench: leases.contended: refused for %v", contendedPatience)
				}
				continue // a failed attempt: no commit, try again at once
			}
			if err != nil {
				return fmt.Errorf("bench: leases.contended: %w", err)
			}
			if err := leases.Release(ctx, pool, l, nil); err != nil {
				return fmt.Errorf("bench: leases.contended: %w", err)
			}
			return nil
		}
	}, nil
}

// floorContendedTable is leases.floor_contended's table, shaped like floor.lease's.
const floorContendedTable = "bench_floor_lease_contended"

func setupFloorLeaseContended(ctx context.Context, pool *pgxpool.Pool) error {
	return createFloorLeaseTable(ctx, pool, floorContendedTable)
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
