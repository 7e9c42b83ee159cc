package cronspec

import (
	"fmt"
	"slices"
	"testing"
	"time"
)

// A transition is an instant at which a zone's offset changes.
type transition struct {
	at            time.Time
	before, after time.Duration // offsets from UTC
	zone          string
	loc           *time.Location
}

func offsetAt(loc *time.Location, t time.Time) time.Duration {
	_, off := t.In(loc).Zone()
	return time.Duration(off) * time.Second
}

// transitions finds the offset changes of zone in [from, to) by sampling the offset every
// hour and bisecting each change to the second (transitions are more than an hour apart).
func transitions(t *testing.T, zone string, from, to time.Time) []transition {
	loc, err := time.LoadLocation(zone)
	if err != nil {
		t.Fatal(err)
	}
	var found []transition
	for at := from; at.Before(to); at = at.Add(time.Hour) {
		lo, hi := at, at.Add(time.Hour)
		if offsetAt(loc, lo) == offsetAt(loc, hi) {
			continue
		}
		for hi.Sub(lo) > time.Second { // offset(lo) is the old one, offset(hi) the new one
			mid := lo.Add(hi.Sub(lo) / 2)
			if offsetAt(loc, mid) == offsetAt(loc, lo) {
				lo = mid
			} else {
				hi = mid
			}
		}
		found = append(found, transition{hi.UTC(), offsetAt(loc, lo), offsetAt(loc, hi), zone, loc})
	}
	return found
}

// dstZones are the zones of the DST tests, with the transitions of 2026 and 2027 as
// published, to check the scan against.
var dstZones = map[string][]string{
	"Europe/Berlin":       {"2026-03-29T01:00:00Z", "2026-10-25T01:00:00Z", "2027-03-28T01:00:00Z", "2027-10-31T01:00:00Z"},
	"America/New_York":    {"2026-03-08T07:00:00Z", "2026-11-01T06:00:00Z", "2027-03-14T07:00:00Z", "2027-11-07T06:00:00Z"},
	"Australia/Lord_Howe": {"2026-04-04T15:00:00Z", "2026-10-03T15:30:00Z", "2027-04-03T15:00:00Z", "2027-10-02T15:30:00Z"},
}

func allTransitions(t *testing.T) []transition {
	var all []transition
	for zone, want := range dstZones {
		got := transitions(t, zone, time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(2028, 1, 1, 0, 0, 0, 0, time.UTC))
		if len(got) != len(want) {
			t.Fatalf("%s: found %d transitions in 2026-2027, want %d: %v", zone, len(got), len(want), got)
		}
		for i, tr := range got {
			if s := tr.at.Format(time.RFC3339); s != want[i] {
				t.Fatalf("%s: transition %d at %s, want %s", zone, i, s, want[i])
			}
		}
		all = append(all, got...)
	}
	return all
}

func (tr transition) String() string {
	return fmt.Sprintf("%s %s (%v → %v)", tr.zone, tr.at.Format(time.RFC3339), tr.before, tr.after)
}

// civilOf returns the wall clock of the instant i as a time in UTC.
func civilOf(loc *time.Location, i time.Time) time.Time {
	y, mo, d := i.In(loc).Date()
	h, mi, s := i.In(loc).Clock()
	return time.Date(y, mo, d, h, mi, s, 0, time.UTC)
}

// oracle lists the fire times of s in (after, upto] from the DST rules alone, walking every
// instant second by second: an instant fires if its wall clock matches and has not been
// shown before, or if the clock jumps at it over a matching wall-clock time.
func oracle(s Schedule, after, upto time.Time) []time.Time {
	var fires []time.Time
	loc := s.Location()
	start := after.Add(-3 * time.Hour) // longer than any repeated interval
	shown := civilOf(loc, start)       // the latest wall clock shown so far
	for i := start; !i.After(upto); i = i.Add(time.Second) {
		c := civilOf(loc, i)
		fire := c.After(shown) && s.spec.matches(c)
		for skipped := shown.Add(time.Second); !fire && skipped.Before(c); skipped = skipped.Add(time.Second) {
			fire = s.spec.matches(skipped)
		}
		if fire && i.After(after) {
			fires = append(fires, i)
		}
		if c.After(shown) {
			shown = c
		}
	}
	return fires
}

func mustParse(t testing.TB, expr, zone string, anchor time.Time) Schedule {
	t.Helper()
	s, err := Parse(expr, zone, anchor)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func checkIncreasing(t *testing.T, fires []time.Time) {
	t.Helper()
	for i := 1; i < len(fires); i++ {
		if !fires[i].After(fires[i-1]) {
			t.Fatalf("fire %d at %s is not after fire %d at %s", i, fires[i], i-1, fires[i-1])
		}
	}
}

// TestShiftedWallClockFiresOnce: a wall-clock time the clock skips fires once, at the
// transition instant; one the clock shows twice fires once, the first time — at the start,
// the middle and the last minute of the skipped or repeated interval alike.
func TestShiftedWallClockFiresOnce(t *testing.T) {
	for _, tr := range allTransitions(t) {
		shift := tr.after - tr.before
		shifted := tr.at.Add(min(tr.before, tr.after)) // first wall-clock time skipped or repeated, as a time in UTC
		for _, local := range []time.Time{shifted, shifted.Add(shift.Abs() / 2), shifted.Add(shift.Abs() - time.Minute)} {
			want := local.Add(-tr.before) // its first occurrence
			if shift > 0 {
				want = tr.at // it does not exist
			}
			expr := fmt.Sprintf("%d %d %d %d *", local.Minute(), local.Hour(), local.Day(), local.Month())
			s := mustParse(t, expr, tr.zone, tr.at.AddDate(0, -1, 0))
			after, upto := tr.at.Add(-24*time.Hour), tr.at.Add(24*time.Hour)
			got := s.Between(nil, after, upto, 10)
			if len(got) != 1 || !got[0].Equal(want) {
				t.Errorf("%v: %q fired at %v, want once at %s", tr, expr, got, want)
			}
			checkNext(t, s, got, after, upto)
		}
	}
}

// TestAcrossTransitions: frequent expressions across each transition fire as the rules
// say, strictly increasing, and Next from any instant gives the next of them.
func TestAcrossTransitions(t *testing.T) {
	for _, tr := range allTransitions(t) {
		after, upto := tr.at.Add(-3*time.Hour), tr.at.Add(3*time.Hour)
		repeated := max(tr.before-tr.after, 0)
		for _, c := range []struct {
			expr  string
			count int // -1: check against the oracle only
		}{
			{"* * * * *", int((6*time.Hour - repeated) / time.Minute)},
			{"0 * * * *", -1},
			{"*/5 * * * *", int((6*time.Hour - repeated) / (5 * time.Minute))},
			{"30 15,45 * * * *", -1},
			{"0 0-3 * * *", -1},
		} {
			s := mustParse(t, c.expr, tr.zone, tr.at.AddDate(0, -1, 0))
			got := s.Between(nil, after, upto, 1000)
			checkIncreasing(t, got)
			want := oracle(s, after, upto)
			if !slices.EqualFunc(got, want, time.Time.Equal) {
				t.Errorf("%v: %q fired at\n%v\nwant\n%v", tr, c.expr, got, want)
				continue
			}
			if c.count >= 0 && len(got) != c.count {
				t.Errorf("%v: %q fired %d times, want %d", tr, c.expr, len(got), c.count)
			}
			checkNext(t, s, got, after, upto)
		}
	}
}

// checkNext checks Next against fires, the fire times in (after, upto]: from instants in
// steps, and from just before, at and just after each fire time and the transition.
func checkNext(t *testing.T, s Schedule, fires []time.Time, after, upto time.Time) {
	t.Helper()
	var probes []time.Time
	for at := after; at.Before(upto); at = at.Add(97 * time.Second) {
		probes = append(probes, at)
	}
	for _, f := range fires {
		for _, d := range []time.Duration{-time.Second, -time.Millisecond, -time.Nanosecond, 0, time.Nanosecond, time.Second} {
			probes = append(probes, f.Add(d))
		}
	}
	for _, at := range probes {
		if !at.After(after) || !at.Before(upto) {
			continue
		}
		var want time.Time
		for _, f := range fires {
			if f.After(at) {
				want = f
				break
			}
		}
		if next := s.Next(at); !want.IsZero() && !next.Equal(want) {
			t.Errorf("%s: Next(%s) = %s, want %s", s, at, next, want)
		}
	}
}

// TestHourlyCounts: an hourly expression fires once per wall-clock hour shown, so 23 times
// on a day with a one-hour gap and 24 on one with a repeated hour; at Lord Howe, whose
// clocks move 30 minutes, 24 either way.
func TestHourlyCounts(t *testing.T) {
	for _, tr := range allTransitions(t) {
		day := tr.at.In(tr.loc)
		start := time.Date(day.Year(), day.Month(), day.Day(), 0, 0, 0, 0, time.UTC).Add(-tr.before) // local midnight
		s := mustParse(t, "0 * * * *", tr.zone, start)
		got := s.Between(nil, start.Add(-time.Second), start.Add(24*time.Hour+tr.before-tr.after-time.Second), 100)
		want := 24
		if tr.after-tr.before == time.Hour {
			want = 23
		}
		if len(got) != want {
			t.Errorf("%v: hourly fired %d times on the day, want %d: %v", tr, len(got), want, got)
		}
	}
}

// TestEveryIsElapsedTime: @every 1h ticks exactly 3600 s apart across every transition.
func TestEveryIsElapsedTime(t *testing.T) {
	for _, tr := range allTransitions(t) {
		anchor := tr.at.Add(-5*time.Hour - 17*time.Minute)
		s := mustParse(t, "@every 1h", tr.zone, anchor)
		got := s.Between(nil, tr.at.Add(-3*time.Hour), tr.at.Add(3*time.Hour), 100)
		if len(got) != 6 {
			t.Fatalf("%v: %d ticks in 6 hours, want 6", tr, len(got))
		}
		for i, g := range got {
			if d := g.Sub(anchor); d%time.Hour != 0 {
				t.Errorf("%v: tick %s is %v after the anchor", tr, g, d)
			}
			if i > 0 && g.Sub(got[i-1]) != time.Hour {
				t.Errorf("%v: ticks %s and %s are not 3600 s apart", tr, got[i-1], g)
			}
		}
	}
}
