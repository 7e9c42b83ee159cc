package cronspec

import (
	"math/bits"
	"time"

	"github.com/robfig/cron/v3"
)

// starBit is the bit robfig/cron sets in a field that is a plain *.
const starBit = 1 << 63

// spec is a calendar expression as bit sets over wall-clock fields (bit n set: value n
// matches), plus whether each day field is unrestricted, for the Vixie day rule.
type spec struct {
	second, minute, hour, dom, month, dow bitset
	domStar, dowStar                      bool
}

func newSpec(s *cron.SpecSchedule, domStar, dowStar bool) spec {
	b := func(set uint64) bitset { return bitset(set &^ starBit) }
	return spec{b(s.Second), b(s.Minute), b(s.Hour), b(s.Dom), b(s.Month), b(s.Dow), domStar, dowStar}
}

// next returns the first wall-clock time at or after c that matches, as seconds since
// 1970-01-01 00:00 on the wall clock, or false if there is none up to max. It works on
// civil time (time.Time in UTC, where every day has 24 hours), jumping to the next matching
// month, day, hour, minute and second in turn.
func (sp spec) next(c, max int64) (int64, bool) {
	t := time.Unix(c, 0).UTC()
	for t.Unix() <= max {
		y, mo, d := t.Date()
		h, mi, s := t.Clock()
		switch {
		case !sp.month.has(int(mo)):
			t = time.Date(y, time.Month(nextBit(sp.month, int(mo), 12)), 1, 0, 0, 0, 0, time.UTC)
		case !sp.dayMatches(t):
			t = time.Date(y, mo, d+1, 0, 0, 0, 0, time.UTC)
		case !sp.hour.has(h):
			t = time.Date(y, mo, d, nextBit(sp.hour, h, 23), 0, 0, 0, time.UTC)
		case !sp.minute.has(mi):
			t = time.Date(y, mo, d, h, nextBit(sp.minute, mi, 59), 0, 0, time.UTC)
		case !sp.second.has(s):
			t = time.Date(y, mo, d, h, mi, nextBit(sp.second, s, 59), 0, time.UTC)
		default:
			return t.Unix(), true
		}
	}
	return 0, false
}

// matches reports whether the wall-clock time t (in UTC as civil time) matches.
func (sp spec) matches(t time.Time) bool {
	h, mi, s := t.Clock()
	return sp.month.has(int(t.Month())) && sp.dayMatches(t) && sp.hour.has(h) && sp.minute.has(mi) && sp.second.has(s)
}

// dayMatches applies Vixie cron's rule: when both day fields are restricted, a day matches
// either; otherwise it must match both (an unrestricted * matches every day).
func (sp spec) dayMatches(t time.Time) bool {
	dom, dow := sp.dom.has(t.Day()), sp.dow.has(int(t.Weekday()))
	if sp.domStar || sp.dowStar {
		return dom && dow
	}
	return dom || dow
}

// A bitset holds the values of a field: bit n set means value n matches.
type bitset uint64

// has reports whether value n matches.
func (b bitset) has(n int) bool { return b&(1<<n) != 0 }

// nextBit returns the lowest set bit of set above from, or last+1 if there is none up to
// last; time.Date carries last+1 into the next larger unit.
func nextBit(set bitset, from, last int) int {
	if n := from + bits.TrailingZeros64(uint64(set>>from)); n <= last {
		return n
	}
	return last + 1
}
