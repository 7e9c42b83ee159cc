package idempotency

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/internal/base"
	"github.com/pgcoord/pgcoord/internal/txhandle"
)

// Response is a stored response: what a replay sends back, byte for byte.
type Response struct {
	Status int
	// Header holds the stored headers only (the middleware's Config.StoreHeaders).
	Header http.Header
	Body   []byte
}

// Attempt is the outcome of Begin: a stored response to replay (Replay is not nil), or an
// attempt that holds the key until Complete or Close. An Attempt is not safe for concurrent
// use.
type Attempt struct {
	scope, key, holder string
	replay             *Response
	attempts           int
	point              string
	data               []byte
	conn               *pgxpool.Conn // nil once finished
	tx                 pgx.Tx        // Atomic only
	maxBody            int
}

// Replay returns the stored response when Begin found the key completed, or nil when the
// attempt holds the key.
func (a *Attempt) Replay() *Response { return a.replay }

// Scope returns the attempt's scope.
func (a *Attempt) Scope() string { return a.scope }

// Key returns the attempt's idempotency key.
func (a *Attempt) Key() string { return a.key }

// Attempts returns how many attempts have held the key, this one included: 1 for the
// first, more when this one recovers the key from attempts that died after committing a
// recovery point. 0 for a replay.
func (a *Attempt) Attempts() int { return a.attempts }

// RecoveryPoint returns the last recovery point recorded with Checkpoint, by this attempt
// or by a dead one it recovers, and its data; "" when none was recorded.
func (a *Attempt) RecoveryPoint() (point string, data []byte) { return a.point, a.data }

// DerivedKey returns the key to pass to another system's own idempotency key for step of
// this attempt: DerivedKey(a.Scope(), a.Key(), step). Every attempt of the key, recovered
// ones included, derives the same one.
func (a *Attempt) DerivedKey(step string) string { return DerivedKey(a.scope, a.key, step) }

// Tx returns the attempt's transaction when Begin was called with Atomic, else nil. Write
// the work the key protects with it: it commits together with the stored response in
// Complete, or rolls back in Close. Commit and Rollback of the returned Tx return an error
// and do nothing (the attempt ends it); Begin on it makes a savepoint as usual. Checkpoint
// commits what was written so far and continues in a new transaction behind the same Tx.
func (a *Attempt) Tx() pgx.Tx {
	if a.tx == nil || a.conn == nil {
		return nil
	}
	return txhandle.Owned(a.tx, errTxOwned)
}

// errTxOwned is what Commit and Rollback of the attempt's Tx return.
var errTxOwned = errors.New("idempotency: the attempt's transaction is committed by Complete and rolled back by Close")

// completeSQL and the others below are sent in one round trip with COMMIT (and BEGIN).
const (
	completeSQL   = `SELECT 1 FROM pgcoord_idempotency_complete($1::text, $2::text, $3::text, $4::int, $5::jsonb, $6::bytea)`
	checkpointSQL = `SELECT 1 FROM pgcoord_idempotency_checkpoint($1::text, $2::text, $3::text, $4::text, $5::bytea)`
	relockSQL     = `SELECT pgcoord_idempotency_relock($1::text, $2::text, $3::text)`
)

// Complete stores resp as the key's response and commits the attempt's transaction — with
// the writes made through Tx, in Atomic mode — in one round trip. Afterwards every repeat
// with the same fingerprint replays resp until the key expires. Only resp.Header is
// stored.
//
// What the store cannot keep is refused before any SQL runs, and the attempt is rolled
// back: nothing is stored, and the next attempt executes. A resp.Status outside 100..999
// (net/http's range) or a header name or value with a NUL byte returns an error wrapping
// pgcoord.ErrInvalidArgument; a body over BeginOpts.MaxResponseBytes returns ErrTooLarge;
// headers over MaxStoredHeaderBytes return an error wrapping both. A failed store returns
// an error (ErrLost if the key was taken over), also with the transaction rolled back.
func (a *Attempt) Complete(ctx context.Context, resp Response) error {
	if a.conn == nil {
		return check.Invalid("Complete of an attempt that does not hold its key")
	}
	if resp.Status < 100 || resp.Status > 999 {
		a.Close(ctx)
		return check.Invalid("status %d is not an HTTP status (100 to 999)", resp.Status)
	}
	if len(resp.Body) > a.maxBody {
		a.Close(ctx)
		return fmt.Errorf("%w: %d bytes, more than the limit of %d", ErrTooLarge, len(resp.Body), a.maxBody)
	}
	header := resp.Header
	if header == nil {
		header = http.Header{}
	}
	if err := checkHeaders(header); err != nil {
		a.Close(ctx)
		return err
	}
	headers, err := json.Marshal(header)
	if err != nil {
		a.Close(ctx)
		return fmt.Errorf("idempotency: encode headers: %w", err)
	}
	body := resp.Body
	if body == nil {
		body = []byte{}
	}
	// json.RawMessage, not []byte: in the exec and simple_protocol query modes pgx would send
	// []byte as bytea, which the server refuses as jsonb.
	err = a.commit(ctx, completeSQL, []any{a.scope, a.key, a.holder, resp.Status, json.RawMessage(headers), body}, false)
	if err != nil {
		return fmt.Errorf("idempotency: complete %s/%s: %w", a.scope, a.key, base.TranslateError(err))
	}
	return nil
}

// Checkpoint records a recovery point — a name, and data the work needs to resume from it —
// and commits the attempt's transaction (with the writes made through Tx so far), then
// goes on holding the key in a new transaction, in one round trip. If this process dies
// later, the attempt that recovers the key sees point and data in RecoveryPoint, and the
// phases before it committed. It returns ErrLost if another attempt took the key over in
// the instant between the two transactions (that attempt resumes from point): stop the
// work. An error ends the attempt (Close is then a no-op), except for bad input: a point
// that is not a valid name (1 to pgcoord.MaxNameLen bytes of UTF-8 without NUL; an error
// wrapping both pgcoord.ErrInvalidArgument and pgcoord.ErrInvalidName) or data over
// MaxRecoveryDataBytes (wrapping pgcoord.ErrInvalidArgument) is refused before any SQL
// runs, and the attempt goes on holding its key, its transaction untouched.
func (a *Attempt) Checkpoint(ctx context.Context, point string, data []byte) error {
	if a.conn == nil {
		return check.Invalid("Checkpoint of an attempt that does not hold its key")
	}
	if err := check.Name("recovery point", point); err != nil {
		return check.Invalid("checkpoint: %w", err)
	}
	if len(data) > MaxRecoveryDataBytes {
		return check.Invalid("checkpoint %q: %d bytes of recovery data, more than the maximum of %d", point, len(data), MaxRecoveryDataBytes)
	}
	if err := a.commit(ctx, checkpointSQL, []any{a.scope, a.key, a.holder, point, data}, true); err != nil {
		return fmt.Errorf("idempotency: checkpoint %s/%s at %q: %w", a.scope, a.key, point, base.TranslateError(err))
	}
	a.point, a.data = point, data
	return nil
}

// commit sends sql then COMMIT in one round trip and, with again, BEGIN and the relock
// too. Unless it goes on holding the key, the attempt is over afterwards.
func (a *Attempt) commit(ctx context.Context, sql string, args []any, again bool) (err error) {
	b := &pgx.Batch{}
	b.Queue(sql, args...)
	b.Queue("COMMIT")
	if again {
		b.Queue("BEGIN")
		b.Queue(relockSQL, a.scope, a.key, a.holder)
	}
	br := a.conn.SendBatch(ctx, b)
	_, err = br.Exec()
	tag, cerr := br.Exec()
	err = errors.Join(err, cerr)
	if err == nil && tag.String() != "COMMIT" {
		err = ErrLost // the transaction had failed: COMMIT rolled it back
	}
	var held bool
	if err == nil && again {
		if _, err = br.Exec(); err == nil {
			err = br.QueryRow().Scan(&held)
		}
		if err == nil && !held {
			err = ErrLost
		}
	}
	err = errors.Join(err, br.Close())
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "55000" {
		err = fmt.Errorf("%w: %w", ErrLost, err)
	}
	if err != nil || !again {
		a.finish(ctx, err == nil)
	}
	return err
}

// Close gives the key up if the attempt still holds it: its transaction rolls back (with
// the writes made through Tx), so the next attempt executes — from the last committed
// recovery point, if any. It is a no-op after Complete, after an error that ended the
// attempt, and for a replay; always defer it.
func (a *Attempt) Close(ctx context.Context) {
	a.finish(ctx, false)
}

// finish returns the attempt's connection to the pool, rolled back unless committed.
func (a *Attempt) finish(ctx context.Context, committed bool) {
	if a.conn == nil {
		return
	}
	conn := a.conn
	a.conn = nil
	if !committed && conn.Conn().PgConn().TxStatus() != 'I' {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_, _ = conn.Exec(rctx, "ROLLBACK") // on failure the pool destroys the connection
	}
	conn.Release()
}
