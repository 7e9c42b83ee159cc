package leases

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/internal/coalesce"
	"github.com/pgcoord/pgcoord/internal/dbsqlc"
	"github.com/pgcoord/pgcoord/pgcoord"
)

// TryAcquire, Renew and Release coalesce the concurrent calls of one process on one pool
// (see internal/coalesce): a call that finds none of its kind (and commit mode) in flight on
// its pool goes out at once, alone, as its plain statement; those that arrive meanwhile go
// out together, as one statement and one commit, once it returns. Calls on a transaction or
// a connection are sent alone, on it.
//
// A batch runs its calls in name order, so two batches take rows in one order, and with
// lock_timeout batchLockTimeout (see the queries in sql/queries/leases.sql): it holds the
// rows it has written while it runs the next calls, so it must not wait for a row that a
// transaction waiting for one of its own might hold. A batch that fails in the database
// (and so rolled back) sends each of its calls alone, as if it had never been merged.

// maxBatch bounds the calls of one statement.
const maxBatch = 128

// batchLockTimeout bounds how long a batch waits for one row: far longer than another
// grant's commit, far shorter than deadlock_timeout (1 s by default), so that a batch in a
// cycle of lock waits gives up before the other party is chosen to die.
const batchLockTimeout = "100ms"

// outcome is one call's answer: the row of its grant, whether it was granted (or was
// current, for Renew and Release), or its own error.
type outcome struct {
	row dbsqlc.AcquireLeaseRow
	ok  bool
	err error
}

type acquireCall struct {
	db           pgcoord.DBTX
	name, holder string
	ttl          pgtype.Interval
	meta         []byte
	syncCommit   string
}

type renewCall struct {
	db           pgcoord.DBTX
	name, holder string
	token        int64
	ttl          pgtype.Interval
	durable      bool
}

type releaseCall struct {
	db           pgcoord.DBTX
	name, holder string
	token        int64
}

var (
	acquires = coalesce.New(maxBatch, func(ctx context.Context, cs []acquireCall) ([]outcome, error) {
		return each(ctx, cs, func(c acquireCall) string { return c.name }, acquireAlone, acquireTogether)
	})
	renewals = coalesce.New(maxBatch, func(ctx context.Context, cs []renewCall) ([]outcome, error) {
		return each(ctx, cs, func(c renewCall) string { return c.name }, renewAlone, renewTogether)
	})
	releases = coalesce.New(maxBatch, func(ctx context.Context, cs []releaseCall) ([]outcome, error) {
		return each(ctx, cs, func(c releaseCall) string { return c.name }, releaseAlone, releaseTogether)
	})
)

// acquire, renew and release send one call: with a pool, with the concurrent calls of the
// same kind and commit mode on it.
func acquire(ctx context.Context, c acquireCall) outcome {
	return send(ctx, acquires, c.db, c.syncCommit, c, acquireAlone)
}

func renew(ctx context.Context, c renewCall) outcome {
	return send(ctx, renewals, c.db, fmt.Sprint(c.durable), c, renewAlone)
}

func release(ctx context.Context, c releaseCall) outcome {
	return send(ctx, releases, c.db, "", c, releaseAlone)
}

func send[T any](ctx context.Context, b *coalesce.Batcher[T, outcome], db pgcoord.DBTX, mode string, c T, alone func(context.Context, T) outcome) outcome {
	pool, ok := db.(*pgxpool.Pool)
	if !ok {
		return alone(ctx, c)
	}
	o, err := b.Do(ctx, fmt.Sprintf("%p\x00%s", pool, mode), c)
	if err != nil {
		return outcome{err: err}
	}
	return o
}

// each runs calls: one alone, several together in name order (arrival order among calls
// of one name). If the batch fails in the database, it rolled back: each call is then sent
// alone. If its connection fails, whether it committed is not known, and every call gets
// the error (a TryAcquire asks again as its holder).
func each[T any](ctx context.Context, calls []T, name func(T) string,
	alone func(context.Context, T) outcome,
	together func(context.Context, []T) (map[int32]dbsqlc.AcquireLeaseRow, error),
) ([]outcome, error) {
	out := make([]outcome, len(calls))
	if len(calls) == 1 {
		out[0] = alone(ctx, calls[0])
		return out, nil
	}
	order := make([]int, len(calls))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(name(calls[a]), name(calls[b])) })
	sorted := make([]T, len(calls))
	for pos, i := range order {
		sorted[pos] = calls[i]
	}
	rows, err := together(ctx, sorted)
	var pgErr *pgconn.PgError
	switch {
	case err == nil:
		for pos, i := range order {
			row, ok := rows[int32(pos+1)]
			out[i] = outcome{row: row, ok: ok}
		}
	case errors.As(err, &pgErr) && ctx.Err() == nil:
		for i, c := range calls {
			out[i] = alone(ctx, c)
		}
	default:
		return nil, err
	}
	return out, nil
}

func acquireAlone(ctx context.Context, c acquireCall) outcome {
	row, err := queries.AcquireLease(ctx, c.db, dbsqlc.AcquireLeaseParams{
		Name: c.name, Holder: c.holder, Ttl: c.ttl, Metadata: c.meta, SyncCommit: c.syncCommit,
	})
	return rowOutcome(row, err)
}

func acquireTogether(ctx context.Context, cs []acquireCall) (map[int32]dbsqlc.AcquireLeaseRow, error) {
	p := dbsqlc.AcquireLeasesParams{LockTimeout: batchLockTimeout, SyncCommit: cs[0].syncCommit}
	for _, c := range cs {
		p.Names, p.Holders, p.Ttls = append(p.Names, c.name), append(p.Holders, c.holder), append(p.Ttls, c.ttl)
		p.Metadata = append(p.Metadata, c.meta)
	}
	rows, err := queries.AcquireLeases(ctx, cs[0].db, p)
	return byPosition(rows, err, func(r dbsqlc.AcquireLeasesRow) (int32, dbsqlc.AcquireLeaseRow) {
		return r.I, dbsqlc.AcquireLeaseRow{Name: r.Name, FenceToken: r.FenceToken, Holder: r.Holder,
			AcquiredAt: r.AcquiredAt, ExpiresAt: r.ExpiresAt, DbNow: r.DbNow}
	})
}

func renewAlone(ctx context.Context, c renewCall) outcome {
	row, err := queries.RenewLease(ctx, c.db, dbsqlc.RenewLeaseParams{
		Name: c.name, Holder: c.holder, FenceToken: c.token, Ttl: c.ttl, Durable: c.durable,
	})
	return rowOutcome(dbsqlc.AcquireLeaseRow(row), err)
}

func renewTogether(ctx context.Context, cs []renewCall) (map[int32]dbsqlc.AcquireLeaseRow, error) {
	p := dbsqlc.RenewLeasesParams{LockTimeout: batchLockTimeout, Durable: cs[0].durable}
	for _, c := range cs {
		p.Names, p.Holders, p.FenceTokens = append(p.Names, c.name), append(p.Holders, c.holder), append(p.FenceTokens, c.token)
		p.Ttls = append(p.Ttls, c.ttl)
	}
	rows, err := queries.RenewLeases(ctx, cs[0].db, p)
	return byPosition(rows, err, func(r dbsqlc.RenewLeasesRow) (int32, dbsqlc.AcquireLeaseRow) {
		return r.I, dbsqlc.AcquireLeaseRow{Name: r.Name, FenceToken: r.FenceToken, Holder: r.Holder,
			AcquiredAt: r.AcquiredAt, ExpiresAt: r.ExpiresAt, DbNow: r.DbNow}
	})
}

func releaseAlone(ctx context.Context, c releaseCall) outcome {
	n, err := queries.ReleaseLease(ctx, c.db, dbsqlc.ReleaseLeaseParams{Name: c.name, Holder: c.holder, FenceToken: c.token})
	return outcome{ok: n > 0, err: err}
}

func releaseTogether(ctx context.Context, cs []releaseCall) (map[int32]dbsqlc.AcquireLeaseRow, error) {
	p := dbsqlc.ReleaseLeasesParams{LockTimeout: batchLockTimeout}
	for _, c := range cs {
		p.Names, p.Holders, p.FenceTokens = append(p.Names, c.name), append(p.Holders, c.holder), append(p.FenceTokens, c.token)
	}
	rows, err := queries.ReleaseLeases(ctx, cs[0].db, p)
	return byPosition(rows, err, func(i int32) (int32, dbsqlc.AcquireLeaseRow) { return i, dbsqlc.AcquireLeaseRow{} })
}

// rowOutcome is the outcome of a call sent alone: no row means refused (or not current).
func rowOutcome(row dbsqlc.AcquireLeaseRow, err error) outcome {
	if errors.Is(err, pgx.ErrNoRows) {
		return outcome{}
	}
	return outcome{row: row, ok: err == nil, err: err}
}

// byPosition maps a batch's rows by the position of their call.
func byPosition[R any](rows []R, err error, split func(R) (int32, dbsqlc.AcquireLeaseRow)) (map[int32]dbsqlc.AcquireLeaseRow, error) {
	if err != nil {
		return nil, err
	}
	m := make(map[int32]dbsqlc.AcquireLeaseRow, len(rows))
	for _, r := range rows {
		i, row := split(r)
		m[i] = row
	}
	return m, nil
}
