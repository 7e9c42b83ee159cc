package base

import (
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// The sentinels, re-exported and documented by package pgcoord.
var (
	ErrInvalidArgument = errors.New("pgcoord: invalid argument")
	ErrInvalidName     = errors.New("pgcoord: invalid name")
	ErrReadOnly        = errors.New("pgcoord: the server is read-only (a standby, or a read-only transaction); grants and writes need the primary")
	ErrPooler          = errors.New("pgcoord: the connection goes through a pooler (its server process id is not the one it was given), and this needs a session: use a direct connection")
)

// argError is an error of bad input: its text reads "pkg: cause" and it wraps the sentinel
// of its kind (ErrInvalidArgument or ErrInvalidName) and whatever the cause wrapped. A cause
// that already starts with "pkg: " (a package's own sentinel first) is not prefixed twice.
type argError struct {
	kind  error
	cause error
	text  string
}

func (e *argError) Error() string   { return e.text }
func (e *argError) Unwrap() []error { return []error{e.kind, e.cause} }

func newArgError(kind error, pkg, format string, args ...any) error {
	cause := fmt.Errorf(format, args...)
	text := cause.Error()
	if pkg != "" && !strings.HasPrefix(text, pkg+": ") {
		text = pkg + ": " + text
	}
	return &argError{kind: kind, cause: cause, text: text}
}

// TranslateError returns err wrapped with ErrReadOnly when it is the server's refusal to
// write (SQLSTATE 25006, read_only_sql_transaction: what a standby in recovery answers to a
// grant, a write or a LISTEN); any other error, and nil, it returns unchanged.
func TranslateError(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "25006" {
		return fmt.Errorf("%w: %w", ErrReadOnly, err)
	}
	return err
}
