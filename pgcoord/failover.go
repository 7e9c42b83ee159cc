package pgcoord

import (
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgconn"
)

// ErrReadOnly means the server refused a grant or a write because it cannot write: it is a
// standby in recovery (only the primary grants leases, permits and job runs, and takes
// fenced writes, messages, idempotency keys and dedupe claims), or the transaction is
// read-only (default_transaction_read_only, SET TRANSACTION READ ONLY). Connect to the
// primary, e.g. with target_session_attrs=read-write in the connection string. The server's
// *pgconn.PgError (SQLSTATE 25006) stays reachable with errors.As.
var ErrReadOnly = errors.New("pgcoord: the server is read-only (a standby, or a read-only transaction); grants and writes need the primary")

// TranslateError returns err wrapped with ErrReadOnly when it is the server's refusal to
// write (SQLSTATE 25006, read_only_sql_transaction: what a standby in recovery answers to a
// grant, a write or a LISTEN); any other error, and nil, it returns unchanged. The feature
// packages pass the driver errors of their grants and writes through it.
func TranslateError(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "25006" {
		return fmt.Errorf("%w: %w", ErrReadOnly, err)
	}
	return err
}

// CheckSyncCommit validates the synchronous_commit level a grant may ask for (the
// SyncCommit options of leases, semaphore and singleton): "" (the server's setting), "on",
// "remote_write" or "remote_apply". Lower levels are refused, because a grant must be
// durable. The error wraps ErrInvalidArgument.
func CheckSyncCommit(level string) error {
	switch level {
	case "", "on", "remote_write", "remote_apply":
		return nil
	}
	return fmt.Errorf("%w: synchronous_commit level %q for a grant: want \"\", \"on\", \"remote_write\" or \"remote_apply\"", ErrInvalidArgument, level)
}
