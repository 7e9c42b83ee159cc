package semaphore

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/pgcoord/pgcoord/internal/coalesce"
	"github.com/pgcoord/pgcoord/internal/dbsqlc"
	"github.com/pgcoord/pgcoord/pgcoord"
)

// Admissions (TryAcquire and Acquire's attempts), renewals and releases coalesce the
// concurrent calls of one process on one pool, as the lease calls do (see leases and
// internal/coalesce): a call that finds none of its kind and commit mode in flight on its
// pool goes out at once, alone, as its plain statement; those that arrive meanwhile go out
// together, as one statement and one commit, in key order, under a short lock_timeout. A
// batch that fails in the database rolled back, and sends each of its calls alone: each
// call is idempotent for its holder. Calls on a transaction or a connection are sent
// alone, on it.

// maxBatch bounds the calls of one statement.
const maxBatch = 128

// lanes is how many batches of one kind may be in flight on a pool at once: an admission
// costs the server several times a lease grant (it counts the key's permits and line), so
// one statement at a time leaves the server's other cores idle. With one lane, 32 workers
// here (2 cores) reached 0.70 of the floor; with 4, 0.82-0.88; with 8, 0.77-0.95.
const lanes = 4

// outcome is one call's answer: the permit's row, whether it was admitted (or was held,
// for Renew and Release), or its own error.
type outcome = coalesce.Outcome[dbsqlc.SemaphoreAcquireRow]

type acquireCall struct {
	db          pgcoord.DBTX
	key, holder string
	generated   bool // holder is this call's own (no AcquireOpts.Holder): nobody else can ask for its permit
	limit       int32
	ttl, wait   pgtype.Interval // wait: the place in line of an Acquire's attempt (NULL: none)
	syncCommit  string
}

type renewCall struct {
	db          pgcoord.DBTX
	key, holder string
	token       int64
	ttl         pgtype.Interval
	durable     bool
}

type releaseCall struct {
	db          pgcoord.DBTX
	key, holder string
	token       int64
}

var (
	admissions = coalesce.New(maxBatch, func(ctx context.Context, cs []acquireCall) ([]outcome, error) {
		return coalesce.Each(ctx, cs, func(c acquireCall) string { return c.key }, acquireAlone, acquireTogether)
	}).Orphans(letGo).Lanes(lanes)
	renewals = coalesce.New(maxBatch, func(ctx context.Context, cs []renewCall) ([]outcome, error) {
		return coalesce.Each(ctx, cs, func(c renewCall) string { return c.key }, renewAlone, renewTogether)
	}).Lanes(lanes)
	releases = coalesce.New(maxBatch, func(ctx context.Context, cs []releaseCall) ([]outcome, error) {
		return coalesce.Each(ctx, cs, func(c releaseCall) string { return c.key }, releaseAlone, releaseTogether)
	}).Lanes(lanes)
)

// admit, renew and release send one call: with a pool, with the concurrent calls of the
// same kind and commit mode on it.
func admit(ctx context.Context, c acquireCall) outcome {
	return coalesce.Send(ctx, admissions, c.db, c.syncCommit, c)
}

func renew(ctx context.Context, c renewCall) outcome {
	return coalesce.Send(ctx, renewals, c.db, fmt.Sprint(c.durable), c)
}

func release(ctx context.Context, c releaseCall) outcome {
	return coalesce.Send(ctx, releases, c.db, "", c)
}

// letGo releases a permit whose caller gave up while its batch was in flight, when the
// holder was the call's own: nobody else can ask for it, so it would only take a slot until
// it expired. A caller-chosen holder keeps it: it gets it back by asking again.
func letGo(c acquireCall, o outcome) {
	if !o.OK || !c.generated {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	releaseAlone(ctx, releaseCall{db: c.db, key: c.key, holder: c.holder, token: o.Row.FenceToken})
}

func acquireAlone(ctx context.Context, c acquireCall) outcome {
	row, err := queries.SemaphoreAcquire(ctx, c.db, dbsqlc.SemaphoreAcquireParams{
		Key: c.key, Holder: c.holder, PermitLimit: c.limit, Ttl: c.ttl, Wait: c.wait, SyncCommit: c.syncCommit,
	})
	return coalesce.Found(row, err)
}

func acquireTogether(ctx context.Context, cs []acquireCall) ([]outcome, error) {
	p := dbsqlc.SemaphoreAcquireManyParams{LockTimeout: coalesce.LockTimeout, SyncCommit: cs[0].syncCommit}
	for _, c := range cs {
		p.Keys, p.Holders, p.PermitLimits = append(p.Keys, c.key), append(p.Holders, c.holder), append(p.PermitLimits, c.limit)
		p.Ttls, p.Waits = append(p.Ttls, c.ttl), append(p.Waits, c.wait)
	}
	rows, err := queries.SemaphoreAcquireMany(ctx, cs[0].db, p)
	return coalesce.Rows(len(cs), rows, err, func(r dbsqlc.SemaphoreAcquireManyRow) (int32, dbsqlc.SemaphoreAcquireRow) {
		return r.I, dbsqlc.SemaphoreAcquireRow{Key: r.Key, Holder: r.Holder, FenceToken: r.FenceToken,
			AcquiredAt: r.AcquiredAt, ExpiresAt: r.ExpiresAt, DbNow: r.DbNow}
	})
}

func renewAlone(ctx context.Context, c renewCall) outcome {
	row, err := queries.SemaphoreRenew(ctx, c.db, dbsqlc.SemaphoreRenewParams{
		Key: c.key, Holder: c.holder, FenceToken: c.token, Ttl: c.ttl, Durable: c.durable,
	})
	return coalesce.Found(dbsqlc.SemaphoreAcquireRow(row), err)
}

func renewTogether(ctx context.Context, cs []renewCall) ([]outcome, error) {
	p := dbsqlc.SemaphoreRenewManyParams{LockTimeout: coalesce.LockTimeout, Durable: cs[0].durable}
	for _, c := range cs {
		p.Keys, p.Holders, p.FenceTokens = append(p.Keys, c.key), append(p.Holders, c.holder), append(p.FenceTokens, c.token)
		p.Ttls = append(p.Ttls, c.ttl)
	}
	rows, err := queries.SemaphoreRenewMany(ctx, cs[0].db, p)
	return coalesce.Rows(len(cs), rows, err, func(r dbsqlc.SemaphoreRenewManyRow) (int32, dbsqlc.SemaphoreAcquireRow) {
		return r.I, dbsqlc.SemaphoreAcquireRow{Key: r.Key, Holder: r.Holder, FenceToken: r.FenceToken,
			AcquiredAt: r.AcquiredAt, ExpiresAt: r.ExpiresAt, DbNow: r.DbNow}
	})
}

func releaseAlone(ctx context.Context, c releaseCall) outcome {
	n, err := queries.SemaphoreRelease(ctx, c.db, dbsqlc.SemaphoreReleaseParams{Key: c.key, Holder: c.holder, FenceToken: c.token})
	return coalesce.Done[dbsqlc.SemaphoreAcquireRow](n > 0, err)
}

func releaseTogether(ctx context.Context, cs []releaseCall) ([]outcome, error) {
	p := dbsqlc.SemaphoreReleaseManyParams{LockTimeout: coalesce.LockTimeout}
	for _, c := range cs {
		p.Keys, p.Holders, p.FenceTokens = append(p.Keys, c.key), append(p.Holders, c.holder), append(p.FenceTokens, c.token)
	}
	rows, err := queries.SemaphoreReleaseMany(ctx, cs[0].db, p)
	return coalesce.Rows(len(cs), rows, err, func(i int32) (int32, dbsqlc.SemaphoreAcquireRow) { return i, dbsqlc.SemaphoreAcquireRow{} })
}
