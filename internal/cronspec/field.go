package cronspec

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
)

// A token is one space-separated part of an expression and its 1-based byte column.
type token struct {
	text string
	col  int
}

// A problem is what is wrong with a field, and the column where it starts.
type problem struct {
	col int
	msg string
}

// A fieldKind describes one calendar field: its name in errors, its bounds, and the names
// it accepts for min, min+1, ... (case-insensitive).
type fieldKind struct {
	name     string
	min, max int
	names    []string
	expect   string // what a value must be, for errors
	hint     string // appended to "above the maximum"
}

var (
	secondField = fieldKind{name: "second", max: 59, expect: "a number"}
	minuteField = fieldKind{name: "minute", max: 59, expect: "a number"}
	hourField   = fieldKind{name: "hour", max: 23, expect: "a number"}
	domField    = fieldKind{name: "day of month", min: 1, max: 31, expect: "a number"}
	monthField  = fieldKind{name: "month", min: 1, max: 12, expect: "a number or a month name (JAN-DEC)",
		names: []string{"jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"}}
	dowField = fieldKind{name: "day of week", max: 6, expect: "a number or a day name (SUN-SAT)",
		names: []string{"sun", "mon", "tue", "wed", "thu", "fri", "sat"}, hint: " (Sunday is 0 or SUN)"}

	// withSeconds and standard are the fields of a 6-field and a 5-field expression.
	withSeconds = []fieldKind{secondField, minuteField, hourField, domField, monthField, dowField}
	standard    = withSeconds[1:]
)

// check returns the first problem of field f, or nil. It accepts what robfig/cron accepts,
// less a few things robfig lets through silently: empty list elements (1,,2), a star that
// starts a range (*-5, which robfig reads as *), signs (+5), and steps wider than the field.
func (k fieldKind) check(f token) *problem {
	for i := 0; i < len(f.text); {
		r, n := utf8.DecodeRuneInString(f.text[i:])
		switch {
		case r == '#':
			return &problem{f.col + i, "# (nth weekday of the month) is not supported"}
		case !fieldChar(r):
			return &problem{f.col + i, fmt.Sprintf("unexpected character %q", r)}
		}
		i += n
	}
	col := f.col
	for _, item := range strings.Split(f.text, ",") {
		if p := k.checkItem(item, col); p != nil {
			return p
		}
		col += len(item) + 1
	}
	return nil
}

func fieldChar(r rune) bool {
	return '0' <= r && r <= '9' || 'a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || strings.ContainsRune("*?,-/", r)
}

// checkItem checks one list element: * or ? or value or value-value, optionally /step.
func (k fieldKind) checkItem(item string, col int) *problem {
	if item == "" {
		return &problem{col, "empty list element"}
	}
	base, step, stepped := strings.Cut(item, "/")
	if stepped {
		if p := k.checkStep(step, col+len(base)+1); p != nil {
			return p
		}
	}
	if base == "*" || base == "?" {
		return nil
	}
	lo, hi, ranged := strings.Cut(base, "-")
	from, p := k.value(lo, col)
	if p != nil || !ranged {
		return p
	}
	hiCol := col + len(lo) + 1
	if i := strings.IndexByte(hi, '-'); i >= 0 {
		return &problem{hiCol + i, "too many - in " + base}
	}
	to, p := k.value(hi, hiCol)
	if p != nil {
		return p
	}
	if from > to {
		return &problem{col, fmt.Sprintf("range %s runs backwards (ranges do not wrap around)", base)}
	}
	return nil
}

// checkStep checks the step after a slash: a number from 1 to the field's count of values.
func (k fieldKind) checkStep(step string, col int) *problem {
	if i := strings.IndexByte(step, '/'); i >= 0 {
		return &problem{col + i, "too many / in one list element"}
	}
	span := k.max - k.min + 1
	n, err := strconv.Atoi(step)
	switch {
	case step == "":
		return &problem{col, "missing step after /"}
	case !digits(step):
		return &problem{col, fmt.Sprintf("step %q is not a number", step)}
	case err != nil || n > span:
		return &problem{col, fmt.Sprintf("step %s is above the field's %d values", step, span)}
	case n == 0:
		return &problem{col, "step 0 must be at least 1"}
	}
	return nil
}

// value parses a number or a name of the field.
func (k fieldKind) value(tok string, col int) (int, *problem) {
	if tok == "" {
		return 0, &problem{col, "missing value"}
	}
	if tok == "*" || tok == "?" {
		return 0, &problem{col, tok + " cannot be part of a range"}
	}
	if digits(tok) {
		n, err := strconv.Atoi(tok)
		switch {
		case err != nil || n > k.max:
			return 0, &problem{col, fmt.Sprintf("%s is above the maximum %d%s", tok, k.max, k.hint)}
		case n < k.min:
			return 0, &problem{col, fmt.Sprintf("%s is below the minimum %d", tok, k.min)}
		}
		return n, nil
	}
	if i := slices.Index(k.names, strings.ToLower(tok)); i >= 0 {
		return k.min + i, nil
	}
	switch strings.TrimLeft(strings.ToUpper(tok), "0123456789") {
	case "L", "W", "LW":
		return 0, &problem{col, "L and W (last day, nearest weekday) are not supported"}
	}
	return 0, &problem{col, fmt.Sprintf("%q is not %s", tok, k.expect)}
}

func digits(s string) bool {
	return s != "" && strings.Trim(s, "0123456789") == ""
}
