package dedupe

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/pgcoord/pgcoord/internal/base"
	"github.com/pgcoord/pgcoord/pgcoord"
)

// ErrNotUnique is returned by Transition when its UPDATE changed more than one row: the
// id column does not identify one row. The rows were changed; roll back the transaction
// if Transition ran in one.
var ErrNotUnique = errors.New("dedupe: transition matched more than one row")

// maxIdentifierLen is PostgreSQL's limit on identifiers (NAMEDATALEN - 1).
const maxIdentifierLen = 63

// TransitionSpec names one row of the caller's table and the state change to make on it:
// UPDATE <Table> SET <StateColumn> = To WHERE <IDColumn> = ID AND <StateColumn> = From.
//
// Table, IDColumn and StateColumn are identifiers, quoted as given (so matched exactly,
// like quoted SQL identifiers: a table created as Orders without quotes is orders); Table
// may be schema-qualified ("billing.orders"), and is otherwise resolved through
// search_path. ID, From and To are sent as parameters, never spliced into the SQL.
type TransitionSpec struct {
	// Table is the table holding the row: "orders" or "billing.orders".
	Table string
	// IDColumn is the column identifying the row; it should be unique (a primary key).
	IDColumn string
	// ID is the row's value of IDColumn. It must not be nil.
	ID any
	// StateColumn is the column holding the row's state (text, varchar or an enum).
	StateColumn string
	// From is the state the row must be in for the transition to happen.
	From string
	// To is the state the transition sets. It must differ from From.
	To string
}

// Transition moves one row of the caller's table from state From to state To, only if it
// is in state From, in one statement:
//
//	UPDATE orders SET status = $1 WHERE id = $2 AND status = $3   -- 'paid', 42, 'pending'
//
// and reports whether this call made the transition. Of any number of concurrent calls
// (on any number of machines) moving the same row pending -> paid, exactly one returns
// true; the others return false, having changed nothing — whether they ran before or after
// it, or waited for its transaction to commit. Do the work that must happen once (send the
// receipt, enqueue the shipment) only when it returns true, ideally in the same
// transaction: pass a pgx.Tx as db, so the state change and the work commit together.
//
// Under READ COMMITTED (PostgreSQL's default) an UPDATE that waited for another
// transaction's change of the row re-checks its WHERE clause against the committed row,
// so it sees 'paid' and returns false. Under REPEATABLE READ or SERIALIZABLE it fails
// instead with SQLSTATE 40001 (serialization_failure): roll back and retry the
// transaction, whose Transition then returns false.
//
// Bad input — an empty or over-long (63 bytes) identifier, one that is not valid UTF-8 or
// holds a NUL byte, a Table with more than one dot, IDColumn equal to StateColumn, a nil
// ID, From equal to To, a From or To that is not valid UTF-8 or holds a NUL byte, a nil
// db — returns an error wrapping pgcoord.ErrInvalidArgument before any SQL runs. A table or
// column that does not exist is the server's error (SQLSTATE 42P01, 42703). An UPDATE
// that changed several rows returns true with an error wrapping ErrNotUnique.
// On a standby it returns an error wrapping pgcoord.ErrReadOnly.
func Transition(ctx context.Context, db pgcoord.DBTX, t TransitionSpec) (bool, error) {
	sql, err := t.sql()
	if err != nil {
		return false, err
	}
	if err := check.DB(db); err != nil {
		return false, err
	}
	tag, err := db.Exec(ctx, sql, t.To, t.ID, t.From)
	if err != nil {
		return false, fmt.Errorf("dedupe: transition %s %v %s -> %s: %w", t.Table, t.ID, t.From, t.To, base.TranslateError(err))
	}
	switch n := tag.RowsAffected(); {
	case n == 0:
		return false, nil
	case n > 1:
		return true, fmt.Errorf("%w: %d rows of %s have %s = %v", ErrNotUnique, n, t.Table, t.IDColumn, t.ID)
	}
	return true, nil
}

// sql validates t and builds its UPDATE.
func (t TransitionSpec) sql() (string, error) {
	var table pgx.Identifier
	parts := strings.Split(t.Table, ".")
	if len(parts) > 2 {
		return "", check.Invalid("transition: table %q: want table or schema.table", t.Table)
	}
	for _, p := range parts {
		if err := checkIdentifier("table", p); err != nil {
			return "", err
		}
		table = append(table, p)
	}
	if err := checkIdentifier("id column", t.IDColumn); err != nil {
		return "", err
	}
	if err := checkIdentifier("state column", t.StateColumn); err != nil {
		return "", err
	}
	switch {
	case t.IDColumn == t.StateColumn:
		return "", check.Invalid("transition: the id column and the state column are both %q", t.IDColumn)
	case t.ID == nil:
		return "", check.Invalid("transition: nil id (NULL matches no row)")
	case t.From == t.To:
		return "", check.Invalid("transition: from and to are both %q", t.From)
	}
	for _, s := range []string{t.From, t.To} {
		if !utf8.ValidString(s) || strings.IndexByte(s, 0) >= 0 {
			return "", check.Invalid("transition: state %q is not valid UTF-8 without NUL bytes", s)
		}
	}
	state := pgx.Identifier{t.StateColumn}.Sanitize()
	return fmt.Sprintf("UPDATE %s SET %s = $1 WHERE %s = $2 AND %s = $3",
		table.Sanitize(), state, pgx.Identifier{t.IDColumn}.Sanitize(), state), nil
}

// checkIdentifier checks one identifier of a TransitionSpec.
func checkIdentifier(what, s string) error {
	switch {
	case s == "":
		return check.Invalid("transition: empty %s name", what)
	case len(s) > maxIdentifierLen:
		return check.Invalid("transition: %s name %q is longer than %d bytes", what, s, maxIdentifierLen)
	case !utf8.ValidString(s) || strings.IndexByte(s, 0) >= 0:
		return check.Invalid("transition: %s name %q is not valid UTF-8 without NUL bytes", what, s)
	}
	return nil
}
