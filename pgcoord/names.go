package pgcoord

import "github.com/pgcoord/pgcoord/internal/base"

// MaxNameLen is the longest name, in bytes, that pgcoord accepts for a lease, job, key,
// scope or topic.
const MaxNameLen = base.MaxNameLen

// ErrInvalidName is wrapped, before any SQL runs, by the error for a name that is empty,
// longer than MaxNameLen bytes, not valid UTF-8, or contains a NUL byte (which Postgres
// text cannot hold). The error's text says which package refused which name, and why.
var ErrInvalidName = base.ErrInvalidName

// ErrInvalidArgument is wrapped, before any SQL runs, by the error for an argument other
// than a name that is out of range: a non-positive or absurdly large TTL, a nil handle, a
// limit below 1, ... The error's text says which package refused what, and why.
var ErrInvalidArgument = base.ErrInvalidArgument

// DefaultListLimit and MaxListLimit bound one page of every List call of pgcoord's
// packages (leases.List, semaphore.List, singleton.ListJobs, ...).
const (
	DefaultListLimit = base.DefaultListLimit
	MaxListLimit     = base.MaxListLimit
)
