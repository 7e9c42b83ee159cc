package cronspec

import "time"

// Next returns the first fire time strictly after t, in whole seconds and in UTC, or the
// zero time if the schedule does not fire within five years after t.
func (s Schedule) Next(t time.Time) time.Time {
	if s.loc == nil {
		return time.Time{}
	}
	i, ok := s.next(t.Unix()+1, fiveYears(t))
	if !ok {
		return time.Time{}
	}
	return time.Unix(i, 0).UTC()
}

// Between appends to dst the fire times in (after, upto], at most max of them (none if max
// <= 0), and returns it. Like a chain of Next, it stops at a gap of more than five years.
func (s Schedule) Between(dst []time.Time, after, upto time.Time, max int) []time.Time {
	for ; max > 0; max-- {
		next := s.Next(after)
		if next.IsZero() || next.After(upto) {
			break
		}
		dst = append(dst, next)
		after = next
	}
	return dst
}

// Interval returns the @every duration and true, or 0 and false for calendar expressions.
func (s Schedule) Interval() (time.Duration, bool) {
	return time.Duration(s.every) * time.Second, s.every > 0
}

// Location returns the schedule's zone (nil for the zero Schedule).
func (s Schedule) Location() *time.Location { return s.loc }

// String returns the expression as given to Parse, trimmed of surrounding white space.
func (s Schedule) String() string { return s.expr }

// fiveYears returns the last Unix second within five years after t.
func fiveYears(t time.Time) int64 { return t.UTC().AddDate(horizon, 0, 0).Unix() }

// next returns the first fire time in [from, last], in Unix seconds.
func (s Schedule) next(from, last int64) (int64, bool) {
	if s.every > 0 {
		i := s.anchor
		if from > i {
			i += (from - i + s.every - 1) / s.every * s.every
		}
		return i, i <= last
	}
	for c := firstLocal(s.loc, from); ; {
		civil, ok := s.spec.next(c, last+maxOffset)
		if !ok {
			return 0, false
		}
		switch i := resolve(s.loc, civil); {
		case i > last:
			return 0, false
		case i >= from:
			return i, true
		}
		c = civil + 1 // only in zones whose gaps and overlaps intersect
	}
}
