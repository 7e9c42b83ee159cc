package fenced

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgcoord/pgcoord/internal/base"
	"github.com/pgcoord/pgcoord/internal/dbsqlc"
	"github.com/pgcoord/pgcoord/leases"
	"github.com/pgcoord/pgcoord/pgcoord"
)

// check makes this package's argument errors ("fenced: cause").
var check = base.Check("fenced")

// ErrStale means a write carried a fence token lower than one the data has already seen: a
// newer holder wrote first. The caller's transaction must roll back.
var ErrStale = errors.New("fenced: stale fence token")

// GuardSQLState is the SQLSTATE the guard trigger and pgcoord_fence_assert raise for a
// stale write. Calls of this package turn it into ErrStale; the *pgconn.PgError stays
// reachable with errors.As.
const GuardSQLState = "PGC01"

// Check records token for resource in the fence register, inside the caller's
// transaction, and returns ErrStale instead — the token is stale, and tx must not write —
// when token is lower than
//
//   - the newest grant of the lease named resource, even if that grant's holder has not
//     written yet: name the resource like the lease, and a holder paused past its lease is
//     refused from the moment the lease was granted again;
//   - the highest token recorded for resource; or, when resource has no register (never
//     written, or collected by pgcoord gc), the retired floor — the highest token of every
//     collected register and lease — unless token is the newest grant of the lease named
//     resource.
//
// The register row stays locked until tx ends, so concurrent writers of one resource are
// ordered: a writer with a lower token that arrives while a higher one is in flight waits,
// then gets ErrStale. Call it before the writes it protects, and roll tx back on ErrStale.
// It orders writes (a stale one cannot overwrite a newer one); it does not make an effect
// happen once (see the package's Guarantees; CheckLease does, for this database). One
// round trip. A bad resource name or a token below 1 is refused before any SQL runs
// (pgcoord.ErrInvalidName, pgcoord.ErrInvalidArgument). On a standby it returns an error
// wrapping pgcoord.ErrReadOnly.
func Check(ctx context.Context, tx pgx.Tx, resource string, token int64) error {
	if err := validate(resource, token); err != nil {
		return err
	}
	if err := check.DB(tx); err != nil {
		return err
	}
	_, err := queries.FenceCheck(ctx, tx, dbsqlc.FenceCheckParams{Resource: resource, FenceToken: token})
	if errors.Is(err, pgx.ErrNoRows) {
		return stale("%q token %d", resource, token)
	}
	if err != nil {
		return fmt.Errorf("fenced: check %q: %w", resource, base.TranslateError(err))
	}
	return nil
}

// Write is Check and one write in a single round trip: inside the caller's transaction it
// sends the fence check of resource and the statement sql together, and the statement runs
// only if Check would accept token. It returns the statement's command tag, or ErrStale —
// in which case nothing was written and tx is aborted and must be rolled back. Ordering
// and locking are those of Check. Use it when the write does not need the check's answer
// first: it saves the round trip Check costs.
// On a standby it returns an error wrapping pgcoord.ErrReadOnly.
func Write(ctx context.Context, tx pgx.Tx, resource string, token int64, sql string, args ...any) (pgconn.CommandTag, error) {
	if err := validate(resource, token); err != nil {
		return pgconn.CommandTag{}, err
	}
	if err := check.DB(tx); err != nil {
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
		return pgconn.CommandTag{}, fmt.Errorf("fenced: check %q: %w", resource, base.TranslateError(err))
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

// validate refuses a bad resource name (pgcoord.ErrInvalidName) or a token pgcoord never
// issues (pgcoord.ErrInvalidArgument) before any SQL runs.
func validate(resource string, token int64) error {
	if err := check.Name("resource", resource); err != nil {
		return err
	}
	if token < 1 {
		return check.Invalid("fence token %d is not positive", token)
	}
	return nil
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
	if err := check.DB(db); err != nil {
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
	return fmt.Errorf("fenced: %w", base.TranslateError(err))
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
// therefore happen while l is held: mutual exclusion for data in the same database, and
// the path that is safe in every interleaving — the lease's next holder starts after tx
// ended and sees what it wrote. It returns an error wrapping leases.ErrLost otherwise. One
// round trip. A Lease with a bad name or holder, or a token below 1, is refused before any
// SQL runs. On a standby it returns an error wrapping pgcoord.ErrReadOnly.
func CheckLease(ctx context.Context, tx pgx.Tx, l leases.Lease) error {
	if err := check.Name("lease", l.Name); err != nil {
		return err
	}
	if err := check.Name("holder", l.Holder); err != nil {
		return err
	}
	if l.Token < 1 {
		return check.Invalid("fence token %d is not positive", l.Token)
	}
	if err := check.DB(tx); err != nil {
		return err
	}
	_, err := queries.CheckLease(ctx, tx, dbsqlc.CheckLeaseParams{Name: l.Name, Holder: l.Holder, FenceToken: l.Token})
	if errors.Is(err, pgx.ErrNoRows) {
		refusals.leaseLost.Add(1)
		return fmt.Errorf("%w: %q token %d is not current", leases.ErrLost, l.Name, l.Token)
	}
	if err != nil {
		return fmt.Errorf("fenced: check lease %q: %w", l.Name, base.TranslateError(err))
	}
	return nil
}

// tableIdent matches a plain identifier, or a double-quoted one (which keeps its case);
// columnIdent a column's name as stored in the catalog.
var (
	tableIdent  = regexp.MustCompile(`^([A-Za-z_][A-Za-z0-9_$]{0,62}|"([^"\x00]|""){1,63}")$`)
	columnIdent = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_$]{0,62}$`)
)

// GuardOpts are the options of InstallGuard. A nil *GuardOpts installs the UPDATE-only
// guard.
type GuardOpts struct {
	// ResourceColumn names the column (of any type) that says which resource a row
	// belongs to. With it, the guard judges every INSERT and every UPDATE: the row's fence
	// token must pass the fence register of the resource ResourcePrefix || <the column's
	// value, as text> (exactly as Check would judge it, recording the token), and a row
	// without a token (NULL or below 1) or without a resource is refused. That guards insert-only tables, such as a
	// ledger of charges, against a stale holder whatever code path inserts. Without it,
	// the guard judges UPDATEs only, against the row's own previous token.
	ResourceColumn string
	// ResourcePrefix is put before the resource column's value to name the resource, so a
	// table's rows can share the registers (and the leases) of names such as "order:"
	// + order_id. Default "". It needs ResourceColumn; prefix and value together must be a
	// valid resource name (1 to 255 bytes), or the write fails with SQLSTATE 22023.
	ResourcePrefix string
}

// InstallGuard installs the guard trigger on table for its integer fence column, so that
// the database itself refuses a stale write, with SQLSTATE GuardSQLState, whichever code
// path sends it:
//
//   - with a nil opts (or no ResourceColumn): any UPDATE that would lower the column or
//     set it to NULL. INSERTs are not judged — a stale holder may still insert — and
//     neither is an UPDATE that leaves the column as it is.
//   - with opts.ResourceColumn: on top of that, every INSERT and UPDATE, whose row's token
//     must pass the fence register of its resource (see GuardOpts): a row carrying a
//     token lower than the newest grant of the lease named like that resource, or than the
//     highest token recorded for it, is refused.
//
// table is resolved as SQL would resolve it (optionally "schema.table"; unquoted names fold
// to lower case, through search_path; a double-quoted name keeps its case); column and
// opts.ResourceColumn are the columns' names as stored. It is idempotent, and installing it
// again with other options replaces the trigger. The trigger is named GuardTriggerName(column).
// Writes that skip fencing altogether (an UPDATE of other columns on an UPDATE-only guard)
// must still be prevented by code review. Needs PostgreSQL 14+. Bad names, a missing
// table or column, a fence column that is not an integer, or a ResourcePrefix without a
// ResourceColumn return an error wrapping pgcoord.ErrInvalidArgument.
func InstallGuard(ctx context.Context, db pgcoord.DBTX, table, column string, opts *GuardOpts) error {
	var o GuardOpts
	if opts != nil {
		o = *opts
	}
	if o.ResourceColumn == "" && o.ResourcePrefix != "" {
		return check.Invalid("a resource prefix needs a resource column")
	}
	if o.ResourceColumn != "" && !columnIdent.MatchString(o.ResourceColumn) {
		return check.Invalid("%q is not a column name", o.ResourceColumn)
	}
	if len(o.ResourcePrefix) >= pgcoord.MaxNameLen || strings.ContainsRune(o.ResourcePrefix, 0) || !utf8.ValidString(o.ResourcePrefix) {
		return check.Invalid("resource prefix %q must be valid UTF-8 without NUL, shorter than %d bytes", o.ResourcePrefix, pgcoord.MaxNameLen)
	}
	tbl, trigger, err := resolveGuard(ctx, db, table, column)
	if err != nil {
		return err
	}
	dataType, err := columnType(ctx, db, tbl, column)
	if err != nil {
		return err
	}
	switch dataType {
	case "bigint", "integer", "smallint":
	default:
		return check.Invalid("column %s.%s is %s; a fence column must be bigint, integer or smallint", tbl, column, dataType)
	}
	events, args := "UPDATE", quoteLiteral(column)
	if o.ResourceColumn != "" {
		if _, err := columnType(ctx, db, tbl, o.ResourceColumn); err != nil {
			return err
		}
		events = "INSERT OR UPDATE"
		args += ", " + quoteLiteral(o.ResourceColumn) + ", " + quoteLiteral(o.ResourcePrefix)
	}
	_, err = db.Exec(ctx, fmt.Sprintf(`CREATE OR REPLACE TRIGGER %s BEFORE %s ON %s
		FOR EACH ROW EXECUTE FUNCTION pgcoord_fence_guard(%s)`,
		pgx.Identifier{trigger}.Sanitize(), events, tbl, args))
	if err != nil {
		return fmt.Errorf("fenced: install guard on %s: %w", tbl, base.TranslateError(err))
	}
	return nil
}

// columnType returns the type of table's column, or an error wrapping
// pgcoord.ErrInvalidArgument if table has no such column.
func columnType(ctx context.Context, db pgcoord.DBTX, table, column string) (string, error) {
	var dataType *string
	err := db.QueryRow(ctx, `SELECT format_type(a.atttypid, a.atttypmod) FROM pg_attribute a
		WHERE a.attrelid = $1::regclass AND a.attname = $2 AND a.attnum > 0 AND NOT a.attisdropped`,
		table, column).Scan(&dataType)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", check.Invalid("table %s has no column %q", table, column)
	}
	if err != nil {
		return "", fmt.Errorf("fenced: install guard on %s: %w", table, base.TranslateError(err))
	}
	return *dataType, nil
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
		return fmt.Errorf("fenced: remove guard from %s: %w", tbl, base.TranslateError(err))
	}
	return nil
}

// resolveGuard validates table and column, resolves table in the database and returns its
// quoted, schema-qualified name and the guard trigger's name.
func resolveGuard(ctx context.Context, db pgcoord.DBTX, table, column string) (string, string, error) {
	parts := strings.Split(table, ".")
	if len(parts) > 2 {
		return "", "", check.Invalid("%q is not a table name (letters, digits, _; optionally schema.table)", table)
	}
	for _, p := range parts {
		if !tableIdent.MatchString(p) {
			return "", "", check.Invalid("%q is not a table name (letters, digits, _; optionally schema.table)", table)
		}
	}
	if !columnIdent.MatchString(column) {
		return "", "", check.Invalid("%q is not a column name", column)
	}
	if err := check.DB(db); err != nil {
		return "", "", err
	}
	var resolved *string
	err := db.QueryRow(ctx, `SELECT c.oid::regclass::text FROM pg_class c WHERE c.oid = to_regclass($1) AND c.relkind IN ('r', 'p')`, table).Scan(&resolved)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", "", check.Invalid("no table %s", table)
	}
	if err != nil {
		return "", "", fmt.Errorf("fenced: resolve table %s: %w", table, err)
	}
	return *resolved, GuardTriggerName(column), nil
}

// GuardTriggerName returns the name of the guard trigger InstallGuard creates for column:
// pgcoord_fence_guard_<column>, or, when that is longer than an identifier may be, a
// prefix of it with a hash of the column, so two long column names never share a trigger.
func GuardTriggerName(column string) string {
	name := "pgcoord_fence_guard_" + column
	if len(name) <= 63 {
		return name
	}
	sum := sha256.Sum256([]byte(column))
	return name[:50] + "_" + hex.EncodeToString(sum[:6])
}

// quoteLiteral quotes s (without NUL) as a SQL string literal, as quote_literal does:
// with a backslash in s, as an E” literal, which reads the same whatever
// standard_conforming_strings is.
func quoteLiteral(s string) string {
	q := "'" + strings.ReplaceAll(s, "'", "''") + "'"
	if strings.Contains(s, `\`) {
		q = "E" + strings.ReplaceAll(q, `\`, `\\`)
	}
	return q
}

var queries dbsqlc.Queries
