package leases

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/pgcoord/pgcoord/internal/coalesce"
	"github.com/pgcoord/pgcoord/internal/dbsqlc"
	"github.com/pgcoord/pgcoord/pgcoord"
)

// TryAcquire, Renew and Release coalesce the concurrent calls of one process on one pool
// (see internal/coalesce): a call that finds fewer than two of its kind (and commit mode)
// in flight on its pool goes out at once, alone, as its plain statement; those that arrive
// while two are out go together, as one statement and one commit, when one returns. Calls on a transaction or
// a connection are sent alone, on it.
//
// A batch runs its calls in name order, under a short lock_timeout (coalesce.Each and
// LockTimeout, and the queries in sql/queries/leases.sql); one that fails in the database
// rolled back, and sends each of its calls alone, as if it had never been merged:
// TryAcquire, Renew and Release are idempotent for their holder.

// maxBatch bounds the calls of one statement.
const maxBatch = 128

// lanes is how many batches of one kind may be in flight on a pool at once. With one, a
// client short of CPU (the goroutine that sends the next batch held off a core) stalls
// every merged call: 32 workers beside two CPU-bound processes reached 0.28-0.31 of the
// floor with one lane, 0.47 with two; on a quiet machine both reached 1.3.
const lanes = 2

// outcome is one call's answer: the row of its grant, whether it was granted (or was
// current, for Renew and Release), or its own error.
type outcome = coalesce.Outcome[dbsqlc.AcquireLeaseRow]

type acquireCall struct {
	db           pgcoord.DBTX
	name, holder string
	generated    bool // holder is this call's own (no AcquireOpts.Holder): nobody else can ask for its grant
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
		return coalesce.Each(ctx, cs, func(c acquireCall) string { return c.name }, acquireAlone, acquireTogether)
	}).Orphans(letGo).Lanes(lanes)
	renewals = coalesce.New(maxBatch, func(ctx context.Context, cs []renewCall) ([]outcome, error) {
		return coalesce.Each(ctx, cs, func(c renewCall) string { return c.name }, renewAlone, renewTogether)
	}).Lanes(lanes)
	releases = coalesce.New(maxBatch, func(ctx context.Context, cs []releaseCall) ([]outcome, error) {
		return coalesce.Each(ctx, cs, func(c releaseCall) string { return c.name }, releaseAlone, releaseTogether)
	}).Lanes(lanes)
)

// acquire, renew and release send one call: with a pool, with the concurrent calls of the
// same kind and commit mode on it.
func acquire(ctx context.Context, c acquireCall) outcome {
	return coalesce.Send(ctx, acquires, c.db, c.syncCommit, c)
}

func renew(ctx context.Context, c renewCall) outcome {
	return coalesce.Send(ctx, renewals, c.db, fmt.Sprint(c.durable), c)
}

func release(ctx context.Context, c releaseCall) outcome {
	return coalesce.Send(ctx, releases, c.db, "", c)
}

// letGo releases a grant whose caller gave up while its batch was in flight, when the
// holder was the call's own: nobody else can ask for it, so it would only block the name
// until it expired. A caller-chosen holder keeps it: it gets it back by asking again.
func letGo(c acquireCall, o outcome) {
	if !o.OK || !c.generated {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	releaseAlone(ctx, releaseCall{db: c.db, name: c.name, holder: c.holder, token: o.Row.FenceToken})
}

func acquireAlone(ctx context.Context, c acquireCall) outcome {
	row, err := queries.AcquireLease(ctx, c.db, dbsqlc.AcquireLeaseParams{
		Name: c.name, Holder: c.holder, Ttl: c.ttl, Metadata: c.meta, SyncCommit: c.syncCommit,
	})
	return coalesce.Found(row, err)
}

func acquireTogether(ctx context.Context, cs []acquireCall) ([]outcome, error) {
	p := dbsqlc.AcquireLeasesParams{LockTimeout: coalesce.LockTimeout, SyncCommit: cs[0].syncCommit}
	for _, c := range cs {
		p.Names, p.Holders, p.Ttls = append(p.Names, c.name), append(p.Holders, c.holder), append(p.Ttls, c.ttl)
		p.Metadata = append(p.Metadata, c.meta)
	}
	rows, err := queries.AcquireLeases(ctx, cs[0].db, p)
	return coalesce.Rows(len(cs), rows, err, func(r dbsqlc.AcquireLeasesRow) (int32, dbsqlc.AcquireLeaseRow) {
		return r.I, dbsqlc.AcquireLeaseRow{Name: r.Name, FenceToken: r.FenceToken, Holder: r.Holder,
			AcquiredAt: r.AcquiredAt, ExpiresAt: r.ExpiresAt, DbNow: r.DbNow}
	})
}

func renewAlone(ctx context.Context, c renewCall) outcome {
	row, err := queries.RenewLease(ctx, c.db, dbsqlc.RenewLeaseParams{
		Name: c.name, Holder: c.holder, FenceToken: c.token, Ttl: c.ttl, Durable: c.durable,
	})
	return coalesce.Found(dbsqlc.AcquireLeaseRow(row), err)
}

func renewTogether(ctx context.Context, cs []renewCall) ([]outcome, error) {
	p := dbsqlc.RenewLeasesParams{LockTimeout: coalesce.LockTimeout, Durable: cs[0].durable}
	for _, c := range cs {
		p.Names, p.Holders, p.FenceTokens = append(p.Names, c.name), append(p.Holders, c.holder), append(p.FenceTokens, c.token)
		p.Ttls = append(p.Ttls, c.ttl)
	}
	rows, err := queries.RenewLeases(ctx, cs[0].db, p)
	return coalesce.Rows(len(cs), rows, err, func(r dbsqlc.RenewLeasesRow) (int32, dbsqlc.AcquireLeaseRow) {
		return r.I, dbsqlc.AcquireLeaseRow{Name: r.Name, FenceToken: r.FenceToken, Holder: r.Holder,
			AcquiredAt: r.AcquiredAt, ExpiresAt: r.ExpiresAt, DbNow: r.DbNow}
	})
}

func releaseAlone(ctx context.Context, c releaseCall) outcome {
	n, err := queries.ReleaseLease(ctx, c.db, dbsqlc.ReleaseLeaseParams{Name: c.name, Holder: c.holder, FenceToken: c.token})
	return coalesce.Done[dbsqlc.AcquireLeaseRow](n > 0, err)
}

func releaseTogether(ctx context.Context, cs []releaseCall) ([]outcome, error) {
	p := dbsqlc.ReleaseLeasesParams{LockTimeout: coalesce.LockTimeout}
	for _, c := range cs {
		p.Names, p.Holders, p.FenceTokens = append(p.Names, c.name), append(p.Holders, c.holder), append(p.FenceTokens, c.token)
	}
	rows, err := queries.ReleaseLeases(ctx, cs[0].db, p)
	return coalesce.Rows(len(cs), rows, err, func(i int32) (int32, dbsqlc.AcquireLeaseRow) { return i, dbsqlc.AcquireLeaseRow{} })
}
