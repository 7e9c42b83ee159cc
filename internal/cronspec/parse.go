package cronspec

import (
	"fmt"
	"strings"
	"time"
	"unicode"

	"github.com/robfig/cron/v3"

	_ "time/tzdata" // zones resolve in a bare container too
)

// Bounds of what Parse accepts.
const (
	maxExprLen = 255
	maxZoneLen = 64
	maxEvery   = 366 * 24 * time.Hour
	horizon    = 5 // years: Next looks this far ahead, and Parse wants a fire time this close
)

// parser is robfig/cron's, configured for 5 fields, an optional leading seconds field, and
// descriptors. Only its bit fields are used, never its Next.
var parser = cron.NewParser(cron.SecondOptional | cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

// Schedule is a parsed expression bound to a zone and an anchor. The zero Schedule never
// fires. A Schedule is a small value, safe for concurrent use.
type Schedule struct {
	expr   string
	loc    *time.Location
	every  int64 // seconds between @every ticks; 0 for calendar expressions
	anchor int64 // Unix seconds of the first @every tick
	spec   spec
}

// Parse parses expr (see the package doc for the syntax) for the IANA zone, such as
// "Europe/Berlin" or "UTC". The anchor, truncated to the second, is the first tick of an
// @every schedule, which ticks at anchor + k·d for integers k ≥ 0; a calendar expression
// must fire within five years from the anchor.
//
// Parse returns a *ParseError for a bad expression: empty, longer than 255 bytes, with a
// control character, a CRON_TZ= or TZ= prefix, a bad field, descriptor or interval, or one
// that does not fire within five years from the anchor (0 0 30 2 * never does). It returns
// an error wrapping ErrUnknownZone for a zone it cannot use.
func Parse(expr, zone string, anchor time.Time) (Schedule, error) {
	s := Schedule{expr: strings.TrimSpace(expr), anchor: anchor.Unix()}
	if p := s.parse(); p != nil {
		return Schedule{}, s.fail(p)
	}
	loc, err := loadZone(zone)
	if err != nil {
		return Schedule{}, err
	}
	s.loc = loc
	if _, ok := s.next(s.anchor, fiveYears(anchor)); !ok {
		return Schedule{}, s.fail(&fieldProblem{"expression", problem{1, "it does not fire within five years"}})
	}
	return s, nil
}

// A fieldProblem is a problem and the name of the field it is in.
type fieldProblem struct {
	field string
	problem
}

func (s Schedule) fail(p *fieldProblem) error {
	return &ParseError{Expr: s.expr, Field: p.field, Column: p.col, Msg: p.msg}
}

// parse fills in s from s.expr.
func (s *Schedule) parse() *fieldProblem {
	whole := func(col int, msg string) *fieldProblem { return &fieldProblem{"expression", problem{col, msg}} }
	switch {
	case s.expr == "":
		return whole(1, "the expression is empty")
	case len(s.expr) > maxExprLen:
		return whole(maxExprLen+1, fmt.Sprintf("the expression is longer than %d bytes", maxExprLen))
	}
	for i, r := range s.expr {
		if unicode.IsControl(r) {
			return whole(i+1, fmt.Sprintf("control character %U (fields are separated by spaces)", r))
		}
	}
	tokens := split(s.expr)
	first := strings.ToUpper(tokens[0].text)
	switch {
	case strings.HasPrefix(first, "CRON_TZ=") || strings.HasPrefix(first, "TZ="):
		return whole(1, "a CRON_TZ= or TZ= prefix is not accepted: the zone is a separate setting")
	case first[0] == '@':
		return s.parseDescriptor(tokens)
	}
	return s.parseFields(tokens)
}

// split splits expr on runs of spaces, keeping each part's column.
func split(expr string) []token {
	var tokens []token
	for i := 0; i < len(expr); {
		if expr[i] == ' ' {
			i++
			continue
		}
		n := strings.IndexByte(expr[i:], ' ')
		if n < 0 {
			n = len(expr) - i
		}
		tokens = append(tokens, token{expr[i : i+n], i + 1})
		i += n
	}
	return tokens
}

// parseFields parses 5 calendar fields, or 6 with seconds first.
func (s *Schedule) parseFields(tokens []token) *fieldProblem {
	kinds := standard
	switch {
	case len(tokens) == 6:
		kinds = withSeconds
	case len(tokens) > 6:
		return &fieldProblem{"expression", problem{tokens[6].col, fmt.Sprintf("expected 5 fields (or 6 with seconds first), found %d", len(tokens))}}
	case len(tokens) < 5:
		return &fieldProblem{"expression", problem{1, fmt.Sprintf("expected 5 fields (or 6 with seconds first), found %d", len(tokens))}}
	}
	texts := make([]string, len(tokens))
	for i, k := range kinds {
		if p := k.check(tokens[i]); p != nil {
			return &fieldProblem{k.name, *p}
		}
		texts[i] = tokens[i].text
	}
	sched, err := parser.Parse(strings.Join(texts, " "))
	if err != nil { // check refuses all robfig refuses; keep robfig's word if not
		return &fieldProblem{"expression", problem{1, err.Error()}}
	}
	// Vixie cron: a day field whose text starts with * (or ?) is unrestricted, even */2.
	star := func(t string) bool { return t[0] == '*' || t[0] == '?' }
	s.spec = newSpec(sched.(*cron.SpecSchedule), star(texts[len(texts)-3]), star(texts[len(texts)-1]))
	return nil
}

// parseDescriptor parses @yearly, @annually, @monthly, @weekly, @daily, @midnight, @hourly
// (in any case) and @every <duration>.
func (s *Schedule) parseDescriptor(tokens []token) *fieldProblem {
	name := strings.ToLower(tokens[0].text)
	if name == "@every" {
		return s.parseEvery(tokens)
	}
	if len(tokens) > 1 {
		return &fieldProblem{"descriptor", problem{tokens[1].col, tokens[0].text + " takes nothing after it"}}
	}
	sched, err := parser.Parse(name)
	if err != nil {
		return &fieldProblem{"descriptor", problem{1, "unknown descriptor " + tokens[0].text +
			" (known: @yearly, @annually, @monthly, @weekly, @daily, @midnight, @hourly, @every <duration>)"}}
	}
	spec := sched.(*cron.SpecSchedule)
	s.spec = newSpec(spec, spec.Dom&starBit != 0, spec.Dow&starBit != 0)
	return nil
}

// parseEvery parses @every <duration>: whole seconds, from 1s to 366 days.
func (s *Schedule) parseEvery(tokens []token) *fieldProblem {
	bad := func(col int, msg string) *fieldProblem { return &fieldProblem{"interval", problem{col, msg}} }
	switch len(tokens) {
	case 1:
		return bad(1, "@every needs a duration, like @every 1h30m")
	case 2:
	default:
		return bad(tokens[2].col, "@every takes one duration, like @every 1h30m")
	}
	text, col := tokens[1].text, tokens[1].col
	d, err := time.ParseDuration(text)
	switch {
	case err != nil:
		return bad(col, fmt.Sprintf("%q is not a duration, like 90s, 15m or 1h30m", text))
	case d < time.Second:
		return bad(col, text+" is shorter than 1s")
	case d > maxEvery:
		return bad(col, text+" is longer than 366 days (8784h)")
	case d%time.Second != 0:
		return bad(col, text+" is not a whole number of seconds")
	}
	s.every = int64(d / time.Second)
	return nil
}
