package cli

import (
	"errors"
	"fmt"

	"github.com/pgcoord/pgcoord/internal/base"
	"github.com/pgcoord/pgcoord/pgcoord"
)

// Exit codes of the pgcoord command.
const (
	ExitOK      = 0 // success
	ExitFailure = 1 // the command failed
	ExitUsage   = 2 // bad flags, arguments or command
	ExitCheck   = 3 // a check ran and answered "no" (pending migrations, overdue job, ...)
)

// usageError marks an error in how the command was called (exit code 2).
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

func usagef(format string, args ...any) error { return usageError{fmt.Errorf(format, args...)} }

// errCheckFailed reports that a check ran and answered "no" (exit code 3); the command has
// already printed why.
var errCheckFailed = errors.New("check failed")

// exitCode makes Run exit with that code and print nothing more: the command has already
// said why on stderr (or, for a child's exit status, the child has).
type exitCode int

func (e exitCode) Error() string { return fmt.Sprintf("exit status %d", int(e)) }

// exitCodeOf returns the code of an exitCode in err's chain, or ExitFailure.
func exitCodeOf(err error) int {
	var ec exitCode
	if errors.As(err, &ec) {
		return int(ec)
	}
	return ExitFailure
}

// argError turns the API's input errors (ErrInvalidName, ErrInvalidArgument) into usage
// errors (exit 2) and leaves every other error alone.
func argError(err error) error {
	if errors.Is(err, pgcoord.ErrInvalidName) || errors.Is(err, pgcoord.ErrInvalidArgument) {
		return usageError{err}
	}
	return err
}

// check makes this package's argument errors (their text is the cause alone).
var check = base.Check("")
