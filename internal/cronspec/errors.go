package cronspec

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// ParseError is the error of a bad expression. Field is "second", "minute", "hour",
// "day of month", "month", "day of week", "descriptor", "interval" or "expression" (the
// whole). Column is the 1-based byte column in Expr, the trimmed expression, where the
// bad part starts.
type ParseError struct {
	Expr   string
	Field  string
	Column int
	Msg    string
}

// Error returns, for example,
// `schedules: bad expression "0 61 * * *" at column 3 (minute): 61 is above the maximum 59`.
// An expression longer than 64 bytes is cut short in the quote.
func (e *ParseError) Error() string {
	expr := e.Expr
	if len(expr) > 64 {
		expr = expr[:64] + "..."
	}
	return fmt.Sprintf("schedules: bad expression %q at column %d (%s): %s", expr, e.Column, e.Field, e.Msg)
}

// ErrUnknownZone is wrapped by Parse's error for a zone it cannot use: empty, longer than 64
// bytes, a file path (a leading / or ..), "Local" (which differs between machines), or a
// name that time.LoadLocation does not know.
var ErrUnknownZone = errors.New("schedules: unknown time zone")

// loadZone loads an IANA zone by name.
func loadZone(zone string) (*time.Location, error) {
	quoted := zone
	if len(quoted) > maxZoneLen {
		quoted = quoted[:maxZoneLen] + "..."
	}
	bad := func(why string) error { return fmt.Errorf("%w %q: %s", ErrUnknownZone, quoted, why) }
	switch {
	case zone == "":
		return nil, bad(`a zone is required (use "UTC" for UTC)`)
	case len(zone) > maxZoneLen:
		return nil, bad(fmt.Sprintf("longer than %d bytes", maxZoneLen))
	case strings.HasPrefix(zone, "/") || strings.Contains(zone, ".."):
		return nil, bad("a zone name like Europe/Berlin, not a file path")
	case zone == "Local":
		return nil, bad("Local differs between machines; name the zone, like Europe/Berlin")
	}
	loc, err := time.LoadLocation(zone)
	if err != nil {
		return nil, bad("not in the time zone database")
	}
	return loc, nil
}
