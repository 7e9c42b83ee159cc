package cronspec

import (
	"testing"
	"time"
)

// BenchmarkNext measures Next for frequent, sparse and never-again expressions; Next jumps
// field by field, so even a search over the whole five years costs microseconds.
func BenchmarkNext(b *testing.B) {
	at := time.Date(2026, 10, 25, 0, 30, 0, 0, time.UTC) // Berlin's clocks fall back at 01:00
	for _, expr := range []string{"*/5 * * * *", "* * * * * *", "0 9 * * MON-FRI", "0 0 29 2 *", "0 0 */31 2 MON", "@every 90m"} {
		s := mustParse(b, expr, "Europe/Berlin", time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
		b.Run(expr, func(b *testing.B) {
			for b.Loop() {
				s.Next(at)
			}
		})
	}
	b.Run("never again", func(b *testing.B) {
		s := mustParse(b, "0 0 29 2 *", "UTC", time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
		for b.Loop() {
			s.Next(time.Date(2096, 3, 1, 0, 0, 0, 0, time.UTC))
		}
	})
	b.Run("Parse", func(b *testing.B) {
		for b.Loop() {
			Parse("0 9 * * MON-FRI", "Europe/Berlin", at)
		}
	})
}
