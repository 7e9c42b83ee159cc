package base

import (
	"reflect"
	"unicode"
	"unicode/utf8"
)

// MaxNameLen is the longest name, in bytes, that pgcoord accepts for a lease, job, key,
// scope or topic.
const MaxNameLen = 255

// DefaultListLimit and MaxListLimit bound one page of every List call.
const (
	DefaultListLimit = 100
	MaxListLimit     = 10000
)

// Check makes the argument errors of one package: each reads "pkg: cause" and wraps
// ErrInvalidArgument or ErrInvalidName. A package declares one: var check = base.Check("leases").
type Check string

// Invalid returns an error wrapping ErrInvalidArgument (and any %w in format).
func (c Check) Invalid(format string, args ...any) error {
	return newArgError(ErrInvalidArgument, string(c), format, args...)
}

// InvalidName returns an error wrapping ErrInvalidName (and any %w in format).
func (c Check) InvalidName(format string, args ...any) error {
	return newArgError(ErrInvalidName, string(c), format, args...)
}

// DB refuses a nil handle, including a typed nil such as a (*pgxpool.Pool)(nil) stored in
// the interface.
func (c Check) DB(db any) error {
	if db == nil {
		return c.Invalid("nil database handle")
	}
	if v := reflect.ValueOf(db); v.Kind() == reflect.Pointer && v.IsNil() {
		return c.Invalid("nil %T", db)
	}
	return nil
}

// Name checks a name given to a primitive: 1 to MaxNameLen bytes of UTF-8 without a NUL
// byte (which Postgres text cannot hold) or another control character (see IsControl).
// kind says what the name is for ("lease", ...).
func (c Check) Name(kind, name string) error {
	switch {
	case name == "":
		return c.InvalidName("%s name is empty", kind)
	case len(name) > MaxNameLen:
		return c.InvalidName("%s name is %d bytes, more than the maximum of %d", kind, len(name), MaxNameLen)
	case !utf8.ValidString(name):
		return c.InvalidName("%s name is not valid UTF-8", kind)
	}
	for i, r := range name {
		if r == 0 {
			return c.InvalidName("%s name contains a NUL byte", kind)
		}
		if IsControl(r) {
			return c.InvalidName("%s name has a control character (%U) at byte %d", kind, r, i)
		}
	}
	return nil
}

// IsControl reports whether r is a character pgcoord refuses in names (as the SQL API's
// pgcoord_name_ok does): C0 and C1 controls and DEL, the line and paragraph separators and
// the bidirectional controls. Printed by a CLI or a log, they could move a terminal's
// cursor, retitle its window, fake a table row or reverse the text after them.
func IsControl(r rune) bool {
	return unicode.IsControl(r) || r == 0x200e || r == 0x200f || r == 0x2028 || r == 0x2029 ||
		r >= 0x202a && r <= 0x202e || r >= 0x2066 && r <= 0x2069
}

// ListLimit returns the page size for a List option: DefaultListLimit for 0, n when it is
// between 1 and MaxListLimit, and an error otherwise.
func (c Check) ListLimit(n int) (int32, error) {
	if n == 0 {
		return DefaultListLimit, nil
	}
	if n < 0 || n > MaxListLimit {
		return 0, c.Invalid("list limit %d is outside 1..%d", n, MaxListLimit)
	}
	return int32(n), nil
}

// SyncCommit checks the synchronous_commit level a grant may ask for: "" (the server's
// setting), "on", "remote_write" or "remote_apply". Lower levels are refused, because a
// grant must be durable.
func (c Check) SyncCommit(level string) error {
	switch level {
	case "", "on", "remote_write", "remote_apply":
		return nil
	}
	return c.Invalid("synchronous_commit level %q for a grant: want \"\", \"on\", \"remote_write\" or \"remote_apply\"", level)
}
