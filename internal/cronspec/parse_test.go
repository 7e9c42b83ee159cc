package cronspec

import (
	"errors"
	"strings"
	"testing"
	"time"
)

var jan1 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC) // a Thursday

func TestParseErrors(t *testing.T) {
	for _, c := range []struct {
		expr, field string
		column      int
		msg         string
	}{
		{"61 0 * * *", "minute", 1, "61 is above the maximum 59"},
		{"0 24 * * *", "hour", 3, "24 is above the maximum 23"},
		{"0 0 0 * *", "day of month", 5, "0 is below the minimum 1"},
		{"0 0 1-5,40 * *", "day of month", 9, "40 is above the maximum 31"},
		{"0 0 * 13 *", "month", 7, "13 is above the maximum 12"},
		{"0 0 * JANUARY *", "month", 7, `"JANUARY" is not a number or a month name (JAN-DEC)`},
		{"0 0 * * 7", "day of week", 9, "7 is above the maximum 6 (Sunday is 0 or SUN)"},
		{"0 0 * * MON-FOO", "day of week", 13, `"FOO" is not a number or a day name (SUN-SAT)`},
		{"60 0 0 * * *", "second", 1, "60 is above the maximum 59"},
		{"0 60 0 * * *", "minute", 3, "60 is above the maximum 59"},
		{"0 0 0 * * 8", "day of week", 11, "8 is above the maximum 6"},
		{"99999999999999999999 * * * *", "minute", 1, "is above the maximum 59"},
		{"*/0 * * * *", "minute", 3, "step 0 must be at least 1"},
		{"*/61 * * * *", "minute", 3, "step 61 is above the field's 60 values"},
		{"1/2/3 * * * *", "minute", 4, "too many /"},
		{"0 0 1 dec-feb *", "month", 7, "range dec-feb runs backwards (ranges do not wrap around)"},
		{"*/ * * * *", "minute", 3, "missing step"},
		{"*/x * * * *", "minute", 3, `step "x" is not a number`},
		{"5-1 * * * *", "minute", 1, "range 5-1 runs backwards"},
		{"1-2-3 * * * *", "minute", 4, "too many -"},
		{"0 0 *-5 * *", "day of month", 5, "* cannot be part of a range"},
		{"1,,2 * * * *", "minute", 3, "empty list element"},
		{"0 0 1, * *", "day of month", 7, "empty list element"},
		{"- * * * *", "minute", 1, "missing value"},
		{"+5 * * * *", "minute", 1, "unexpected character '+'"},
		{"0 0 * * 1#2", "day of week", 10, "# (nth weekday of the month) is not supported"},
		{"0 0 L * *", "day of month", 5, "L and W (last day, nearest weekday) are not supported"},
		{"0 0 15W * *", "day of month", 5, "L and W"},
		{"0 0 LW * *", "day of month", 5, "L and W"},
		{"0 0 * * 5L", "day of week", 9, "L and W"},
		{"0 0 * *", "expression", 1, "expected 5 fields (or 6 with seconds first), found 4"},
		{"0 0 * * * * *", "expression", 13, "found 7"},
		{"", "expression", 1, "the expression is empty"},
		{" \t ", "expression", 1, "the expression is empty"},
		{strings.Repeat("1,", 127) + "1 * * * *", "expression", 256, "longer than 255 bytes"},
		{"0 0 *\t* *", "expression", 6, "control character U+0009"},
		{"0 0 * * *\x00", "expression", 10, "control character U+0000"},
		{"CRON_TZ=Europe/Berlin 0 9 * * *", "expression", 1, "the zone is a separate setting"},
		{"TZ=UTC 0 9 * * *", "expression", 1, "the zone is a separate setting"},
		{"cron_tz=UTC 0 9 * * *", "expression", 1, "the zone is a separate setting"},
		{"@reboot", "descriptor", 1, "unknown descriptor @reboot"},
		{"@daily 5", "descriptor", 8, "@daily takes nothing after it"},
		{"@every", "interval", 1, "@every needs a duration"},
		{"@every 1h 2m", "interval", 11, "@every takes one duration"},
		{"@every soon", "interval", 8, `"soon" is not a duration`},
		{"@every 500ms", "interval", 8, "500ms is shorter than 1s"},
		{"@every -1h", "interval", 8, "-1h is shorter than 1s"},
		{"@every 1500ms", "interval", 8, "1500ms is not a whole number of seconds"},
		{"@every 8785h", "interval", 8, "8785h is longer than 366 days"},
		{"0 0 30 2 *", "expression", 1, "it does not fire within five years"},
		{"0 0 31 4,6,9,11 *", "expression", 1, "it does not fire within five years"},
	} {
		_, err := Parse(c.expr, "Europe/Berlin", jan1)
		var pe *ParseError
		if !errors.As(err, &pe) {
			t.Errorf("%q: error %v, want a *ParseError", c.expr, err)
			continue
		}
		if pe.Field != c.field || pe.Column != c.column || !strings.Contains(pe.Msg, c.msg) {
			t.Errorf("%q: got field %q column %d msg %q, want %q %d %q", c.expr, pe.Field, pe.Column, pe.Msg, c.field, c.column, c.msg)
		}
		if !strings.HasPrefix(err.Error(), "schedules: bad expression ") {
			t.Errorf("%q: error %q", c.expr, err)
		}
	}
}

func TestParseErrorText(t *testing.T) {
	_, err := Parse("  61 0 * * *  ", "UTC", jan1)
	if want := `schedules: bad expression "61 0 * * *" at column 1 (minute): 61 is above the maximum 59`; err == nil || err.Error() != want {
		t.Errorf("got %v, want %s", err, want)
	}
	_, err = Parse(strings.Repeat("1,", 200)+"1 * * * *", "UTC", jan1)
	if err == nil || len(err.Error()) > 200 {
		t.Errorf("the error of a long expression is %d bytes: %v", len(err.Error()), err)
	}
}

func TestZones(t *testing.T) {
	for _, zone := range []string{"", "Mars/Olympus", "europe/berlin ", "Local", "/etc/localtime", "../../etc/passwd", "Europe/../UTC", strings.Repeat("Europe/", 10)} {
		_, err := Parse("0 * * * *", zone, jan1)
		if !errors.Is(err, ErrUnknownZone) || !strings.HasPrefix(err.Error(), "schedules: unknown time zone") {
			t.Errorf("zone %q: error %v, want ErrUnknownZone", zone, err)
		}
	}
	for _, zone := range []string{"UTC", "Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "Asia/Kolkata"} {
		s, err := Parse("0 * * * *", zone, jan1)
		if err != nil || s.Location().String() != zone {
			t.Errorf("zone %q: %v, location %v", zone, err, s.Location())
		}
	}
}

// TestFireTimes checks the accepted syntax by the first fire times after 2026-01-01 00:00 UTC.
func TestFireTimes(t *testing.T) {
	for _, c := range []struct {
		expr, zone string
		want       []string
	}{
		{"*/15 * * * *", "UTC", []string{"2026-01-01T00:15:00Z", "2026-01-01T00:30:00Z", "2026-01-01T00:45:00Z"}},
		{"5/20 * * * *", "UTC", []string{"2026-01-01T00:05:00Z", "2026-01-01T00:25:00Z", "2026-01-01T00:45:00Z"}},
		{"10-50/20 9 * * *", "UTC", []string{"2026-01-01T09:10:00Z", "2026-01-01T09:30:00Z", "2026-01-01T09:50:00Z"}},
		{"  0   9  * *   MON-FRI ", "UTC", []string{"2026-01-01T09:00:00Z", "2026-01-02T09:00:00Z", "2026-01-05T09:00:00Z"}},
		{"0 12 * * sun", "UTC", []string{"2026-01-04T12:00:00Z", "2026-01-11T12:00:00Z", "2026-01-18T12:00:00Z"}},
		{"0 0 1 JAN,jul ?", "UTC", []string{"2026-07-01T00:00:00Z", "2027-01-01T00:00:00Z", "2027-07-01T00:00:00Z"}},
		{"0 0 1 feb-apr,DEC *", "UTC", []string{"2026-02-01T00:00:00Z", "2026-03-01T00:00:00Z", "2026-04-01T00:00:00Z", "2026-12-01T00:00:00Z"}},
		// Seconds first, when there are six fields.
		{"30 * * * * *", "UTC", []string{"2026-01-01T00:00:30Z", "2026-01-01T00:01:30Z", "2026-01-01T00:02:30Z"}},
		{"*/20 30 9 * * *", "UTC", []string{"2026-01-01T09:30:00Z", "2026-01-01T09:30:20Z", "2026-01-01T09:30:40Z"}},
		{"15 0 0 1 1 *", "UTC", []string{"2026-01-01T00:00:15Z", "2027-01-01T00:00:15Z", "2028-01-01T00:00:15Z"}},
		// Vixie: both day fields restricted, either matches; one starting with *, both must.
		{"0 0 1,15 * MON", "UTC", []string{"2026-01-05T00:00:00Z", "2026-01-12T00:00:00Z", "2026-01-15T00:00:00Z", "2026-01-19T00:00:00Z", "2026-01-26T00:00:00Z", "2026-02-01T00:00:00Z"}},
		{"0 0 13 * FRI", "UTC", []string{"2026-01-02T00:00:00Z", "2026-01-09T00:00:00Z", "2026-01-13T00:00:00Z"}},
		{"0 0 */2 * MON", "UTC", []string{"2026-01-05T00:00:00Z", "2026-01-19T00:00:00Z", "2026-02-09T00:00:00Z"}},
		{"0 0 1-31 * MON", "UTC", []string{"2026-01-02T00:00:00Z", "2026-01-03T00:00:00Z", "2026-01-04T00:00:00Z"}},
		{"0 0 13 * */3", "UTC", []string{"2026-05-13T00:00:00Z", "2026-06-13T00:00:00Z", "2026-09-13T00:00:00Z"}}, // 13ths on Sun, Wed or Sat
		{"0 0 ? * 1", "UTC", []string{"2026-01-05T00:00:00Z", "2026-01-12T00:00:00Z", "2026-01-19T00:00:00Z"}},
		// Descriptors.
		{"@hourly", "UTC", []string{"2026-01-01T01:00:00Z", "2026-01-01T02:00:00Z", "2026-01-01T03:00:00Z"}},
		{"@daily", "Europe/Berlin", []string{"2026-01-01T23:00:00Z", "2026-01-02T23:00:00Z", "2026-01-03T23:00:00Z"}},
		{"@Midnight", "UTC", []string{"2026-01-02T00:00:00Z", "2026-01-03T00:00:00Z", "2026-01-04T00:00:00Z"}},
		{"@weekly", "UTC", []string{"2026-01-04T00:00:00Z", "2026-01-11T00:00:00Z", "2026-01-18T00:00:00Z"}},
		{"@monthly", "America/New_York", []string{"2026-01-01T05:00:00Z", "2026-02-01T05:00:00Z", "2026-03-01T05:00:00Z"}},
		{"@yearly", "UTC", []string{"2027-01-01T00:00:00Z", "2028-01-01T00:00:00Z", "2029-01-01T00:00:00Z"}},
		{"@ANNUALLY", "UTC", []string{"2027-01-01T00:00:00Z", "2028-01-01T00:00:00Z", "2029-01-01T00:00:00Z"}},
		// Leap day: leap years only; the chain of Next crosses the four-year gaps.
		{"0 0 29 2 *", "UTC", []string{"2028-02-29T00:00:00Z", "2032-02-29T00:00:00Z", "2036-02-29T00:00:00Z"}},
		{"0 0 29 FEB *", "Europe/Berlin", []string{"2028-02-28T23:00:00Z", "2032-02-28T23:00:00Z", "2036-02-28T23:00:00Z"}},
	} {
		s := mustParse(t, c.expr, c.zone, jan1)
		got := s.Between(nil, jan1, jan1.AddDate(20, 0, 0), len(c.want))
		var text []string
		for _, g := range got {
			text = append(text, g.Format(time.RFC3339))
		}
		if strings.Join(text, " ") != strings.Join(c.want, " ") {
			t.Errorf("%q in %s: got %v, want %v", c.expr, c.zone, text, c.want)
		}
		if s.String() != strings.TrimSpace(c.expr) {
			t.Errorf("String() = %q", s.String())
		}
		if _, ok := s.Interval(); ok {
			t.Errorf("%q: Interval says @every", c.expr)
		}
	}
}

func TestFiveYears(t *testing.T) {
	leap := mustParse(t, "0 0 29 2 *", "UTC", jan1)
	// 2100 is no leap year: eight years from 2096 to 2104 read as "does not fire again".
	if next := leap.Next(time.Date(2096, 3, 1, 0, 0, 0, 0, time.UTC)); !next.IsZero() {
		t.Errorf("Next after 29 Feb 2096 = %s, want zero (2104 is more than five years away)", next)
	}
	if _, err := Parse("0 0 29 2 *", "UTC", time.Date(2097, 1, 1, 0, 0, 0, 0, time.UTC)); err == nil {
		t.Error("Parse accepted 0 0 29 2 * with an anchor in 2097 (no 29 February within five years)")
	}
	// Exactly five years is within five years.
	s := mustParse(t, "0 0 1 1 *", "UTC", jan1)
	if next := s.Next(time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)); !next.Equal(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)) {
		t.Errorf("Next = %s", next)
	}
	rare := mustParse(t, "0 0 1 1 * ", "UTC", jan1)
	if got := rare.Between(nil, jan1, jan1.AddDate(3, 0, 0), 10); len(got) != 3 {
		t.Errorf("yearly over three years: %v", got)
	}
}

func TestEveryAnchor(t *testing.T) {
	anchor := time.Date(2026, 5, 1, 10, 0, 0, 700_000_000, time.UTC) // truncated to 10:00:00
	at := func(h, m, s, ns int) time.Time { return time.Date(2026, 5, 1, h, m, s, ns, time.UTC) }
	s := mustParse(t, "@every 1h", "Europe/Berlin", anchor)
	if d, ok := s.Interval(); d != time.Hour || !ok {
		t.Errorf("Interval() = %v, %v", d, ok)
	}
	for _, c := range []struct{ t, want time.Time }{
		{at(0, 0, 0, 0), at(10, 0, 0, 0)},              // before the anchor: the anchor
		{at(9, 59, 59, 999_999_999), at(10, 0, 0, 0)},  // just before it
		{at(10, 0, 0, 0), at(11, 0, 0, 0)},             // at it: strictly after
		{at(10, 0, 0, 500), at(11, 0, 0, 0)},           // in its second
		{at(10, 59, 59, 999_999_999), at(11, 0, 0, 0)}, // just before a tick
		{at(11, 0, 0, 0), at(12, 0, 0, 0)},             // at a tick
		{at(23, 30, 0, 0), time.Date(2026, 5, 2, 0, 0, 0, 0, time.UTC)},
	} {
		if got := s.Next(c.t); !got.Equal(c.want) {
			t.Errorf("Next(%s) = %s, want %s", c.t, got, c.want)
		}
	}
	odd := mustParse(t, "@every 1h30m17s", "UTC", anchor)
	got := odd.Between(nil, anchor.AddDate(1, 0, 0), anchor.AddDate(1, 0, 1), 100)
	if len(got) == 0 {
		t.Fatal("no ticks")
	}
	for _, g := range got {
		if d := g.Sub(at(10, 0, 0, 0)); d%(90*time.Minute+17*time.Second) != 0 {
			t.Errorf("tick %s is %v after the anchor", g, d)
		}
	}
	far := mustParse(t, "@every 8784h", "UTC", anchor.AddDate(6, 0, 0))
	if next := far.Next(anchor); !next.IsZero() {
		t.Errorf("an anchor six years ahead: Next = %s, want zero", next)
	}
}

func TestBetween(t *testing.T) {
	s := mustParse(t, "0 * * * *", "UTC", jan1)
	upto := jan1.Add(3 * time.Hour)
	for _, c := range []struct {
		max  int
		want int
	}{{-1, 0}, {0, 0}, {2, 2}, {3, 3}, {100, 3}} {
		if got := s.Between(nil, jan1, upto, c.max); len(got) != c.want {
			t.Errorf("max %d: %d fire times, want %d", c.max, len(got), c.want)
		}
	}
	dst := s.Between([]time.Time{jan1}, jan1, upto, 10) // appends; (after, upto]
	if len(dst) != 4 || !dst[0].Equal(jan1) || !dst[3].Equal(upto) {
		t.Errorf("Between appended %v", dst)
	}
}

func TestZeroSchedule(t *testing.T) {
	var s Schedule
	if !s.Next(jan1).IsZero() || len(s.Between(nil, jan1, jan1.AddDate(1, 0, 0), 10)) != 0 || s.Location() != nil {
		t.Error("the zero Schedule fires")
	}
}
