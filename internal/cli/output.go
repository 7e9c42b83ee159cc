package cli

import (
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/pgcoord/pgcoord/internal/base"
)

// printJSON writes v as indented JSON followed by a newline.
func (a *app) printJSON(v any) error {
	enc := json.NewEncoder(a.out)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// table returns a tab-aligned writer on the output; call Flush when done. Each Write is
// one row: tabs separate its cells and a final newline ends it. Everything else is
// printable: a control character in a name, a stored error or metadata (an escape
// sequence that would retitle the terminal or clear it, a newline that would fake a row)
// is shown escaped (\x1b, \n, \u202e).
func (a *app) table() *table {
	return &table{tw: tabwriter.NewWriter(a.out, 0, 4, 2, ' ', 0)}
}

// table is a tabwriter that escapes control characters within rows.
type table struct{ tw *tabwriter.Writer }

func (t *table) Write(p []byte) (int, error) {
	row, end := strings.CutSuffix(string(p), "\n")
	cells := strings.Split(row, "\t")
	for i, c := range cells {
		cells[i] = base.Printable(c)
	}
	out := strings.Join(cells, "\t")
	if end {
		out += "\n"
	}
	if _, err := t.tw.Write([]byte(out)); err != nil {
		return 0, err
	}
	return len(p), nil
}

// Flush writes the aligned table.
func (t *table) Flush() error { return t.tw.Flush() }

// printFields prints one object as aligned "field: value" lines.
func (a *app) printFields(rows [][2]string) {
	tw := a.table()
	for _, r := range rows {
		fmt.Fprintf(tw, "%s:\t%s\n", r[0], r[1])
	}
	tw.Flush()
}

// rfc3339 formats t in UTC for JSON and tables; the zero time becomes "".
func rfc3339(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format(time.RFC3339)
}

// nullString is s for JSON, null when it is empty.
func nullString(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// jsonTime formats t in UTC as RFC 3339 with the database's sub-second precision; the zero
// time is null.
func jsonTime(t time.Time) *string {
	if t.IsZero() {
		return nil
	}
	s := t.UTC().Format(time.RFC3339Nano)
	return &s
}

// preciseTime formats t in UTC as RFC 3339 with milliseconds for people; zero is "-".
func preciseTime(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format("2006-01-02T15:04:05.000Z07:00")
}

// dash shows an empty value as "-" in tables.
func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// timeLeft formats what a grant has left for tables: to 100ms from a second on, to the
// millisecond below.
func timeLeft(d time.Duration) string {
	if d >= time.Second {
		return d.Round(100 * time.Millisecond).String()
	}
	return d.Round(time.Millisecond).String()
}

// ago is how long before now t was, for tables: "2h3m ago"; "-" for the zero time.
func ago(t, now time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return age(t, now) + " ago"
}

// age formats now - t compactly: "45s", "5m12s", "2h3m", "3d4h".
func age(t, now time.Time) string {
	d := now.Sub(t)
	if d < 0 {
		d = 0
	}
	switch {
	case d < time.Minute:
		return strconv.Itoa(int(d/time.Second)) + "s"
	case d < time.Hour:
		return fmt.Sprintf("%dm%ds", d/time.Minute, d%time.Minute/time.Second)
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh%dm", d/time.Hour, d%time.Hour/time.Minute)
	}
	return fmt.Sprintf("%dd%dh", d/(24*time.Hour), d%(24*time.Hour)/time.Hour)
}

// oneLine makes s fit one table cell: newlines and tabs become spaces, and it is cut to
// n runes with "…".
func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > n {
		return string(r[:n-1]) + "…"
	}
	return s
}

// isTerminal reports whether w is a terminal, where progress lines are welcome.
func isTerminal(w any) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
