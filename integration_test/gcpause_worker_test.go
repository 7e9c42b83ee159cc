//go:build unix

package integration_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgcoord/pgcoord/fenced"
	"github.com/pgcoord/pgcoord/internal/workerproc"
	"github.com/pgcoord/pgcoord/leases"
)

func init() { workerRoles[gcpauseRole] = chargeWorker }

func orderLease(order int64) string { return fmt.Sprintf("order:%d", order) }

// chargeWorker is a payment worker for one order. Parameters: ORDER, MODE (naive, fenced,
// guard), TTL, NAME (recorded with the charge) and ACQUIRE: "try" (leases.TryAcquire, says
// "held" if refused) or "wait" (leases.Acquire, bounded by WAIT). It says
// "acquired <token> <acquired_at> <expires_at>" (database clock, Unix microseconds), then
// waits for "go" on stdin and charges once, and says "charged", or "stale <reason>" when
// fencing refused the charge.
func chargeWorker(ctx context.Context, w *workerproc.Worker) error {
	order, err := strconv.ParseInt(w.Param("ORDER"), 10, 64)
	if err != nil {
		return err
	}
	ttl, err := time.ParseDuration(w.Param("TTL"))
	if err != nil {
		return err
	}
	name := orderLease(order)
	var l leases.Lease
	switch w.Param("ACQUIRE") {
	case "try":
		l, err = leases.TryAcquire(ctx, w.Pool, name, ttl, nil)
		if errors.Is(err, leases.ErrHeld) {
			w.Say("held")
			return nil
		}
	case "wait":
		wait, perr := time.ParseDuration(w.Param("WAIT"))
		if perr != nil {
			return perr
		}
		actx, cancel := context.WithTimeout(ctx, wait)
		l, err = leases.Acquire(actx, w.Pool, name, ttl, nil)
		cancel()
	default:
		return fmt.Errorf("ACQUIRE %q: want try or wait", w.Param("ACQUIRE"))
	}
	if err != nil {
		return err
	}
	w.Say("acquired %d %d %d", l.Token, l.AcquiredAt.UnixMicro(), l.ExpiresAt.UnixMicro())

	// Anything can happen here: the test may stop this process for as long as it likes.
	if err := w.Await("go"); err != nil {
		return err
	}

	who := w.Param("NAME")
	switch mode := w.Param("MODE"); mode {
	case "naive":
		// Redis-lock style: the holder believes the lease still protects it.
		if _, err := w.Pool.Exec(ctx, `INSERT INTO charges (order_id, worker, token) VALUES ($1, $2, $3)`, order, who, l.Token); err != nil {
			return err
		}
	case "fenced":
		tx, err := w.Pool.Begin(ctx)
		if err != nil {
			return err
		}
		defer tx.Rollback(ctx) //nolint:errcheck // a no-op after Commit
		if err := fenced.Check(ctx, tx, name, l.Token); errors.Is(err, fenced.ErrStale) {
			w.Say("stale %s", strings.ReplaceAll(err.Error(), " ", "_"))
			return nil
		} else if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO charges (order_id, worker, token) VALUES ($1, $2, $3)`, order, who, l.Token); err != nil {
			return err
		}
		if err := tx.Commit(ctx); err != nil {
			return err
		}
	case "guard":
		// No fence comparison in the WHERE clause: only the trigger stands in the way.
		tag, err := w.Pool.Exec(ctx, `UPDATE payments
			SET status = 'charged', worker = $2, charges = charges + 1, fence_token = $3
			WHERE order_id = $1`, order, who, l.Token)
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == fenced.GuardSQLState {
			if !fenced.IsStale(err) {
				return fmt.Errorf("fenced.IsStale does not recognize the guard's error %v", err)
			}
			w.Say("stale %s", pgErr.Code)
			return nil
		}
		if err != nil {
			return err
		}
		if tag.RowsAffected() != 1 {
			return fmt.Errorf("payment %d: updated %d rows, want 1", order, tag.RowsAffected())
		}
	default:
		return fmt.Errorf("MODE %q: want naive, fenced or guard", mode)
	}
	w.Say("charged")
	return nil
}
