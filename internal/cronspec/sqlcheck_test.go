package cronspec_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/internal/pgtest"
)

// This file checks, against the database alone, the validators of migration 00015 that
// the SQL API of schedules calls before it writes: pgcoord_cron_check accepts the
// expressions the Go side accepts and refuses the others with SQLSTATE 22023, naming the
// byte column and the field where the bad part starts; pgcoord_zone_check accepts the
// zones pg_timezone_names lists, spelled as it lists them.

// cronCase is an expression and pgcoord_cron_check's answer: accepted when col is 0, else
// refused at byte column col, in field, with a message containing says.
type cronCase struct {
	expr  string
	col   int
	field string
	says  string
}

func ok(expr string) cronCase { return cronCase{expr: expr} }

func no(expr string, col int, field, says string) cronCase {
	return cronCase{expr: expr, col: col, field: field, says: says}
}

// long is an accepted expression of exactly 255 bytes.
var long = "0 0 * * 1" + strings.Repeat(",1", 123)

var cronCases = []cronCase{
	// Five fields (minute hour day-of-month month day-of-week), or six with a second first.
	ok("* * * * *"),
	ok("0 0 * * *"),
	ok("*/5 * * * *"),
	ok("0 */2 * * *"),
	ok("30 2 1 * *"),
	ok("0 9-17 * * MON-FRI"),
	ok("0 9-17 * * mon-fri"),
	ok("0 0 * * Sun,sat"),
	ok("0 0 1 JAN,APR,JUL,OCT *"),
	ok("0 0 1 jan-dec/3 *"),
	ok("0 0 1-31 1-12 0-6"),
	ok("59 23 31 12 6"),
	ok("0 0 0 * * *"),
	ok("59 59 23 31 12 6"),
	ok("*/15 * * * * *"),
	ok("1,2,3 * * * *"),
	ok("0-59/60 * * * *"), // a step past the range: only the start
	ok("5/10 * * * *"),    // 5-59/10
	ok("0 0 * * mon/2"),   // mon-sat/2
	ok("*/1 * * * *"),     // the same as *
	ok("? ? ? ? ? ?"),     // ? is *
	ok("0 0 ? * *"),       // ? is *
	ok("007 0 * * *"),     // and leading zeros
	ok("*/60 * * * *"),    // a step as wide as the field
	ok("0 0 * * */7"),
	ok(" 0 0 * * * "),        // strings.TrimSpace drops the padding
	ok("\u3000 0 0 * * *\n"), // any Unicode white space, control characters too
	ok("0 0 * * *\u2028"),
	ok("0  0  *  *  *"), // repeated spaces separate as one
	ok(long),
	// Days that meet their months: February 29 in leap years; either day field when both
	// are restricted (a day field is unrestricted when its text starts with * or ?).
	ok("0 0 29 2 *"),
	ok("0 0 31 * *"),
	ok("0 0 30,31 2,4 *"),
	ok("0 0 31 2-12/2 *"),
	ok("0 0 31 2-11/3 *"), // May and August
	ok("0 0 30 2 1"),
	ok("0 0 31 2 mon"),
	ok("0 0 30 2 1,*"),
	ok("0 0 */31 2 3"), // February 1 on a Wednesday: in 2023 and 2034; SQL does not judge years
	// Descriptors, and @every with a Go duration of whole seconds from 1s to 366 days.
	ok("@yearly"), ok("@annually"), ok("@monthly"), ok("@weekly"), ok("@daily"), ok("@midnight"), ok("@hourly"),
	ok("@DAILY"), ok("@Hourly"), ok(" @daily "), ok("@EVERY 1h"), ok("@every  1h "),
	ok("@wee\u212aly"), // Go lowers the Kelvin sign to k
	ok("@every 1s"),
	ok("@every 90m"),
	ok("@every 1h30m"),
	ok("@every 1h0m0s"),
	ok("@every 8784h"),
	ok("@every 0.5m"),
	ok("@every .5m"),
	ok("@every 1.s"),
	ok("@every 1000ms"),
	ok("@every 60000000us"),
	ok("@every 60000000µs"),
	ok("@every 1000000000ns"),
	ok("@every +5s"),
	ok("@every 1.0000000001s"),           // Go drops what is below a nanosecond
	ok("@every 1.99999999999999999999s"), // keeping the fraction digits that fit in 2^63
	ok("@every 0.3333333333333333333m"),  // and adding them in float64: 20s
	ok("@every 0.01666666666666666666667h"),

	// The whole expression.
	no("", 1, "expression", "it is empty"),
	no("   ", 1, "expression", "it is blank"),
	no(long+"1", 1, "expression", "256 bytes long, over the limit of 255"),
	no("0\t0 * * *", 2, "expression", "a control character (U+0009)"),
	no("0 0 *\n* *", 6, "expression", "a control character (U+000A)"),
	no("0 0 * * *\u200e", 10, "expression", "a control character (U+200E)"),
	no("0 0 \u202e* * *", 5, "expression", "a control character (U+202E)"),
	no("TZ=UTC 0 0 * * *", 1, "expression", "the zone is a separate setting"),
	no("CRON_TZ=Europe/Paris 0 0 * * *", 1, "expression", "the zone is a separate setting"),
	no("CRON_TZ=UTC", 1, "expression", "the zone is a separate setting"),       // robfig panics on this one
	no(" TZ=UTC 0 0 * * *", 1, "expression", "the zone is a separate setting"), // columns of the trimmed expression
	no("* * * *", 1, "expression", "found 4"),
	no("* * * * * * *", 13, "expression", "found 7"),
	no("0 0 ,", 1, "expression", "found 3"),

	// Out of range; the column is the value's.
	no("61 0 * * *", 1, "minute", "61 is above the maximum 59"),
	no("0 61 * * *", 3, "hour", "61 is above the maximum 23"),
	no("0 24 * * *", 3, "hour", "24 is above the maximum 23"),
	no("60 * * * * *", 1, "second", "60 is above the maximum 59"),
	no("0 60 * * * *", 3, "minute", "60 is above the maximum 59"),
	no("0 0 0 * *", 5, "day of month", "0 is below the minimum 1"),
	no("0 0 32 * *", 5, "day of month", "32 is above the maximum 31"),
	no("0 0 * 0 *", 7, "month", "0 is below the minimum 1"),
	no("0 0 * 13 *", 7, "month", "13 is above the maximum 12"),
	no("0 0 * * 7", 9, "day of week", "7 is above the maximum 6"),
	no("0 0 * * 1-7", 11, "day of week", "7 is above the maximum 6"),
	no("0 0 1,5,40 * *", 9, "day of month", "40 is above the maximum 31"),
	no("0 0 99999999999999999999 * *", 5, "day of month", "99999999999999999999 is above the maximum 31"),
	no("60/5 * * * *", 1, "minute", "60 is above the maximum 59"),
	no("0\u00a00 * * * *", 1, "minute", "\"0\u00a00\" is not a number"), // only U+0020 separates

	// Not a number or name.
	no("x 0 0 * * *", 1, "second", `"x" is not a number`),
	no("0 0 JAN * *", 5, "day of month", `"JAN" is not a number`),
	no("0 0 * JAN-FOO *", 11, "month", `"FOO" is not a number or a month name (JAN-DEC)`),
	no("0 0 * * MONDAY", 9, "day of week", `"MONDAY" is not a number or a day name (SUN-SAT)`),
	no("0 0 1.5 * *", 5, "day of month", `"1.5" is not a number`),
	no("0 +5 * * *", 3, "hour", `"+5" is not a number`),
	no("0 0 * * FRİ", 9, "day of week", `"FRİ" is not a number or a day name (SUN-SAT)`),
	no("0 0 * * 0x1", 9, "day of week", `"0x1" is not a number`),
	no("0 0 1-* * *", 7, "day of month", `"*" is not a number`),
	no("/5 * * * *", 1, "minute", "a number is missing"),
	no("5- * * * *", 3, "minute", "a number is missing"),
	no("-5 * * * *", 1, "minute", "a number is missing"),
	no("0 0 -0 * *", 5, "day of month", "a number is missing"),

	// L, W and # are not supported.
	no("0 0 L * *", 5, "day of month", "L, W and # (last, nearest weekday, nth weekday) are not supported"),
	no("0 0 15W * *", 5, "day of month", "are not supported"),
	no("0 0 LW * *", 5, "day of month", "are not supported"),
	no("0 0 * * 5L", 9, "day of week", "are not supported"),
	no("0 0 * * 5#3", 9, "day of week", "are not supported"),
	no("0 0 * * FRI#2", 9, "day of week", "are not supported"),
	no("0 0 1-L * *", 7, "day of month", "are not supported"),

	// Ranges, steps and lists.
	no("0 0 10-5 * *", 5, "day of month", "the range 10-5 runs backwards (10 is above 5)"),
	no("0 0 * * FRI-MON", 9, "day of week", "the range FRI-MON runs backwards (5 is above 1)"),
	no("1-2-3 * * * *", 4, "minute", `a range has one "-"`),
	no("1/2/3 * * * *", 4, "minute", `an item has at most one "/"`),
	no("*-5 * * * *", 1, "minute", `"*" is the whole range and cannot start one`),
	no("0 0 ?-5 * *", 5, "day of month", `"?" is the whole range`),
	no("*/0 * * * *", 3, "minute", "the step 0 is below 1"),
	no("*/-1 * * * *", 3, "minute", `the step "-1" is not a number`),
	no("1-5/+2 * * * *", 5, "minute", `the step "+2" is not a number`),
	no("*/61 * * * *", 3, "minute", "the step 61 is above the field's 60 values"),
	no("0 0 */32 * *", 7, "day of month", "the step 32 is above the field's 31 values"),
	no("0 0 * */13 *", 9, "month", "the step 13 is above the field's 12 values"),
	no("*/x * * * *", 3, "minute", `the step "x" is not a number`),
	no("*/ * * * *", 3, "minute", `a step is missing after "/"`),
	no("0 0 * * */9223372036854775808", 11, "day of week", "the step 9223372036854775808 is above the field's 7 values"),
	no("0 1,,2 * * *", 5, "hour", "an empty list item"),
	no("0 ,1 * * *", 3, "hour", "an empty list item"),
	no("0 1, * * *", 5, "hour", "an empty list item"),
	no("0 , * * *", 3, "hour", "an empty list item"),

	// Never fires: the day of week starts with * or ?, so a day must match both day fields,
	// and no allowed month has the allowed days.
	no("0 0 30 2 *", 5, "day of month", "it never fires: its earliest day of month, 30, is past the end of each of its months"),
	no("0 0 31 4,6,9,11 *", 5, "day of month", "its earliest day of month, 31"),
	no("0 0 31 FEB ?", 5, "day of month", "never fires"),
	no("0 0 31 2 */1", 5, "day of month", "never fires"),
	no("0 0 30 2 */2", 5, "day of month", "never fires"),
	no("0 0 30 2 ?/3", 5, "day of month", "never fires"),
	no("0 0 0 30-31 2 *", 7, "day of month", "never fires"),
	no("0 0 31 4-11/5 *", 5, "day of month", "never fires"), // April and September

	// Descriptors, in any case, alone.
	no("@", 1, "descriptor", `unknown descriptor "@"`),
	no("@reboot", 1, "descriptor", `unknown descriptor "@reboot"`),
	no("@hourly 0", 9, "descriptor", "nothing may follow @hourly"),
	no("@every", 1, "interval", "@every takes one duration"),
	no("@every 1h 30m", 11, "interval", "@every takes one duration"),
	no("@every\u00a01h", 1, "descriptor", "unknown descriptor \"@every\u00a01h\""),
	no("@every ", 1, "interval", "@every takes one duration"),

	// @every: Go's durations, of whole seconds from 1 second to 366 days.
	no("@every 1.5s", 8, "interval", "1.5s is not a whole number of seconds"),
	no("@every 1500ms", 8, "interval", "not a whole number of seconds"),
	no("@every 0.016666666666666666h", 8, "interval", "not a whole number of seconds"), // 59.999999999s in float64
	no("@every 0.99999999999999999999m", 8, "interval", "not a whole number of seconds"),
	no("@every 0", 8, "interval", "0 is below the minimum of 1 second"),
	no("@every 0s", 8, "interval", "below the minimum of 1 second"),
	no("@every 999ms", 8, "interval", "below the minimum of 1 second"),
	no("@every 0.0000000001s", 8, "interval", "below the minimum of 1 second"),
	no("@every -1s", 8, "interval", "below the minimum of 1 second"),
	no("@every -0", 8, "interval", "below the minimum of 1 second"),
	no("@every 8784h1s", 8, "interval", "above the maximum of 366 days (8784h)"),
	no("@every 99999999999999999999h", 8, "interval", "above the maximum"),
	no("@every 367d", 11, "interval", `unknown unit "d"`),
	no("@every 1µs1x", 13, "interval", `unknown unit "x"`), // columns count bytes
	no("@every 1e3s", 9, "interval", `unknown unit "e"`),
	no("@every 10", 10, "interval", "a unit is missing"),
	no("@every 00", 10, "interval", "a unit is missing"),
	no("@every 90s0", 12, "interval", "a unit is missing"), // "0" alone is zero, not a last part
	no("@every 1.5.5s", 11, "interval", "a unit is missing"),
	no("@every 1h.5", 12, "interval", "a unit is missing"),
	no("@every .", 8, "interval", "a number is missing"),
	no("@every h", 8, "interval", "a number is missing"),
	no("@every -", 9, "interval", "a number is missing after the sign"),
}

// verdicts calls fn (pgcoord_cron_check or pgcoord_zone_check) on each of args in one
// statement, and returns for each "" when fn accepted it, else its SQLSTATE and message
// ("22023 pgcoord: ..."). The helper that catches each call's error lives in t's schema.
func verdicts(t *testing.T, pool *pgxpool.Pool, fn string, args []*string) []string {
	t.Helper()
	ctx := t.Context()
	if _, err := pool.Exec(ctx, `
		CREATE OR REPLACE FUNCTION verdict(p_fn text, p_arg text) RETURNS text LANGUAGE plpgsql AS $$
		BEGIN
		    EXECUTE format('SELECT %I($1)', p_fn) USING p_arg;
		    RETURN '';
		EXCEPTION WHEN OTHERS THEN
		    RETURN SQLSTATE || ' ' || SQLERRM;
		END
		$$`); err != nil {
		t.Fatal(err)
	}
	var out []string
	err := pool.QueryRow(ctx, `SELECT array_agg(verdict($1, a) ORDER BY i) FROM unnest($2::text[]) WITH ORDINALITY u(a, i)`,
		fn, args).Scan(&out)
	if err != nil || len(out) != len(args) {
		t.Fatalf("%s on %d arguments: %d verdicts, %v", fn, len(args), len(out), err)
	}
	return out
}

func ptrs(ss ...string) []*string {
	ps := make([]*string, len(ss))
	for i := range ss {
		ps[i] = &ss[i]
	}
	return ps
}

func TestCronCheck(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	if len(cronCases) < 80 {
		t.Fatalf("%d cases: the table lost some", len(cronCases))
	}
	exprs := make([]string, len(cronCases))
	for i, c := range cronCases {
		exprs[i] = c.expr
	}
	got := verdicts(t, pool, "pgcoord_cron_check", append(ptrs(exprs...), nil))

	for i, c := range cronCases {
		v := got[i]
		switch {
		case c.col == 0 && v != "":
			t.Errorf("%q was refused: %s", c.expr, v)
		case c.col == 0:
		case !strings.HasPrefix(v, "22023 pgcoord: bad schedule expression "):
			t.Errorf("%q: got %q, want SQLSTATE 22023 and a bad schedule expression", c.expr, v)
		case !strings.Contains(v, fmt.Sprintf(" at column %d (%s): ", c.col, c.field)) || !strings.Contains(v, c.says):
			t.Errorf("%q: got %q, want column %d (%s) and %q", c.expr, v, c.col, c.field, c.says)
		case len(c.expr) <= 255 && !strings.ContainsFunc(c.expr, isControl) && !strings.Contains(v, `"`+strings.TrimSpace(c.expr)+`"`):
			t.Errorf("%q: the message %q does not show the expression", c.expr, v)
		case (len(c.expr) > 255 || strings.ContainsFunc(c.expr, isControl)) && strings.Contains(v, c.expr):
			t.Errorf("%q: the message %q repeats an expression it must not show", c.expr, v)
		}
	}
	if v := got[len(cronCases)]; !strings.HasPrefix(v, "22004 pgcoord: schedule expression is NULL") {
		t.Errorf("NULL: got %q, want SQLSTATE 22004 naming the schedule expression", v)
	}
}

// isControl tells whether r is a character pgcoord refuses in names and expressions.
func isControl(r rune) bool {
	return r < 0x20 || r >= 0x7f && r <= 0x9f || r == 0x200e || r == 0x200f || r == 0x2028 || r == 0x2029 ||
		r >= 0x202a && r <= 0x202e || r >= 0x2066 && r <= 0x2069
}

func TestZoneCheck(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	cases := []struct{ zone, says string }{ // says is "" when the zone is accepted
		{"UTC", ""},
		{"Europe/Paris", ""},
		{"America/Argentina/Buenos_Aires", ""},
		{"Asia/Kolkata", ""},
		{"Etc/GMT+3", ""},
		{"", "must be a zone name such as Europe/Paris or UTC, got an empty string"},
		{strings.Repeat("x", 65), "must be a zone name of 1 to 64 bytes without control characters, got 65 bytes"},
		{"Europe/Paris\n", "got a control character"},
		{"/etc/localtime", `must be a zone name, not a file path, got "/etc/localtime"`},
		{"../etc/passwd", "not a file path"},
		{"Europe/../UTC", "not a file path"},
		{"localtime", `not the tz database's alias of another zone, got "localtime"`},
		{"posixrules", "alias of another zone"},
		{"Mars/Olympus", `must be a zone name PostgreSQL knows, spelled as pg_timezone_names lists it, got "Mars/Olympus"`},
		{"europe/paris", "spelled as pg_timezone_names lists it"}, // SET TimeZone would take it; Go would not
		{"UTC+3", "spelled as pg_timezone_names lists it"},        // a POSIX string, not a name
		{"<+03>-3", "spelled as pg_timezone_names lists it"},
		{"CEST", "spelled as pg_timezone_names lists it"},  // an abbreviation
		{"Local", "spelled as pg_timezone_names lists it"}, // Go's name for the machine's zone
		{"Europe/Paris ", "spelled as pg_timezone_names lists it"},
	}
	// Any name the server lists is accepted (which names it lists depends on its tz database:
	// EST5EDT is one on PostgreSQL 15 here, not on 17).
	var listed []string
	err := pool.QueryRow(t.Context(), `SELECT array_agg(name) FROM (SELECT name FROM pg_timezone_names
		WHERE name NOT IN ('localtime', 'posixrules') ORDER BY random() LIMIT 40) n`).Scan(&listed)
	if err != nil || len(listed) < 40 {
		t.Fatalf("%d zones from pg_timezone_names, %v", len(listed), err)
	}
	for _, z := range listed {
		cases = append(cases, struct{ zone, says string }{z, ""})
	}
	zones := make([]string, len(cases))
	for i, c := range cases {
		zones[i] = c.zone
	}
	got := verdicts(t, pool, "pgcoord_zone_check", append(ptrs(zones...), nil))
	for i, c := range cases {
		switch v := got[i]; {
		case c.says == "" && v != "":
			t.Errorf("zone %q was refused: %s", c.zone, v)
		case c.says != "" && !(strings.HasPrefix(v, "22023 pgcoord: schedule time zone ") && strings.Contains(v, c.says)):
			t.Errorf("zone %q: got %q, want SQLSTATE 22023 and %q", c.zone, v, c.says)
		}
	}
	if v := got[len(cases)]; !strings.HasPrefix(v, "22004 pgcoord: schedule time zone is NULL") {
		t.Errorf("NULL zone: got %q, want SQLSTATE 22004 naming the schedule time zone", v)
	}
}
