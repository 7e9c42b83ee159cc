package dedupe_test

import (
	"errors"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/dedupe"
	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/pgcoord"
)

// The mission's cron example: the smallest unit of work of the weekly email job.
const (
	plainInsert      = `INSERT INTO email_sends (user_id, campaign_id) VALUES ($1, $2)`
	onConflictInsert = plainInsert + ` ON CONFLICT DO NOTHING`
)

func newEmailSends(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	exec(t, pool, `CREATE TABLE email_sends (
		user_id     bigint NOT NULL,
		campaign_id bigint NOT NULL,
		sent_at     timestamptz NOT NULL DEFAULT now(),
		UNIQUE (user_id, campaign_id))`)
}

// Autocommit: both forms say true once, then false, with no error.
func TestInsertOnceAutocommit(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pgtest.Pool(t)
	newEmailSends(t, pool)
	for _, sql := range []string{plainInsert, onConflictInsert} {
		user := int64(len(sql)) // a row per form
		for i, want := range []bool{true, false, false} {
			got, err := dedupe.InsertOnce(ctx, pool, sql, user, 7)
			if err != nil || got != want {
				t.Fatalf("%s, attempt %d: InsertOnce = %v, %v; want %v", sql, i, got, err, want)
			}
		}
	}
	if n := queryInt64(t, pool, `SELECT count(*) FROM email_sends`); n != 2 {
		t.Fatalf("%d rows, want one per form", n)
	}
}

// Inside a transaction, ON CONFLICT DO NOTHING says false and leaves the transaction
// usable; a plain INSERT's unique violation aborts it, and InsertOnce says so with
// ErrTxAborted instead of a false that would let the caller carry on.
func TestInsertOnceInTransaction(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pgtest.Pool(t)
	newEmailSends(t, pool)

	tx := begin(t, pool, pgx.TxOptions{})
	if ok, err := dedupe.InsertOnce(ctx, tx, onConflictInsert, 1, 7); err != nil || !ok {
		t.Fatalf("first insert = %v, %v", ok, err)
	}
	if ok, err := dedupe.InsertOnce(ctx, tx, onConflictInsert, 1, 7); err != nil || ok {
		t.Fatalf("second insert with ON CONFLICT DO NOTHING = %v, %v; want false", ok, err)
	}
	exec(t, tx, `SELECT 1`) // still usable
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}

	tx = begin(t, pool, pgx.TxOptions{})
	ok, err := dedupe.InsertOnce(ctx, tx, plainInsert, 1, 7)
	if ok || !errors.Is(err, dedupe.ErrTxAborted) || !dedupe.IsUniqueViolation(err) || sqlState(err) != dedupe.UniqueViolation {
		t.Fatalf("plain INSERT of an existing row in a tx = %v, %v; want ErrTxAborted wrapping the unique violation", ok, err)
	}
	if _, err := tx.Exec(ctx, `SELECT 1`); sqlState(err) != "25P02" {
		t.Fatalf("the transaction is not aborted after the violation: %v", err)
	}
	_ = tx.Rollback(ctx)

	// The same on a pooled connection in a transaction opened with plain SQL.
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	exec(t, conn, `BEGIN`)
	ok, err = dedupe.InsertOnce(ctx, conn, plainInsert, 1, 7)
	if ok || !errors.Is(err, dedupe.ErrTxAborted) {
		t.Fatalf("plain INSERT in a BEGIN block on a pooled connection = %v, %v; want ErrTxAborted", ok, err)
	}
	exec(t, conn, `ROLLBACK`)
	// And the same connection outside a transaction: harmless, false.
	if ok, err := dedupe.InsertOnce(ctx, conn, plainInsert, 1, 7); err != nil || ok {
		t.Fatalf("plain INSERT on an idle connection = %v, %v; want false", ok, err)
	}
	// A *pgx.Conn too.
	if ok, err = dedupe.InsertOnce(ctx, conn.Conn(), plainInsert, 1, 7); err != nil || ok {
		t.Fatalf("plain INSERT on an idle *pgx.Conn = %v, %v; want false", ok, err)
	}
	exec(t, conn, `BEGIN`)
	if ok, err = dedupe.InsertOnce(ctx, conn.Conn(), plainInsert, 1, 7); ok || !errors.Is(err, dedupe.ErrTxAborted) {
		t.Fatalf("plain INSERT in a BEGIN block on a *pgx.Conn = %v, %v; want ErrTxAborted", ok, err)
	}
	exec(t, conn, `ROLLBACK`)
}

// Many workers insert the same row at once, in both forms: exactly one inserts it.
func TestInsertOnceConcurrent(t *testing.T) {
	t.Parallel()
	const n = 10
	ctx := t.Context()
	pool := pgtest.PoolMax(t, n+1)
	newEmailSends(t, pool)
	for campaign, sql := range []string{plainInsert, onConflictInsert} {
		var (
			wg       sync.WaitGroup
			mu       sync.Mutex
			inserted int
			errs     []error
		)
		start := make(chan struct{})
		for range n {
			wg.Go(func() {
				<-start
				ok, err := dedupe.InsertOnce(ctx, pool, sql, 99, campaign)
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					errs = append(errs, err)
				}
				if ok {
					inserted++
				}
			})
		}
		close(start)
		wg.Wait()
		if len(errs) > 0 || inserted != 1 {
			t.Fatalf("%s: %d of %d concurrent inserts said inserted (errors %v); want exactly 1", sql, inserted, n, errs)
		}
	}
}

func TestInsertOnceOtherErrors(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pgtest.Pool(t)
	newEmailSends(t, pool)
	if _, err := dedupe.InsertOnce(ctx, nil, plainInsert, 1, 2); !errors.Is(err, pgcoord.ErrInvalidArgument) {
		t.Errorf("nil db: %v, want ErrInvalidArgument", err)
	}
	if _, err := dedupe.InsertOnce(ctx, noSQL{}, ""); !errors.Is(err, pgcoord.ErrInvalidArgument) {
		t.Errorf("empty SQL: %v, want ErrInvalidArgument", err)
	}
	// A statement that is not an INSERT is refused (after it ran: it cannot be known before).
	if _, err := dedupe.InsertOnce(ctx, pool, `UPDATE email_sends SET sent_at = now()`); !errors.Is(err, pgcoord.ErrInvalidArgument) {
		t.Errorf("UPDATE: %v, want ErrInvalidArgument", err)
	}
	// Other violations are errors, not "already done".
	ok, err := dedupe.InsertOnce(ctx, pool, plainInsert, nil, 2)
	if ok || err == nil || dedupe.IsUniqueViolation(err) || sqlState(err) != "23502" {
		t.Errorf("NOT NULL violation = %v, %v; want the server's error 23502", ok, err)
	}
	if dedupe.IsUniqueViolation(nil) || dedupe.IsUniqueViolation(errors.New("23505")) {
		t.Error("IsUniqueViolation is true for something that is not a PgError 23505")
	}
}
