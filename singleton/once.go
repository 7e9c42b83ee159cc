package singleton

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/internal/base"
	"github.com/pgcoord/pgcoord/internal/txhandle"
)

// check makes this package's argument errors ("singleton: cause").
var check = base.Check("singleton")

// LockName returns "singleton:" + job, the name whose pgcoord_lock_key RunOnce and
// RunSession locked for job before version 00010 of the schema.
//
// Deprecated: RunOnce and RunSession no longer lock pgcoord_lock_key(LockName(job)), a key
// any login could compute and hold: they lock a key derived from a per-install secret and
// the job's generation, which moves on when a key is squatted (see the package
// documentation).
// Plain SQL callers exclude them with pgcoord_singleton_try instead.
func LockName(job string) string { return "singleton:" + job }

// cleanupTimeout bounds the statements that clean up after fn (rollback, unlock), which
// run even when the caller's context has ended.
const cleanupTimeout = 10 * time.Second

func validateFn(job string, pool *pgxpool.Pool, fnNil bool) error {
	if err := check.Name("job", job); err != nil {
		return err
	}
	if pool == nil {
		return check.Invalid("nil pool")
	}
	if fnNil {
		return check.Invalid("nil function")
	}
	return nil
}

// RunOnce runs fn on one replica at a time: it begins a transaction, tries the job's
// transaction-level advisory lock (pg_try_advisory_xact_lock on the key of the job's
// current generation, see the package documentation), and only if it got the lock runs
// fn(ctx, tx) and commits. The lock is released at COMMIT or ROLLBACK, or by the
// server when the connection dies: there is no TTL to guess.
//
// A replica that does not get the lock rolls back and returns (false, nil) at once,
// without waiting. The winner returns (true, nil) after committing; if fn returns an
// error, the transaction (and every write fn made in it) is rolled back and RunOnce returns
// (true, fn's error); a failed commit returns (true, an error wrapping the driver's).
//
// fn's writes through tx commit atomically with the end of the lock; tx's own Commit and
// Rollback do nothing and return an error (RunOnce ends the transaction). On a connection
// of pool that has run RunOnce before, BEGIN and the lock take one round trip. RunOnce
// works behind a transaction-mode pooler (PgBouncer): it keeps no state in the session. The
// transaction stays open while fn runs, which holds back VACUUM on a busy database: for a
// job that runs for minutes, use RunSession or RunTick. RunOnce only excludes replicas
// running at the same moment; it does not remember that the job ran (see RunTick), and a
// job's unit of work must still be idempotent (see the package documentation).
//
// It returns an error wrapping pgcoord.ErrInvalidName or pgcoord.ErrInvalidArgument,
// before any SQL runs, for a bad job name, a nil pool or a nil fn.
func RunOnce(ctx context.Context, pool *pgxpool.Pool, job string, fn func(ctx context.Context, tx pgx.Tx) error) (ran bool, err error) {
	if err := validateFn(job, pool, fn == nil); err != nil {
		return false, err
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return false, fmt.Errorf("singleton: run once %q: begin: %w", job, err)
	}
	defer conn.Release()
	done := false
	defer func() {
		if !done && conn.Conn().PgConn().TxStatus() != 'I' {
			// Also on a panic in fn: the connection goes back to the pool clean, or is
			// closed by the pool if the rollback fails; either way the lock is released.
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
			defer cancel()
			_, _ = conn.Exec(rctx, "ROLLBACK")
		}
	}()
	b := &pgx.Batch{}
	b.Queue(tryLockSQL, job)
	tx, br, err := txhandle.Begin(ctx, conn.Conn(), b)
	if err != nil {
		return false, fmt.Errorf("singleton: run once %q: begin: %w", job, err)
	}
	var locked bool
	err = br.QueryRow().Scan(&locked)
	if err = errors.Join(err, br.Close()); err != nil {
		return false, fmt.Errorf("singleton: run once %q: lock: %w", job, base.TranslateError(err))
	}
	if !locked {
		return false, nil
	}
	if err := fn(ctx, txhandle.Owned(tx, errTxOwned)); err != nil {
		return true, err
	}
	done = true
	tag, err := conn.Exec(ctx, "COMMIT")
	if err == nil && tag.String() != "COMMIT" { // the transaction had failed: COMMIT rolled it back
		err = pgx.ErrTxCommitRollback
	}
	if err != nil {
		return true, fmt.Errorf("singleton: run once %q: commit: %w", job, err)
	}
	return true, nil
}

// tryLockSQL tries the job's transaction-level lock (pgcoord_singleton_try, which also
// moves the job to its next generation in this transaction when it gets the lock). It is
// sent in one round trip with BEGIN (so not through sqlc). Advisory locks work on a standby
// too, but lock nothing the primary's sessions see: it refuses there (SQLSTATE 25006), like
// every grant.
const tryLockSQL = `SELECT t.locked FROM pgcoord_singleton_try($1::text, false) t`

// errTxOwned is what Commit and Rollback of RunOnce's tx return.
var errTxOwned = errors.New("singleton: RunOnce commits fn's transaction, or rolls it back when fn returns an error")
