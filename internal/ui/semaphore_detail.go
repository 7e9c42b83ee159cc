package ui

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgcoord/pgcoord/semaphore"
)

// detailRows bounds the permits, waiters, runs or messages a detail lists.
const detailRows = 100

// semDetail is one semaphore key with who holds its permits and who waits, and since when.
type semDetail struct {
	Key     string
	Status  *semRow // nil: no such key
	Missing string
	Permits []permitRow
	Waiters []waiterRow
	// More reports that the key has more permits or waiters than detailRows.
	MorePermits, MoreWaiters bool
	Rows                     int
	DBNow                    time.Time
}

type permitRow struct {
	Holder                           string
	Token                            int64
	AcquiredAt, RenewedAt, ExpiresAt time.Time
	Reserved, Live                   bool
	Held, Left                       time.Duration
}

type waiterRow struct {
	Holder             string
	Since, WantedUntil time.Time
	Waited             time.Duration
	// Live: the waiter refreshed its wish lately (wanted_until is ahead); a waiter that
	// stopped refreshing (a dead process) is ignored by admissions.
	Live bool
}

// loadSemDetail reads a key's status (semaphore.Get) and its permits and waiters, oldest
// first, at most detailRows each: three queries.
func loadSemDetail(ctx context.Context, s *Server, key string) (*semDetail, error) {
	d := &semDetail{Key: key, Rows: detailRows}
	st, err := semaphore.Get(ctx, s.cfg.Pool, key)
	switch {
	case errors.Is(err, semaphore.ErrNotFound):
		// A link's text is not shown back (it could say anything): only known keys are.
		d.Key, d.Missing = "", "no semaphore key of that name"
		return d, nil
	case err != nil:
		return nil, err
	}
	d.Status = &semRow{KeyStatus: st, Status: semStatus(st), Scale: float64(max(st.Limit, st.Held+st.Expired))}
	d.DBNow = st.DBNow
	rows, err := s.cfg.Pool.Query(ctx, `
		SELECT p.holder, p.fence_token, p.acquired_at, coalesce(p.renewed_at, p.acquired_at), p.expires_at, p.reserved,
		       pgcoord_now()
		  FROM pgcoord_semaphore_permits p WHERE p.key = $1 ORDER BY p.acquired_at, p.holder LIMIT $2`, key, detailRows+1)
	if err != nil {
		return nil, err
	}
	d.Permits, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (permitRow, error) {
		var p permitRow
		var now time.Time
		err := r.Scan(&p.Holder, &p.Token, &p.AcquiredAt, &p.RenewedAt, &p.ExpiresAt, &p.Reserved, &now)
		p.Live, p.Held, p.Left = p.ExpiresAt.After(now), max(now.Sub(p.AcquiredAt), 0), max(p.ExpiresAt.Sub(now), 0)
		return p, err
	})
	if err != nil {
		return nil, err
	}
	if d.MorePermits = len(d.Permits) > detailRows; d.MorePermits {
		d.Permits = d.Permits[:detailRows]
	}
	rows, err = s.cfg.Pool.Query(ctx, `
		SELECT w.holder, w.since, w.wanted_until, pgcoord_now()
		  FROM pgcoord_semaphore_waiters w WHERE w.key = $1 ORDER BY w.since, w.holder LIMIT $2`, key, detailRows+1)
	if err != nil {
		return nil, err
	}
	d.Waiters, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (waiterRow, error) {
		var w waiterRow
		var now time.Time
		err := r.Scan(&w.Holder, &w.Since, &w.WantedUntil, &now)
		w.Live, w.Waited = w.WantedUntil.After(now), max(now.Sub(w.Since), 0)
		return w, err
	})
	if err != nil {
		return nil, err
	}
	if d.MoreWaiters = len(d.Waiters) > detailRows; d.MoreWaiters {
		d.Waiters = d.Waiters[:detailRows]
	}
	return d, nil
}
