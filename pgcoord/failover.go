package pgcoord

import "github.com/pgcoord/pgcoord/internal/base"

// ErrReadOnly means the server refused a grant or a write because it cannot write: it is a
// standby in recovery (only the primary grants leases, permits and job runs, and takes
// fenced writes, messages, idempotency keys and dedupe claims), or the transaction is
// read-only (default_transaction_read_only, SET TRANSACTION READ ONLY). Connect to the
// primary, e.g. with target_session_attrs=read-write in the connection string. The server's
// *pgconn.PgError (SQLSTATE 25006) stays reachable with errors.As.
var ErrReadOnly = base.ErrReadOnly
