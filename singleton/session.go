package singleton

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/internal/base"
	"github.com/pgcoord/pgcoord/internal/dbsqlc"
	"github.com/pgcoord/pgcoord/pgcoord"
)

// DefaultCheckEvery is the default of SessionOpts.CheckEvery.
const DefaultCheckEvery = 5 * time.Second

// SessionOpts are the options of RunSession. A nil *SessionOpts means the defaults.
type SessionOpts struct {
	// CheckEvery is how often the lock's connection is checked while fn runs (a round trip
	// on it). When a check fails, the connection — and with it the lock — is presumed
	// lost and fn's context is cancelled with a cause wrapping ErrLockLost. A check that
	// gets no answer fails after CheckEvery or 5 seconds, whichever is longer. Default
	// DefaultCheckEvery (5s).
	CheckEvery time.Duration
	// AllowPooler skips the pooler check. Set it only when the connection goes through a
	// session-mode pooler (PgBouncer pool_mode = session, which gives each client one
	// server session for as long as it is connected, but sends its own cancel key, so the
	// check cannot tell it from a transaction-mode pooler). Behind a transaction-mode
	// pooler a session-level lock is meaningless: use RunOnce there.
	AllowPooler bool
}

// RunSession runs fn on one replica at a time, like RunOnce, but holds no transaction
// open while fn runs, so a long job does not hold back VACUUM. It takes a connection of
// pool for itself, tries the job's session-level advisory lock on it (pg_try_advisory_lock
// on the key of the job's current generation, as RunOnce: the two exclude each other, see
// the package documentation), runs fn(ctx) with no open transaction, then moves the job to
// a new generation, unlocks (pg_advisory_unlock) and returns the connection to the pool.
// fn must do its work through other connections (pool's, say): the lock's connection is
// busy with the lock.
//
// A replica that does not get the lock returns (false, nil) at once. The winner returns
// (true, fn's error) — or, if fn succeeded, (true, an error wrapping ErrLockLost) when the
// lock was lost while fn ran or was not held any more when fn returned, or (true, nil).
//
// While fn runs, a watchdog checks the lock's connection every SessionOpts.CheckEvery. If
// the connection died, the server has released the lock and another replica may be
// running the job: fn's context is cancelled with a cause wrapping ErrLockLost (see
// context.Cause), and RunSession returns an error wrapping ErrLockLost. fn notices only at
// its next look at its context; a job that must never overlap with itself needs fencing
// or idempotent writes anyway.
//
// Session-level locks need a direct connection. RunSession compares the backend process
// id the server reports (pg_backend_pid()) with the one the connection received when it
// was opened (BackendKeyData): behind PgBouncer they differ, because PgBouncer sends its
// own cancel key. On a mismatch it undoes its lock (in the same transaction, so it reaches
// the server session that took it) and returns (false, an error wrapping pgcoord.ErrPooler), unless
// SessionOpts.AllowPooler is set.
//
// It returns an error wrapping pgcoord.ErrInvalidName or pgcoord.ErrInvalidArgument,
// before any SQL runs, for a bad job name, a nil pool or fn, or a negative CheckEvery.
func RunSession(ctx context.Context, pool *pgxpool.Pool, job string, fn func(ctx context.Context) error, opts *SessionOpts) (ran bool, err error) {
	if err := validateFn(job, pool, fn == nil); err != nil {
		return false, err
	}
	var o SessionOpts
	if opts != nil {
		o = *opts
	}
	if o.CheckEvery == 0 {
		o.CheckEvery = DefaultCheckEvery
	}
	if o.CheckEvery < 0 {
		return false, check.Invalid("negative CheckEvery %v", o.CheckEvery)
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return false, fmt.Errorf("singleton: run session %q: %w", job, err)
	}
	s := &session{conn: conn, job: job}
	defer s.close()

	locked, err := s.lock(ctx, o.AllowPooler)
	if err != nil || !locked {
		return false, err
	}
	s.locked = true

	fnCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	w := &watchdog{s: s, every: o.CheckEvery, cancel: cancel, stop: make(chan struct{}), done: make(chan struct{})}
	go w.run()
	returned := false
	defer func() {
		if !returned { // fn panicked (or called runtime.Goexit): s.close closes the session
			w.halt()
		}
	}()
	fnErr := fn(fnCtx)
	returned = true
	w.halt()
	if w.lost != nil {
		return true, joinLost(w.lost, fnErr)
	}

	uctx, ucancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer ucancel()
	unlocked, err := queries.SessionUnlock(uctx, conn, s.unlockParams())
	if err != nil {
		// s.close closes the connection: the server releases the lock with the session.
		return true, firstErr(fnErr, fmt.Errorf("singleton: run session %q: unlock: %w", job, err))
	}
	s.locked = false
	if !unlocked {
		return true, firstErr(fnErr, fmt.Errorf("%w: %q was not held by this session any more when fn returned", ErrLockLost, job))
	}
	return true, fnErr
}

// session is RunSession's connection and what it holds.
type session struct {
	conn   *pgxpool.Conn
	job    string
	locked bool // the session may hold the lock: never return it to the pool as is
	// The generation of the job and the key this session locked (pgcoord_singleton_try).
	gen, key int64
}

func (s *session) unlockParams() dbsqlc.SessionUnlockParams {
	return dbsqlc.SessionUnlockParams{Job: s.job, Gen: s.gen, LockKey: s.key}
}

// lock tries the session-level lock inside a transaction, checking for a pooler. Behind a
// transaction-mode pooler every statement of one transaction reaches the same server
// session, so the unlock that undoes a lock taken through a pooler reaches the session
// that holds it. A session-level lock outlives the transaction it was taken in.
func (s *session) lock(ctx context.Context, allowPooler bool) (bool, error) {
	tx, err := s.conn.Begin(ctx)
	if err != nil {
		return false, fmt.Errorf("singleton: run session %q: begin: %w", s.job, err)
	}
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		defer cancel()
		_ = tx.Rollback(rctx) // a no-op after Commit
	}()
	s.locked = true // until proven otherwise
	row, err := queries.TrySessionLock(ctx, tx, s.job)
	if err != nil {
		return false, fmt.Errorf("singleton: run session %q: lock: %w", s.job, base.TranslateError(err))
	}
	s.gen, s.key = row.Gen, row.LockKey
	pooler := uint32(row.BackendPid) != s.conn.Conn().PgConn().PID()
	if pooler && !allowPooler {
		if row.Locked {
			unlocked, err := queries.SessionUnlock(ctx, tx, s.unlockParams())
			if err != nil || !unlocked {
				return false, errPooler("and undoing the lock failed: unlocked %v, %v", unlocked, err)
			}
		}
		if err := tx.Commit(ctx); err != nil {
			return false, errPooler("and undoing the lock failed: %v", err)
		}
		s.locked = false
		return false, errPooler("server backend pid %d, connection's %d", row.BackendPid, s.conn.Conn().PgConn().PID())
	}
	if err := tx.Commit(ctx); err != nil {
		return false, fmt.Errorf("singleton: run session %q: lock: %w", s.job, err)
	}
	s.locked = row.Locked
	return row.Locked, nil
}

// close returns the connection to the pool if it holds nothing, and otherwise closes it:
// the server releases a closed session's locks.
func (s *session) close() {
	if !s.locked {
		s.conn.Release()
		return
	}
	c := s.conn.Hijack()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = c.Close(ctx)
}

// watchdog checks the lock's connection while fn runs.
type watchdog struct {
	s      *session
	every  time.Duration
	cancel context.CancelCauseFunc
	stop   chan struct{}
	done   chan struct{}
	halted bool
	lost   error // set before done is closed
}

func (w *watchdog) run() {
	defer close(w.done)
	timeout := max(w.every, 5*time.Second)
	t := time.NewTicker(w.every)
	defer t.Stop()
	for {
		select {
		case <-w.stop:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		err := w.s.conn.Ping(ctx)
		cancel()
		if err != nil {
			w.lost = fmt.Errorf("%w: %q: its connection failed a check: %v", ErrLockLost, w.s.job, err)
			w.cancel(w.lost)
			return
		}
	}
}

// halt stops the watchdog and waits for it; then w.lost is safe to read.
func (w *watchdog) halt() {
	if w.halted {
		return
	}
	w.halted = true
	close(w.stop)
	<-w.done
}

// joinLost returns an error that wraps the loss and, if fn failed, fn's error.
func joinLost(lost, fnErr error) error {
	if fnErr == nil {
		return lost
	}
	return fmt.Errorf("%w (fn returned: %w)", lost, fnErr)
}

func firstErr(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// errPooler is RunSession's refusal behind a pooler; format and args say what it saw.
func errPooler(format string, args ...any) error {
	return fmt.Errorf("singleton: run session: %w; use RunOnce (transaction-level) behind a pooler (%s)",
		pgcoord.ErrPooler, fmt.Sprintf(format, args...))
}
