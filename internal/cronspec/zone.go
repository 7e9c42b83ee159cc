package cronspec

import (
	"math"
	"time"
)

// Wall-clock ("civil") times are counted in seconds since 1970-01-01 00:00 on the wall clock,
// instants in Unix seconds. The zone's offsets are read from its periods (time.ZoneBounds),
// never from time.Date, whose choice inside a gap or an overlap is not guaranteed.

// A period is a stretch of instants [start, end) with one UTC offset, all in seconds.
type period struct {
	start, end, off int64
}

// periodAt returns the period of loc that contains the instant sec.
func periodAt(loc *time.Location, sec int64) period {
	t := time.Unix(sec, 0).In(loc)
	_, off := t.Zone()
	p := period{start: math.MinInt64, end: math.MaxInt64, off: int64(off)}
	start, end := t.ZoneBounds()
	if !start.IsZero() {
		p.start = start.Unix()
	}
	if !end.IsZero() {
		p.end = end.Unix()
	}
	return p
}

// maxOffset bounds any zone's distance from UTC (the largest ever was under 16 hours).
const maxOffset = 26 * 3600

// resolve returns the instant at which the wall-clock time civil fires: its first
// occurrence, or, if the clock skips it, the transition instant that ends the gap.
func resolve(loc *time.Location, civil int64) int64 {
	p := periodAt(loc, civil-maxOffset)
	for {
		if i := civil - p.off; p.start <= i && i < p.end {
			return i // periods come in order, so this is the first occurrence
		}
		if p.end > civil+maxOffset {
			return civil - p.off // not reached: civil exists or falls in a gap nearer
		}
		q := periodAt(loc, p.end)
		if q.end <= p.end {
			return civil - p.off // not reached: a period that does not move on
		}
		if p.end+p.off <= civil && civil < p.end+q.off {
			return p.end // the clock jumps over civil at p.end
		}
		p = q
	}
}

// firstLocal returns a wall-clock time c such that every earlier wall-clock time fires
// before the instant u: normally the wall clock at u, but the start of the gap if u ends one,
// and the end of the repeated interval if u lies in its second pass (whose times fire in the
// first).
func firstLocal(loc *time.Location, u int64) int64 {
	p := periodAt(loc, u-1)
	c := u + p.off // the wall clock one second after u-1
	if p.start != math.MinInt64 {
		if end := p.start + periodAt(loc, p.start-1).off; c < end {
			c = end // u-1 is in the second pass of a repeated interval that ends at end
		}
	}
	return c
}
