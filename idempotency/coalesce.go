package idempotency

import (
	"context"
	"encoding/json"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/internal/coalesce"
	"github.com/pgcoord/pgcoord/internal/dbsqlc"
)

// The statements an attempt sends on its pool — a non-Atomic attempt's claim, stored
// response (up to maxBatchBody bytes) and release, and every attempt's renewals — coalesce
// with those of the process's other attempts on the same pool, as the lease calls do (see package leases and internal/coalesce): one that
// finds none of its kind in flight goes out at once, alone; those that arrive meanwhile go
// out together, as one statement and one commit, in (scope, key) order under a short
// lock_timeout. A batch that fails in the database rolled back and sends each call alone.
// An Atomic attempt's statements go on its own connection, in its handler's transaction,
// and are never merged.

// maxBatch bounds the calls of one statement; a stored response of more than maxBatchBody
// bytes goes alone, so that one statement carries at most maxBatch × maxBatchBody bytes of
// responses.
const (
	maxBatch     = 64
	maxBatchBody = 64 << 10
)

// keyCall is one call on a key: its claim (fingerprint, retention, lease), stored response
// (status, headers, body), renewal (lease) or release.
type keyCall struct {
	pool               *pgxpool.Pool
	scope, key, holder string
	fingerprint        []byte
	retention, lease   pgtype.Interval
	status             int32
	headers            json.RawMessage
	body               []byte
}

func (c keyCall) sortKey() string { return c.scope + "\x00" + c.key }

// keyOutcome is one call's answer: the key's row (a claim's), whether there was one (or
// the renewal, release or stored response took effect), or the call's own error.
type keyOutcome = coalesce.Outcome[dbsqlc.PgcoordIdempotencyKey]

var (
	claims = coalesce.New(maxBatch, func(ctx context.Context, cs []keyCall) ([]keyOutcome, error) {
		return coalesce.Each(ctx, cs, keyCall.sortKey, claimAlone, claimTogether)
	}).Orphans(giveBack)
	completions = coalesce.New(maxBatch, func(ctx context.Context, cs []keyCall) ([]keyOutcome, error) {
		return coalesce.Each(ctx, cs, keyCall.sortKey, completeAlone, completeTogether)
	})
	renewals = coalesce.New(maxBatch, func(ctx context.Context, cs []keyCall) ([]keyOutcome, error) {
		return coalesce.Each(ctx, cs, keyCall.sortKey, renewAlone, renewTogether)
	})
	releases = coalesce.New(maxBatch, func(ctx context.Context, cs []keyCall) ([]keyOutcome, error) {
		return coalesce.Each(ctx, cs, keyCall.sortKey, releaseAlone, releaseTogether)
	})
)

// coalesced sends c through b, with the concurrent calls of its kind on its pool.
func coalesced(ctx context.Context, b *coalesce.Batcher[keyCall, keyOutcome], c keyCall) keyOutcome {
	return coalesce.Send(ctx, b, c.pool, "", c)
}

// giveBack releases a key whose claimer gave up while its batch was in flight: the holder
// is always the attempt's own, so nobody would run it until its lease lapsed.
func giveBack(c keyCall, o keyOutcome) {
	if !o.OK || o.Row.State != StateInFlight || o.Row.Holder != c.holder {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	releaseAlone(ctx, c)
}

func claimAlone(ctx context.Context, c keyCall) keyOutcome {
	rows, err := c.pool.Query(ctx, claimSQL, c.scope, c.key, c.fingerprint, c.holder, c.retention, c.lease)
	if err != nil {
		return keyOutcome{Err: err}
	}
	return coalesce.Found(pgx.CollectExactlyOneRow(rows, pgx.RowToStructByPos[dbsqlc.PgcoordIdempotencyKey]))
}

func claimTogether(ctx context.Context, cs []keyCall) ([]keyOutcome, error) {
	p := dbsqlc.IdempotencyClaimManyParams{LockTimeout: coalesce.LockTimeout}
	for _, c := range cs {
		p.Scopes, p.Keys, p.Holders = append(p.Scopes, c.scope), append(p.Keys, c.key), append(p.Holders, c.holder)
		p.Fingerprints, p.Retentions, p.Leases = append(p.Fingerprints, c.fingerprint), append(p.Retentions, c.retention), append(p.Leases, c.lease)
	}
	rows, err := queries.IdempotencyClaimMany(ctx, cs[0].pool, p)
	return coalesce.Rows(len(cs), rows, err, func(r dbsqlc.IdempotencyClaimManyRow) (int32, dbsqlc.PgcoordIdempotencyKey) {
		return r.I, dbsqlc.PgcoordIdempotencyKey{
			Scope: r.Scope, Key: r.Key, Fingerprint: r.Fingerprint, State: r.State, Holder: r.Holder,
			Attempts: r.Attempts, RecoveryPoint: r.RecoveryPoint, RecoveryData: r.RecoveryData,
			Status: r.Status, Headers: r.Headers, Body: r.Body, CreatedAt: r.CreatedAt,
			UpdatedAt: r.UpdatedAt, CompletedAt: r.CompletedAt, ExpiresAt: r.ExpiresAt,
			LeaseExpiresAt: r.LeaseExpiresAt,
		}
	})
}

func completeAlone(ctx context.Context, c keyCall) keyOutcome {
	_, err := c.pool.Exec(ctx, completeSQL, c.scope, c.key, c.holder, c.status, c.headers, c.body)
	return coalesce.Done[dbsqlc.PgcoordIdempotencyKey](true, err)
}

func completeTogether(ctx context.Context, cs []keyCall) ([]keyOutcome, error) {
	p := dbsqlc.IdempotencyCompleteManyParams{LockTimeout: coalesce.LockTimeout}
	for _, c := range cs {
		p.Scopes, p.Keys, p.Holders = append(p.Scopes, c.scope), append(p.Keys, c.key), append(p.Holders, c.holder)
		p.Statuses, p.Headers, p.Bodies = append(p.Statuses, c.status), append(p.Headers, c.headers), append(p.Bodies, c.body)
	}
	rows, err := queries.IdempotencyCompleteMany(ctx, cs[0].pool, p)
	return coalesce.Rows(len(cs), rows, err, func(i int32) (int32, dbsqlc.PgcoordIdempotencyKey) { return i, dbsqlc.PgcoordIdempotencyKey{} })
}

func renewAlone(ctx context.Context, c keyCall) keyOutcome {
	var held bool
	err := c.pool.QueryRow(ctx, renewSQL, c.scope, c.key, c.holder, c.lease).Scan(&held)
	return coalesce.Done[dbsqlc.PgcoordIdempotencyKey](held, err)
}

func renewTogether(ctx context.Context, cs []keyCall) ([]keyOutcome, error) {
	p := dbsqlc.IdempotencyRenewManyParams{LockTimeout: coalesce.LockTimeout}
	for _, c := range cs {
		p.Scopes, p.Keys, p.Holders = append(p.Scopes, c.scope), append(p.Keys, c.key), append(p.Holders, c.holder)
		p.Leases = append(p.Leases, c.lease)
	}
	rows, err := queries.IdempotencyRenewMany(ctx, cs[0].pool, p)
	return coalesce.Rows(len(cs), rows, err, func(i int32) (int32, dbsqlc.PgcoordIdempotencyKey) { return i, dbsqlc.PgcoordIdempotencyKey{} })
}

func releaseAlone(ctx context.Context, c keyCall) keyOutcome {
	var released bool
	err := c.pool.QueryRow(ctx, releaseSQL, c.scope, c.key, c.holder).Scan(&released)
	return coalesce.Done[dbsqlc.PgcoordIdempotencyKey](released, err)
}

func releaseTogether(ctx context.Context, cs []keyCall) ([]keyOutcome, error) {
	p := dbsqlc.IdempotencyReleaseManyParams{LockTimeout: coalesce.LockTimeout}
	for _, c := range cs {
		p.Scopes, p.Keys, p.Holders = append(p.Scopes, c.scope), append(p.Keys, c.key), append(p.Holders, c.holder)
	}
	rows, err := queries.IdempotencyReleaseMany(ctx, cs[0].pool, p)
	return coalesce.Rows(len(cs), rows, err, func(i int32) (int32, dbsqlc.PgcoordIdempotencyKey) { return i, dbsqlc.PgcoordIdempotencyKey{} })
}
