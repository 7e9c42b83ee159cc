package pgcoord_test

import (
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/pgcoord"
)

// A grant the server refuses because it cannot write is translated to ErrReadOnly, with
// the server's error still reachable; other errors pass through unchanged. (A standby
// refuses the same way: see integration_test/failover_test.go.)
func TestTranslateErrorReadOnly(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pgtest.Pool(t)
	tx, err := pool.BeginTx(ctx, pgx.TxOptions{AccessMode: pgx.ReadOnly})
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	_, err = tx.Exec(ctx, `SELECT * FROM pgcoord_lease_acquire('report', 'worker', '1 minute')`)
	got := pgcoord.TranslateError(err)
	var pgErr *pgconn.PgError
	if !errors.Is(got, pgcoord.ErrReadOnly) || !errors.As(got, &pgErr) || pgErr.Code != "25006" {
		t.Fatalf("a grant in a read-only transaction: TranslateError(%v) = %v, want ErrReadOnly wrapping SQLSTATE 25006", err, got)
	}

	_, other := pool.Exec(ctx, `SELECT * FROM pgcoord_lease_acquire('report', 'worker', '-1 minute')`)
	if other == nil || pgcoord.TranslateError(other) != other {
		t.Fatalf("TranslateError changed an unrelated error: %v -> %v", other, pgcoord.TranslateError(other))
	}
	if pgcoord.TranslateError(nil) != nil {
		t.Fatal("TranslateError(nil) is not nil")
	}
}

func TestCheckSyncCommit(t *testing.T) {
	t.Parallel()
	for _, ok := range []string{"", "on", "remote_write", "remote_apply"} {
		if err := pgcoord.CheckSyncCommit(ok); err != nil {
			t.Errorf("CheckSyncCommit(%q) = %v, want nil", ok, err)
		}
	}
	// Levels that would make a grant less durable than a local flush, and typos.
	for _, bad := range []string{"off", "local", "ON", "remote", "true"} {
		if err := pgcoord.CheckSyncCommit(bad); !errors.Is(err, pgcoord.ErrInvalidArgument) {
			t.Errorf("CheckSyncCommit(%q) = %v, want ErrInvalidArgument", bad, err)
		}
	}
}
