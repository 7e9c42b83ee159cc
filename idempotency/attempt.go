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
	"github.com/pgcoord/pgcoord/internal/dbarg"
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
	maxBody            int
	pool               *pgxpool.Pool
	lease              time.Duration
	held               bool          // the attempt holds the key's lease
	stopHeartbeat      func()        // stops the lease's renewals; nil when none run
	conn               *pgxpool.Conn // Atomic only, nil once finished
	tx                 pgx.Tx        // Atomic only
	slot               func()        // Atomic only: gives the pool's Atomic slot back
}

// Replay returns the stored response when Begin found the key completed, or nil when the
// attempt holds the key.
func (a *Attempt) Replay() *Response { return a.replay }

// Scope returns the attempt's scope.
func (a *Attempt) Scope() string { return a.scope }

// Key returns the attempt's idempotency key.
func (a *Attempt) Key() string { return a.key }

// Attempts returns how many attempts have held the key, this one included: 1 for the
// first, more when this one takes the key over from attempts that died (or lost their
// lease) before completing it, or gave it up after a recovery point. 0 for a replay.
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

// The statements of a holding attempt. An Atomic attempt sends complete and checkpoint in
// one round trip with COMMIT (and BEGIN), release after its ROLLBACK; a non-Atomic one
// sends each alone, on any connection of the pool.
const (
	completeSQL   = `SELECT 1 FROM pgcoord_idempotency_complete($1::text, $2::text, $3::text, $4::int, $5::jsonb, $6::bytea)`
	checkpointSQL = `SELECT 1 FROM pgcoord_idempotency_checkpoint($1::text, $2::text, $3::text, $4::text, $5::bytea)`
	renewSQL      = `SELECT pgcoord_idempotency_renew($1::text, $2::text, $3::text, $4::interval)`
	releaseSQL    = `SELECT pgcoord_idempotency_release($1::text, $2::text, $3::text)`
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
	if !a.held {
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
	if a.conn == nil && len(body) <= maxBatchBody {
		r := coalesced(ctx, completions, keyCall{pool: a.pool, scope: a.scope, key: a.key, holder: a.holder,
			status: int32(resp.Status), headers: headers, body: body})
		err = a.stored(ctx, r.Err, false)
	} else {
		err = a.commit(ctx, completeSQL, []any{a.scope, a.key, a.holder, resp.Status, json.RawMessage(headers), body}, false)
	}
	if err != nil {
		return fmt.Errorf("idempotency: complete %s/%s: %w", a.scope, a.key, base.TranslateError(err))
	}
	return nil
}

// Checkpoint records a recovery point — a name, and data the work needs to resume from it —
// in one round trip: in Atomic mode it commits the attempt's transaction (with the writes
// made through Tx so far) and goes on in a new one. If this process dies later, the
// attempt that recovers the key sees point and data in RecoveryPoint, and (in Atomic mode)
// the phases before it committed. It returns ErrLost if another attempt took the key over
// (this attempt's lease had lapsed: it could not renew it for a whole Lease): stop the
// work. An error ends the attempt (Close is then a no-op), except for bad input: a point
// that is not a valid name (1 to pgcoord.MaxNameLen bytes of UTF-8 without NUL; an error
// wrapping both pgcoord.ErrInvalidArgument and pgcoord.ErrInvalidName) or data over
// MaxRecoveryDataBytes (wrapping pgcoord.ErrInvalidArgument) is refused before any SQL
// runs, and the attempt goes on holding its key, its transaction untouched.
func (a *Attempt) Checkpoint(ctx context.Context, point string, data []byte) error {
	if !a.held {
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

// commit stores sql's change: on a non-Atomic attempt alone; on an Atomic one with COMMIT
// in one round trip and, with again, BEGIN too. Unless it goes on holding the key, the
// attempt is over afterwards.
func (a *Attempt) commit(ctx context.Context, sql string, args []any, again bool) (err error) {
	if a.conn == nil {
		_, err = a.pool.Exec(ctx, sql, args...)
	} else {
		b := &pgx.Batch{}
		b.Queue(sql, args...)
		b.Queue("COMMIT")
		if again {
			b.Queue("BEGIN")
		}
		br := a.conn.SendBatch(ctx, b)
		_, err = br.Exec()
		tag, cerr := br.Exec()
		err = errors.Join(err, cerr)
		if err == nil && tag.String() != "COMMIT" {
			err = ErrLost // the transaction had failed: COMMIT rolled it back
		}
		if err == nil && again {
			_, err = br.Exec()
		}
		err = errors.Join(err, br.Close())
	}
	return a.stored(ctx, err, again)
}

// stored ends the attempt after a stored change that returned err, unless it goes on
// holding the key (again, and no error); an error saying the attempt no longer holds its
// key wraps ErrLost.
func (a *Attempt) stored(ctx context.Context, err error, again bool) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "55000" {
		err = fmt.Errorf("%w: %w", ErrLost, err)
	}
	if err != nil || !again {
		a.finish(ctx, err == nil)
	}
	return err
}

// Close gives the key up if the attempt still holds it, so the next attempt executes at
// once — from the last committed recovery point, if any (pgcoord_idempotency_release). An
// Atomic attempt's transaction rolls back, with the writes made through Tx. It is a no-op
// after Complete, after an error that ended the attempt, and for a replay; always defer
// it. If the release cannot be sent (the database is unreachable), the key is taken over
// when its lease lapses.
func (a *Attempt) Close(ctx context.Context) {
	a.finish(ctx, false)
}

// finish ends the attempt: it stops the lease's renewals, releases the key unless the
// attempt completed it (or never held it), and gives back an Atomic attempt's connection,
// rolled back unless committed, and its slot.
func (a *Attempt) finish(ctx context.Context, committed bool) {
	if a.stopHeartbeat != nil {
		a.stopHeartbeat()
		a.stopHeartbeat = nil
	}
	release := a.held && !committed
	a.held = false
	slot := a.slot
	a.slot = nil
	if slot == nil {
		slot = func() {}
	}
	ctx = context.WithoutCancel(ctx)
	if a.conn != nil {
		conn := a.conn
		a.conn = nil
		b := &pgx.Batch{}
		if conn.Conn().PgConn().TxStatus() != 'I' {
			b.Queue("ROLLBACK")
		}
		if release {
			b.Queue(releaseSQL, a.scope, a.key, a.holder)
		}
		done := func() {
			if b.Len() > 0 {
				rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				defer cancel()
				_ = conn.SendBatch(rctx, b).Close() // on failure the pool destroys the connection
			}
			conn.Release()
			slot()
		}
		if !release && b.Len() > 0 {
			// Nothing of the key's to give back (a replay, a refusal): the handler's unused
			// transaction is rolled back after the caller goes on, so a replay in Atomic mode
			// costs it one round trip.
			go done()
			return
		}
		done()
		return
	}
	if release {
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		coalesced(rctx, releases, keyCall{pool: a.pool, scope: a.scope, key: a.key, holder: a.holder})
	}
	slot()
}

// startHeartbeat renews the attempt's lease every third of it until finish stops it, each
// time on the pool (with the concurrent renewals of other attempts). It stops by itself once
// the attempt has lost its key (then Complete and Checkpoint return ErrLost); a failed
// renewal is tried again at the next tick.
func (a *Attempt) startHeartbeat() {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	a.stopHeartbeat = func() { cancel(); <-done }
	every := a.lease / 3
	c := keyCall{pool: a.pool, scope: a.scope, key: a.key, holder: a.holder, lease: dbarg.Interval(a.lease)}
	go func() {
		defer close(done)
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			rctx, rcancel := context.WithTimeout(ctx, every)
			r := coalesced(rctx, renewals, c)
			rcancel()
			if r.Err == nil && !r.OK {
				return
			}
		}
	}()
}
