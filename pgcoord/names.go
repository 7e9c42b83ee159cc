package pgcoord

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"reflect"
	"unicode/utf8"
)

// MaxNameLen is the longest name, in bytes, that pgcoord accepts for a lease, job, key,
// scope or topic.
const MaxNameLen = 255

// ErrInvalidName is returned, before any SQL runs, for a name that is empty, longer than
// MaxNameLen bytes, not valid UTF-8, or contains a NUL byte (which Postgres text cannot
// hold).
var ErrInvalidName = errors.New("pgcoord: invalid name")

// ErrInvalidArgument is returned, before any SQL runs, for an argument other than a name that
// is out of range: a non-positive or absurdly large TTL, a nil handle, a limit below 1, ...
var ErrInvalidArgument = errors.New("pgcoord: invalid argument")

// CheckDB returns an error wrapping ErrInvalidArgument if db is nil, including a typed nil
// such as a (*pgxpool.Pool)(nil) stored in the interface.
func CheckDB(db DBTX) error {
	if db == nil {
		return fmt.Errorf("%w: nil database handle", ErrInvalidArgument)
	}
	if v := reflect.ValueOf(db); v.Kind() == reflect.Pointer && v.IsNil() {
		return fmt.Errorf("%w: nil %T", ErrInvalidArgument, db)
	}
	return nil
}

// ValidateName checks a name given to any pgcoord primitive. kind says what the name is
// for ("lease", "job", ...) and appears in the error, which wraps ErrInvalidName.
func ValidateName(kind, name string) error {
	switch {
	case name == "":
		return fmt.Errorf("%w: %s name is empty", ErrInvalidName, kind)
	case len(name) > MaxNameLen:
		return fmt.Errorf("%w: %s name is %d bytes, more than the maximum of %d", ErrInvalidName, kind, len(name), MaxNameLen)
	case !utf8.ValidString(name):
		return fmt.Errorf("%w: %s name is not valid UTF-8", ErrInvalidName, kind)
	}
	for i := 0; i < len(name); i++ {
		if name[i] == 0 {
			return fmt.Errorf("%w: %s name contains a NUL byte", ErrInvalidName, kind)
		}
	}
	return nil
}

// NewHolderID returns a new holder identity, "host/pid/random", unique per call: the
// default identity of a lease holder, a semaphore permit holder or a job runner, so two
// calls never share a grant, and an operator can find the process behind it.
func NewHolderID() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return fmt.Sprintf("%s/%d/%s", hostname, os.Getpid(), hex.EncodeToString(b))
}

var hostname, _ = os.Hostname()

// DefaultListLimit and MaxListLimit bound one page of every List call of pgcoord's
// packages (leases.List, semaphore.List, singleton.ListJobs, ...).
const (
	DefaultListLimit = 100
	MaxListLimit     = 10000
)

// ListLimit returns the page size for a List option: DefaultListLimit for 0, n when it
// is between 1 and MaxListLimit, and an error wrapping ErrInvalidArgument otherwise.
func ListLimit(n int) (int32, error) {
	if n == 0 {
		return DefaultListLimit, nil
	}
	if n < 0 || n > MaxListLimit {
		return 0, fmt.Errorf("%w: list limit %d is outside 1..%d", ErrInvalidArgument, n, MaxListLimit)
	}
	return int32(n), nil
}
