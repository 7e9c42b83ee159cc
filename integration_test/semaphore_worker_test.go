//go:build unix

package integration_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/internal/workerproc"
	"github.com/pgcoord/pgcoord/semaphore"
)

func init() { workerRoles[semRole] = semaphoreWorker }

// semaphoreWorker loops taking, holding and releasing permits of semKeys until told "quit"
// on stdin (or stdin closes). Parameters: NAME (its name; its holders are NAME/1, NAME/2,
// ...), SEED.
//
// It says:
//   - "ready" once it runs;
//   - "acquired <key> <token>" when a permit and its record committed;
//   - "released <key> <token>" when the release and its record committed;
//   - "lost <key> <token>" when a renewal or release found the permit gone;
//   - "bye" when it stops after "quit", holding nothing.
func semaphoreWorker(ctx context.Context, w *workerproc.Worker) error {
	name := w.Param("NAME")
	seed, err := strconv.ParseUint(w.Param("SEED"), 10, 64)
	if err != nil {
		return err
	}
	rng := rand.New(rand.NewPCG(seed, 7))
	quit := make(chan struct{})
	go func() {
		defer close(quit)
		for {
			if cmd, err := w.Next(); err != nil || cmd == "quit" {
				return
			}
		}
	}()
	w.Say("ready")
	for n := 1; ; n++ {
		select {
		case <-quit:
			w.Say("bye")
			return nil
		default:
		}
		holder := fmt.Sprintf("%s/%d", name, n)
		p, ok, err := semTake(ctx, w.Pool, holder, rng)
		if err != nil {
			return err
		}
		if !ok {
			continue
		}
		w.Say("acquired %s %d", p.Key, p.Token)
		if err := semHold(ctx, w, p, time.Duration(rng.Int64N(int64(2*semTTL))), quit); err != nil {
			return err
		}
	}
}

// semTake takes a permit of one of semKeys and records it, or reports that it got none
// this time.
func semTake(ctx context.Context, pool *pgxpool.Pool, holder string, rng *rand.Rand) (semaphore.Permit, bool, error) {
	opts := &semaphore.AcquireOpts{Holder: holder, PollInterval: 100 * time.Millisecond}
	order := rng.Perm(len(semKeys))
	for _, i := range order {
		var p semaphore.Permit
		granted := false
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			var err error
			p, err = semaphore.TryAcquire(ctx, tx, semKeys[i], semLimit, semTTL, opts)
			if errors.Is(err, semaphore.ErrFull) {
				return nil
			}
			if err != nil {
				return err
			}
			granted = true
			return semRecord(ctx, tx, p)
		})
		if err != nil || granted {
			return p, granted, err
		}
	}
	// Both full: wait in line for one, at most a TTL, then look at both again.
	actx, cancel := context.WithTimeout(ctx, semTTL)
	defer cancel()
	p, err := semaphore.Acquire(actx, pool, semKeys[order[0]], semLimit, semTTL, opts)
	if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
		return p, false, nil
	}
	if err != nil {
		return p, false, err
	}
	// Record it with a renewal, which also proves it is still held.
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		r, err := semaphore.Renew(ctx, tx, p, semTTL, nil)
		if err != nil {
			return err
		}
		p = r
		return semRecord(ctx, tx, p)
	})
	if errors.Is(err, semaphore.ErrLost) {
		return p, false, nil
	}
	return p, err == nil, err
}

func semRecord(ctx context.Context, tx pgx.Tx, p semaphore.Permit) error {
	worker, _, _ := strings.Cut(p.Holder, "/")
	_, err := tx.Exec(ctx, `INSERT INTO sem_history (key, token, holder, worker, started_at, expires_at)
		VALUES ($1, $2, $3, $4, clock_timestamp(), $5)`, p.Key, p.Token, p.Holder, worker, p.ExpiresAt)
	return err
}

// semHold works for d, renewing every third of the TTL, then releases. Each renewal and the
// release commit with their record.
func semHold(ctx context.Context, w *workerproc.Worker, p semaphore.Permit, d time.Duration, quit <-chan struct{}) error {
	done := time.After(d)
	tick := time.NewTicker(semTTL / 3)
	defer tick.Stop()
	for {
		select {
		case <-done:
		case <-quit:
		case <-tick.C:
			err := pgx.BeginFunc(ctx, w.Pool, func(tx pgx.Tx) error {
				r, err := semaphore.Renew(ctx, tx, p, semTTL, nil)
				if err != nil {
					return err
				}
				p = r
				_, err = tx.Exec(ctx, `UPDATE sem_history SET expires_at = $3 WHERE key = $1 AND token = $2`, p.Key, p.Token, p.ExpiresAt)
				return err
			})
			if errors.Is(err, semaphore.ErrLost) {
				w.Say("lost %s %d", p.Key, p.Token)
				return nil
			}
			if err != nil {
				return err
			}
			continue
		}
		break
	}
	err := pgx.BeginFunc(ctx, w.Pool, func(tx pgx.Tx) error {
		if err := semaphore.Release(ctx, tx, p); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `UPDATE sem_history SET ended_at = clock_timestamp() WHERE key = $1 AND token = $2`, p.Key, p.Token)
		return err
	})
	switch {
	case errors.Is(err, semaphore.ErrLost):
		w.Say("lost %s %d", p.Key, p.Token)
		return nil
	case err != nil:
		return err
	}
	w.Say("released %s %d", p.Key, p.Token)
	return nil
}
