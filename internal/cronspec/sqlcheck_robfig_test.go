package cronspec_test

import (
	"math/rand/v2"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode"

	"github.com/robfig/cron/v3"

	"github.com/pgcoord/pgcoord/internal/pgtest"
)

// robfigParser parses as the Go side of schedules does.
var robfigParser = cron.NewParser(cron.SecondOptional | cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

var (
	// emptyItem and starRange find, in one field, the items robfig lets through that the
	// Go side refuses: an empty one ("1,,2"), and "*-..." or "?-...".
	emptyItem = regexp.MustCompile(`(^|,)(,|$)`)
	starRange = regexp.MustCompile(`(^|,)[*?]-`)
	zonePfx   = regexp.MustCompile(`^(?i)(CRON_)?TZ=`)
	step      = regexp.MustCompile(`/([0-9]+)`)
)

// fieldChars are the characters a field may hold.
const fieldChars = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ*?,-/"

// goSide tells whether the Go side (internal/cronspec) accepts expr, by its rules on top of
// robfig's parser, as migration 00015 lists them: trimmed of white space; fields split on
// spaces, made of ASCII digits, letters and *?,-/ only, without empty items, "*-" ranges
// or steps wider than the field; descriptors in any case; and a calendar expression must
// fire within five years, by robfig's Next with the Go side's (Vixie cron's) rule for the
// day fields: one whose text starts with * or ? is unrestricted. When this branch and
// internal/cronspec meet, its Parse is the Go side to compare with.
//
// decided is false for the expressions whose firing within five years depends on the year
// they start in, which SQL cannot know and accepts: both day fields must match (one starts
// with * or ?) and neither allows every day, as in "0 0 */31 2 3" (February 1 on a
// Wednesday: in 2023 and 2034, none between).
func goSide(expr string) (accepted, decided bool) {
	expr = strings.TrimSpace(expr)
	if expr == "" || len(expr) > 255 || strings.ContainsFunc(expr, unicode.IsControl) {
		return false, true
	}
	fields := strings.FieldsFunc(expr, func(r rune) bool { return r == ' ' })
	if zonePfx.MatchString(fields[0]) {
		return false, true
	}
	if name := strings.ToLower(fields[0]); name == "@every" {
		if len(fields) != 2 {
			return false, true
		}
		d, err := time.ParseDuration(fields[1])
		return err == nil && d >= time.Second && d <= 366*24*time.Hour && d%time.Second == 0, true
	} else if name[0] == '@' {
		_, err := robfigParser.Parse(name)
		return err == nil && len(fields) == 1, true
	}
	if len(fields) != 5 && len(fields) != 6 {
		return false, true
	}
	for i, f := range fields {
		if strings.Trim(f, fieldChars) != "" || emptyItem.MatchString(f) || starRange.MatchString(f) {
			return false, true
		}
		span := fieldMax[i+6-len(fields)] - fieldMin[i+6-len(fields)] + 1
		for _, m := range step.FindAllStringSubmatch(f, -1) {
			if n, err := strconv.Atoi(m[1]); err != nil || n > span {
				return false, true
			}
		}
	}
	sched, err := robfigParser.Parse(expr)
	if err != nil {
		return false, true
	}
	const star, allDom, allDow = 1 << 63, 0xfffffffe, 0x7f
	spec := sched.(*cron.SpecSchedule)
	dom, dow := fields[len(fields)-3], fields[len(fields)-1]
	spec.Dom, spec.Dow = spec.Dom&^star, spec.Dow&^star
	if dom[0] == '*' || dom[0] == '?' {
		spec.Dom |= star
	}
	if dow[0] == '*' || dow[0] == '?' {
		spec.Dow |= star
	}
	fires := !spec.Next(time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)).IsZero()
	both := spec.Dom&star != 0 || spec.Dow&star != 0
	return fires, fires || !both || spec.Dom&allDom == allDom || spec.Dow&allDow == allDow
}

// TestCronCheckAgreesWithRobfig: pgcoord_cron_check accepts exactly what the Go side
// accepts, on the table's expressions and on random ones made of the language's pieces
// and its near misses, and refuses with SQLSTATE 22023 and a bad-expression message.
func TestCronCheckAgreesWithRobfig(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	seed := rand.Uint64()
	r := rand.New(rand.NewPCG(seed, 1))
	var exprs []string
	for _, c := range cronCases {
		exprs = append(exprs, c.expr)
	}
	for range 4000 {
		exprs = append(exprs, randomExpr(r))
	}
	got := verdicts(t, pool, "pgcoord_cron_check", ptrs(exprs...))
	accepted, undecided, failures := 0, 0, 0
	for i, e := range exprs {
		sql := got[i] == ""
		golang, decided := goSide(e)
		if sql {
			accepted++
		}
		if !decided {
			undecided++
			golang = sql // SQL accepts these; the Go side's answer depends on the year
		}
		if sql != golang || !sql && !strings.HasPrefix(got[i], "22023 pgcoord: bad schedule expression ") {
			t.Errorf("%q: SQL says %q, the Go side accepts it: %v (seed %d)", e, got[i], golang, seed)
			if failures++; failures == 20 {
				t.Fatal("stopping at 20 differences")
			}
		}
	}
	// The random expressions must exercise both answers.
	if accepted < len(exprs)/10 || accepted > len(exprs)*9/10 {
		t.Errorf("%d of %d expressions accepted: the generator lost its balance", accepted, len(exprs))
	}
	t.Logf("%d expressions, %d accepted by both sides, %d whose firing depends on the year (seed %d)",
		len(exprs), accepted, undecided, seed)
}

// pick returns one of xs at random.
func pick[T any](r *rand.Rand, xs ...T) T { return xs[r.IntN(len(xs))] }

// gen makes random expressions: well formed pieces, each replaced by a near miss with
// probability noise.
type gen struct {
	r     *rand.Rand
	noise float64
}

func (g gen) odd() bool { return g.r.Float64() < g.noise }

var (
	fieldMin   = []int{0, 0, 0, 1, 1, 0}
	fieldMax   = []int{59, 59, 23, 31, 12, 6}
	fieldNames = [][]string{4: strings.Fields("jan feb mar apr may jun jul aug sep oct nov dec"), 5: strings.Fields("sun mon tue wed thu fri sat")}
)

// randomExpr returns a random expression: clean, or with a few near misses.
func randomExpr(r *rand.Rand) string {
	g := gen{r: r, noise: pick(r, 0, 0, 0.02, 0.1)}
	if r.IntN(8) == 0 {
		return g.descriptor()
	}
	n := 5 + r.IntN(2)
	if g.odd() {
		n = pick(r, 0, 1, 4, 7)
	}
	var b strings.Builder
	if g.odd() {
		b.WriteString(pick(r, " ", "\u00a0", "CRON_TZ=UTC ", "TZ=UTC ", "\t", "@daily "))
	}
	for i := range n {
		if i > 0 {
			b.WriteString(" ")
			if g.odd() {
				b.WriteString(pick(r, " ", "\u00a0", "\u2003", "\u3000", "\t", "\u2028", "\u200b"))
			}
		}
		f := 6 - n + i // the field this one stands for
		if f < 0 || f > 5 {
			f = r.IntN(6)
		}
		b.WriteString(g.field(f))
	}
	if g.odd() {
		b.WriteString(pick(r, " ", "\n", "\u00a0", " *"))
	}
	return b.String()
}

// field returns field f (0 second ... 5 day of week): the days of month months lack, and
// stars of the day of week, come often, to try the never-firing check.
func (g gen) field(f int) string {
	r := g.r
	items := make([]string, 1+r.IntN(3)*r.IntN(2))
	for i := range items {
		switch {
		case g.odd() && r.IntN(4) == 0:
			items[i] = ""
		case f == 3 && r.IntN(3) == 0:
			items[i] = pick(r, "29", "30", "31", "30-31", "29/2", "31/1")
		case f == 4 && r.IntN(3) == 0:
			items[i] = pick(r, "2", "FEB", "4", "6", "9", "11", "4-11/5", "2-12/2", "sep")
		case f == 5 && r.IntN(2) == 0:
			items[i] = pick(r, "*", "?", "*/1", "*/2", "?/1", "*/01", "*/+1", "1")
		default:
			items[i] = g.item(f)
		}
	}
	return strings.Join(items, ",")
}

func (g gen) item(f int) string {
	r := g.r
	var s string
	switch r.IntN(6) {
	case 0:
		s = pick(r, "*", "?")
		if g.odd() {
			s += pick(r, "-5", "-1")
		}
	case 1, 2:
		s, _ = g.value(f)
	default:
		lo, a := g.value(f)
		hi, b := g.value(f)
		if a > b && !g.odd() {
			lo, hi = hi, lo
		}
		s = lo + "-" + hi
	}
	if r.IntN(3) == 0 {
		s += "/" + pick(r, "1", "2", "3", "5", "7", "01")
		if g.odd() {
			s = s[:strings.LastIndex(s, "/")+1] + pick(r, "0", "-1", "-0", "", "x", "L", "+2", "8", "12", "13", "15", "24",
				"25", "31", "32", "60", "61", "9223372036854775808", "2/3")
		}
	}
	return s
}

// value returns a number or name of field f, and its value: in range, or, as a near miss,
// just out of it or not a number at all (-1).
func (g gen) value(f int) (string, int) {
	r := g.r
	lo, hi, names := fieldMin[f], fieldMax[f], fieldNames[f]
	switch {
	case g.odd() && r.IntN(2) == 0:
		return pick(r, "", "L", "5L", "W", "15W", "LW", "5#3", "x", "*", "?", "1.5", "99999999999999999999",
			"FRİ", "MON", "jan", "Jul", "DECEMBER", "0x1"), -1
	case g.odd():
		v := pick(r, lo-1, hi+1, hi+2, 7, 0, 60, 24, 32, 13)
		return strconv.Itoa(v), v
	case len(names) > 0 && r.IntN(3) == 0:
		v := r.IntN(len(names))
		n := names[v]
		return pick(r, n, strings.ToUpper(n), strings.ToUpper(n[:1])+n[1:]), v + lo
	}
	v := lo + r.IntN(hi-lo+1)
	if g.odd() {
		return "+" + strconv.Itoa(v), v
	}
	return pick(r, "", "", "", "0") + strconv.Itoa(v), v
}

func (g gen) descriptor() string {
	r := g.r
	if r.IntN(3) == 0 {
		return pick(r, "@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly",
			"@DAILY", "@daily ", " @daily", "@every", "@", "@reboot", "@every\u00a01h", "@every ", "@wee\u212aly",
			"@daily 0", "@EVERY 1h", "@every 1h 1m", "@every  1h ", "\t@hourly\n")
	}
	var b strings.Builder
	b.WriteString("@every ")
	if r.IntN(10) == 0 {
		b.WriteString(pick(r, "+", "-", " "))
	}
	for range 1 + r.IntN(3) {
		if r.IntN(3) == 0 { // a fraction of many digits, which Go adds in float64
			b.WriteString(strconv.Itoa(r.IntN(1000)) + "." + strings.Repeat("0", r.IntN(12)))
			for range r.IntN(22) {
				b.WriteByte(byte('0' + r.IntN(10)))
			}
			b.WriteString(pick(r, "s", "m", "h", "ms"))
			continue
		}
		b.WriteString(pick(r, "0", "1", "1.5", ".5", "1.", "90", "8784", "8785", "0.5", "1000", "999", "60", "3600",
			"527040", "31622400", "31622401", "00", "1.0000000001", "0.0000000001", ".", "1.5.5", "12345678901234567890",
			"0.333333333333333333333", "0.25", "36", "0.01666666666666666666667", "0.1", "0.7"))
		b.WriteString(pick(r, "ns", "us", "µs", "μs", "ms", "s", "s", "m", "m", "h", "h", "d", "", "x", "e3s", " "))
	}
	return b.String()
}
