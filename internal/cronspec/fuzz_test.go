package cronspec

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/robfig/cron/v3"
)

// fuzzZones have gaps and overlaps of many kinds: 30-minute shifts (Lord Howe), shifts at
// midnight (Santiago), negative DST (Casablanca), a skipped day (Apia), odd offsets
// (Chatham, St Johns, Kathmandu).
var fuzzZones = []string{"UTC", "Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "America/Santiago",
	"Africa/Casablanca", "Pacific/Apia", "Pacific/Chatham", "America/St_Johns", "Asia/Kathmandu"}

// fuzzSeeds are expressions of the kinds a cron parser's tests use, good and bad.
var fuzzSeeds = []string{
	"* * * * *", "0 * * * *", "*/5 * * * *", "0 0 * * *", "30 2 * * *", "0 3 * * *", "0 2 * * 0",
	"15 1,2,3 * * *", "0-59/7 * * * *", "5/15 1-4 * * *", "0 0 1 * *", "0 0 1 1 *", "0 12 * * MON-FRI",
	"0 0 1,15 * MON", "0 0 */2 * MON", "0 0 13 * FRI", "0 0 ? * SUN", "0 0 L * *", "0 0 * * 5#3",
	"0 0 29 2 *", "0 0 30 2 *", "0 0 31 * *", "59 23 31 12 *", "0 0 * JAN,jul *", "* * * * * *",
	"*/10 * * * * *", "30 0 0 * * *", "0 30 1 * * SAT", "1-59/2 0 0 1 * *", "@yearly", "@annually",
	"@monthly", "@weekly", "@daily", "@midnight", "@hourly", "@every 1s", "@every 90m", "@every 1h30m15s",
	"@every 8784h", "@every 0s", "@every 1.5s", "@reboot", "CRON_TZ=UTC * * * * *", "TZ=Asia/Tokyo 0 * * * *",
	"", " ", "61 * * * *", "* 24 * * *", "* * 32 * *", "* * * 13 *", "* * * * 7", "*/0 * * * *", "1-2-3 * * * *",
	"1,,2 * * * *", "*-5 * * * *", "5-1 * * * *", "0 0 * *", "0 0 * * * * *", "\t0 0 * * *", "0\x000 * * *",
	"0 0 1-31 * 1-5", "0 0 */31 2 MON", "0 0 1 */3 *", "0 9-17/2 * * 1-5", "0 0 0 ? * ?",
}

func FuzzParse(f *testing.F) {
	for i, expr := range fuzzSeeds {
		f.Add(expr, uint8(0), int64(i)*123456789012345) // UTC, where robfig checks
		f.Add(expr, uint8(i), int64(i)*987654321098765)
	}
	f.Fuzz(func(t *testing.T, expr string, zoneIndex uint8, seed int64) {
		zone := fuzzZones[int(zoneIndex)%len(fuzzZones)]
		// Instants between 1970 and 2096, to the nanosecond.
		span := int64(126 * 365 * 24 * time.Hour)
		at := time.Unix(0, 0).Add(time.Duration((seed%span + span) % span))
		anchor := time.Unix(0, 0).Add(time.Duration(((seed*7919)%span + span) % span))
		if seed%2 == 0 { // up to two hours before the zone's next transition
			loc, _ := time.LoadLocation(zone)
			if _, end := at.In(loc).ZoneBounds(); !end.IsZero() {
				at = end.Add(-time.Duration(seed / 2 % int64(2*time.Hour)).Abs())
			}
		}
		s, err := Parse(expr, zone, anchor)
		if err != nil {
			var pe *ParseError
			if !errors.As(err, &pe) || !strings.HasPrefix(err.Error(), "schedules: ") ||
				pe.Column < 1 || pe.Column > len(pe.Expr)+1 || pe.Field == "" {
				t.Fatalf("Parse(%q): bad error %#v: %v", expr, err, err)
			}
			if pe.Field == "expression" && !wholeExpressionProblem(pe.Msg) {
				t.Fatalf("Parse(%q): robfig refused what the field checks passed: %v", expr, err)
			}
			return
		}
		checkFireTimes(t, s, at)
	})
}

// wholeExpressionProblem reports whether msg is one of cronspec's own messages about the
// whole expression (not robfig's, which Parse passes on only if its field checks missed one).
func wholeExpressionProblem(msg string) bool {
	for _, prefix := range []string{"the expression is", "control character", "a CRON_TZ=", "expected 5 fields", "it does not fire"} {
		if strings.HasPrefix(msg, prefix) {
			return true
		}
	}
	return false
}

func checkFireTimes(t *testing.T, s Schedule, at time.Time) {
	next := s.Next(at)
	if next.IsZero() {
		return // fine: nothing within five years of at
	}
	if !next.After(at) || next.Nanosecond() != 0 || next.Location() != time.UTC || next.Unix() > fiveYears(at) {
		t.Fatalf("%q: Next(%s) = %s", s, at, next)
	}
	if after := s.Next(next); !after.IsZero() && !after.After(next) {
		t.Fatalf("%q: Next(%s) = %s, not after it", s, next, after)
	}
	if every, ok := s.Interval(); ok {
		if d := next.Sub(time.Unix(s.anchor, 0)); d < 0 || d%every != 0 {
			t.Fatalf("%q: tick %s is %v after the anchor", s, next, d)
		}
	} else {
		checkLocal(t, s, next)
		checkRobfig(t, s, at, next)
	}
	upto := at.AddDate(0, 0, 3)
	fires := s.Between(nil, at, upto, 5)
	prev := at
	for _, f := range fires {
		if n := s.Next(prev); !n.Equal(f) {
			t.Fatalf("%q: Between gave %s after %s, Next %s", s, f, prev, n)
		}
		prev = f
	}
	if n := s.Next(prev); len(fires) < 5 && !n.IsZero() && !n.After(upto) {
		t.Fatalf("%q: Between stopped at %s before %s", s, prev, n)
	}
}

// checkLocal checks that the wall clock at fire time f matches, unless the clock jumps
// forward at f (then f stands for a skipped wall-clock time), and that f is not in the
// second pass of a repeated interval.
func checkLocal(t *testing.T, s Schedule, f time.Time) {
	_, before := f.Add(-time.Second).In(s.loc).Zone()
	_, now := f.In(s.loc).Zone()
	if !s.spec.matches(civilOf(s.loc, f)) && now <= before {
		t.Fatalf("%q in %s: fire time %s (%s local) does not match and is no gap transition", s, s.loc, f, f.In(s.loc))
	}
	if start, _ := f.In(s.loc).ZoneBounds(); !start.IsZero() {
		_, earlier := start.Add(-time.Second).In(s.loc).Zone()
		if repeated := time.Duration(earlier-now) * time.Second; f.Sub(start) < repeated {
			t.Fatalf("%q in %s: fire time %s (%s local) is in the second pass of a repeated interval", s, s.loc, f, f.In(s.loc))
		}
	}
}

// checkRobfig compares with robfig's own Next in UTC, where daylight saving does not get in
// its way, when robfig reads the day fields as cronspec does (it does not for */n).
func checkRobfig(t *testing.T, s Schedule, at, next time.Time) {
	if s.loc != time.UTC {
		return
	}
	parsed, err := parser.Parse(strings.Join(strings.Fields(strings.ToLower(s.expr)), " "))
	if err != nil {
		t.Fatalf("%q: robfig refuses what cronspec accepts: %v", s, err)
	}
	rs := parsed.(*cron.SpecSchedule)
	if (rs.Dom&starBit != 0) != s.spec.domStar || (rs.Dow&starBit != 0) != s.spec.dowStar {
		return
	}
	rs.Location = time.UTC
	if want := rs.Next(at.UTC()); !want.Equal(next) {
		t.Fatalf("%q: Next(%s) = %s, robfig says %s", s, at, next, want)
	}
}
