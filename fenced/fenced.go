package fenced

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgcoord/pgcoord/internal/dbsqlc"
	"github.com/pgcoord/pgcoord/leases"
	"github.com/pgcoord/pgcoord/pgcoord"
)

// ErrStale means a write carried a fence token lower than one the data has already seen: a
// newer holder wrote first. The caller's transaction must roll back.
var ErrStale = errors.New("fenced: stale fence token")

// Metrics counts the writes this process's calls refused. The database cannot keep this
// count: a refused write's transaction rolls back, taking anything it recorded with it.
// Read the fields with Load.
type Metrics struct {
	// Stale counts ErrStale returned by Check, Write and Exec (the guard trigger's
	// refusals included).
	Stale atomic.Int64
	// LeaseLost counts CheckLease calls that found the grant no longer current.
	LeaseLost atomic.Int64
}

// DefaultMetrics is where every call of this package counts its refusals.
var DefaultMetrics = &Metrics{}

// stale counts a refusal and returns ErrStale with the detail given.
func stale(format string, args ...any) error {
	DefaultMetrics.Stale.Add(1)
	return fmt.Errorf("%w: "+format, append([]any{ErrStale}, args...)...)
}

// GuardSQLState is the SQLSTATE the guard trigger raises for a lowering update. Calls of
// this package turn it into ErrStale; the *pgconn.PgError stays reachable with errors.As.
const GuardSQLState = "PGC01"

// Check records token for resource in the fence register, inside the caller's
// transaction, if it is not lower than the highest token seen for resource, and returns
// ErrStale otherwise. The register row stays locked until tx ends, so concurrent writers of
// one resource are ordered: a writer with a lower token that arrives while a higher one is
// in flight waits, then gets ErrStale. Call it before the writes it protects, and roll tx
// back on ErrStale. One round trip.
// On a standby it returns an error wrapping pgcoord.ErrReadOnly.
func Check(ctx context.Context, tx pgx.Tx, resource string, token int64) error {
	if err := pgcoord.ValidateName("resource", resource); err != nil {
		return err
	}
	if err := pgcoord.CheckDB(tx); err != nil {
		return err
	}
	_, err := queries.FenceCheck(ctx, tx, dbsqlc.FenceCheckParams{Resource: resource, FenceToken: token})
	if errors.Is(err, pgx.ErrNoRows) {
		return stale("%q token %d", resource, token)
	}
	if err != nil {
		return fmt.Errorf("fenced: check %q: %w", resource, pgcoord.TranslateError(err))
	}
	return nil
}

// Write is Check and one write in a single round trip: inside the caller's transaction it
// sends the fence check of resource and the statement sql together, and the statement runs
// only if token is not lower than the highest recorded for resource. It returns the
// statement's command tag, or ErrStale — in which case nothing was written and tx is
// aborted and must be rolled back. Ordering and locking are those of Check. Use it when
// the write does not need the check's answer first: it saves the round trip Check costs.
// On a standby it returns an error wrapping pgcoord.ErrReadOnly.
func Write(ctx context.Context, tx pgx.Tx, resource string, token int64, sql string, args ...any) (pgconn.CommandTag, error) {
	if err := pgcoord.ValidateName("resource", resource); err != nil {
		return pgconn.CommandTag{}, err
	}
	if err := pgcoord.CheckDB(tx); err != nil {
		return pgconn.CommandTag{}, err
	}
	var b pgx.Batch
	b.Queue(fenceAssertSQL, resource, token)
	b.Queue(sql, args...)
	br := tx.SendBatch(ctx, &b)
	_, err := br.Exec()
	if err != nil {
		br.Close()
		if IsStale(err) {
			return pgconn.CommandTag{}, stale("%q token %d", resource, token)
		}
		return pgconn.CommandTag{}, fmt.Errorf("fenced: check %q: %w", resource, pgcoord.TranslateError(err))
	}
	tag, err := br.Exec()
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return tag, translate(err)
	}
	return tag, nil
}

// fenceAssertSQL calls the SQL API's raising check; see pgcoord_fence_assert.
const fenceAssertSQL = `SELECT 1 FROM pgcoord_fence_assert($1, $2)`

// Exec runs a conditional write on the caller's own table — an UPDATE (or DELETE, or
// INSERT ... ON CONFLICT ... WHERE) whose WHERE clause compares the row's fence column
// with the caller's token, such as
//
//	UPDATE payments SET status = 'charged', fence_token = $2
//	 WHERE order_id = $1 AND fence_token <= $2
//
// — and turns "no row affected" into ErrStale. It returns the command tag otherwise. The
// statement must include the fence comparison: Exec cannot check that it does. A violation
// of the guard trigger (InstallGuard) is returned as ErrStale too.
// On a standby it returns an error wrapping pgcoord.ErrReadOnly.
func Exec(ctx context.Context, db pgcoord.DBTX, sql string, args ...any) (pgconn.CommandTag, error) {
	if err := pgcoord.CheckDB(db); err != nil {
		return pgconn.CommandTag{}, err
	}
	tag, err := db.Exec(ctx, sql, args...)
	if err != nil {
		return tag, translate(err)
	}
	if tag.RowsAffected() == 0 {
		return tag, stale("the conditional write matched no row")
	}
	return tag, nil
}

// translate maps the guard trigger's error to ErrStale and a read-only server's refusal to
// pgcoord.ErrReadOnly, keeping the driver error reachable.
func translate(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == GuardSQLState {
		return stale("%w", err)
	}
	return fmt.Errorf("fenced: %w", pgcoord.TranslateError(err))
}

// IsStale reports whether err is ErrStale or the guard trigger's violation, for errors
// that come from your own driver calls rather than from this package.
func IsStale(err error) bool {
	var pgErr *pgconn.PgError
	return errors.Is(err, ErrStale) || errors.As(err, &pgErr) && pgErr.Code == GuardSQLState
}

// CheckLease verifies, inside the caller's transaction, that the grant l is still current
// by the database clock (not released, expired, taken over or expired by an operator), and
// holds a share lock on it until tx ends, so that a takeover, a forced expiry or the
// lease's own release waits until then. Writes made in tx after a successful CheckLease
// therefore happen while l is held: mutual exclusion for data in the same database. It
// returns an error wrapping leases.ErrLost otherwise. One round trip.
// On a standby it returns an error wrapping pgcoord.ErrReadOnly.
func CheckLease(ctx context.Context, tx pgx.Tx, l leases.Lease) error {
	if err := pgcoord.ValidateName("lease", l.Name); err != nil {
		return err
	}
	if err := pgcoord.CheckDB(tx); err != nil {
		return err
	}
	_, err := queries.CheckLease(ctx, tx, dbsqlc.CheckLeaseParams{Name: l.Name, Holder: l.Holder, FenceToken: l.Token})
	if errors.Is(err, pgx.ErrNoRows) {
		DefaultMetrics.LeaseLost.Add(1)
		return fmt.Errorf("%w: %q token %d is not current", leases.ErrLost, l.Name, l.Token)
	}
	if err != nil {
		return fmt.Errorf("fenced: check lease %q: %w", l.Name, pgcoord.TranslateError(err))
	}
	return nil
}

// tableIdent matches a plain identifier, or a double-quoted one (which keeps its case);
// columnIdent a column's name as stored in the catalog.
var (
	tableIdent  = regexp.MustCompile(`^([A-Za-z_][A-Za-z0-9_$]{0,62}|"([^"\x00]|""){1,63}")$`)
	columnIdent = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_$]{0,62}$`)
)

// InstallGuard installs the guard trigger on table for its integer fence column: from then
// on the database refuses, with SQLSTATE GuardSQLState, any UPDATE that would lower the
// column or set it to NULL, whichever code path sends it. table is resolved as SQL would
// resolve it (optionally "schema.table"; unquoted names fold to lower case, through
// search_path; a double-quoted name keeps its case); column is the column's name as stored. It is idempotent. The trigger is
// named pgcoord_fence_guard_<column> (shortened with a hash when that exceeds Postgres's
// 63-byte limit). It does not catch an UPDATE that leaves the column as it is: writes that
// skip fencing altogether must still be prevented by code review. Needs PostgreSQL 14+.
// Bad names, a missing table or column, or a column that is not an integer return an error
// wrapping pgcoord.ErrInvalidArgument.
func InstallGuard(ctx context.Context, db pgcoord.DBTX, table, column string) error {
	tbl, trigger, err := resolveGuard(ctx, db, table, column)
	if err != nil {
		return err
	}
	var dataType *string
	err = db.QueryRow(ctx, `SELECT format_type(a.atttypid, a.atttypmod) FROM pg_attribute a
		WHERE a.attrelid = $1::regclass AND a.attname = $2 AND a.attnum > 0 AND NOT a.attisdropped`,
		tbl, column).Scan(&dataType)
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("%w: fenced: table %s has no column %q", pgcoord.ErrInvalidArgument, tbl, column)
	}
	if err != nil {
		return fmt.Errorf("fenced: install guard on %s: %w", tbl, err)
	}
	switch *dataType {
	case "bigint", "integer", "smallint":
	default:
		return fmt.Errorf("%w: fenced: column %s.%s is %s; a fence column must be bigint, integer or smallint", pgcoord.ErrInvalidArgument, tbl, column, *dataType)
	}
	_, err = db.Exec(ctx, fmt.Sprintf(`CREATE OR REPLACE TRIGGER %s BEFORE UPDATE ON %s
		FOR EACH ROW EXECUTE FUNCTION pgcoord_fence_guard(%s)`,
		pgx.Identifier{trigger}.Sanitize(), tbl, quoteLiteral(column)))
	if err != nil {
		return fmt.Errorf("fenced: install guard on %s: %w", tbl, pgcoord.TranslateError(err))
	}
	return nil
}

// RemoveGuard removes the guard trigger InstallGuard put on table for column. Removing a
// guard that is not there is not an error; naming a table that does not exist is (it
// wraps pgcoord.ErrInvalidArgument).
func RemoveGuard(ctx context.Context, db pgcoord.DBTX, table, column string) error {
	tbl, trigger, err := resolveGuard(ctx, db, table, column)
	if err != nil {
		return err
	}
	if _, err := db.Exec(ctx, fmt.Sprintf("DROP TRIGGER IF EXISTS %s ON %s", pgx.Identifier{trigger}.Sanitize(), tbl)); err != nil {
		return fmt.Errorf("fenced: remove guard from %s: %w", tbl, pgcoord.TranslateError(err))
	}
	return nil
}

// resolveGuard validates table and column, resolves table in the database and returns its
// quoted, schema-qualified name and the guard trigger's name.
func resolveGuard(ctx context.Context, db pgcoord.DBTX, table, column string) (string, string, error) {
	parts := strings.Split(table, ".")
	if len(parts) > 2 {
		return "", "", fmt.Errorf("%w: fenced: %q is not a table name (letters, digits, _; optionally schema.table)", pgcoord.ErrInvalidArgument, table)
	}
	for _, p := range parts {
		if !tableIdent.MatchString(p) {
			return "", "", fmt.Errorf("%w: fenced: %q is not a table name (letters, digits, _; optionally schema.table)", pgcoord.ErrInvalidArgument, table)
		}
	}
	if !columnIdent.MatchString(column) {
		return "", "", fmt.Errorf("%w: fenced: %q is not a column name", pgcoord.ErrInvalidArgument, column)
	}
	if err := pgcoord.CheckDB(db); err != nil {
		return "", "", err
	}
	var resolved *string
	err := db.QueryRow(ctx, `SELECT c.oid::regclass::text FROM pg_class c WHERE c.oid = to_regclass($1) AND c.relkind IN ('r', 'p')`, table).Scan(&resolved)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", "", fmt.Errorf("%w: fenced: no table %s", pgcoord.ErrInvalidArgument, table)
	}
	if err != nil {
		return "", "", fmt.Errorf("fenced: resolve table %s: %w", table, err)
	}
	return *resolved, guardTriggerName(column), nil
}

// guardTriggerName is pgcoord_fence_guard_<column>, or, when that is longer than an
// identifier may be, a prefix of it with a hash of the column, so two long column names
// never share a trigger.
func guardTriggerName(column string) string {
	name := "pgcoord_fence_guard_" + column
	if len(name) <= 63 {
		return name
	}
	sum := sha256.Sum256([]byte(column))
	return name[:50] + "_" + hex.EncodeToString(sum[:6])
}

func quoteLiteral(s string) string { return "'" + s + "'" } // s is a validated identifier

var queries dbsqlc.Queries
