package cronspec_test

import (
	"fmt"
	"time"

	"github.com/pgcoord/pgcoord/internal/cronspec"
)

// 02:30 every day in Berlin: on 29 March 2026 the clock skips from 02:00 to 03:00, so it
// fires at the transition, 03:00 local; on 25 October 2026 02:30 comes twice and fires the
// first time only.
func ExampleSchedule_Between() {
	s, err := cronspec.Parse("30 2 * * *", "Europe/Berlin", time.Now())
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, days := range [][2]string{{"2026-03-28", "2026-03-30"}, {"2026-10-24", "2026-10-26"}} {
		from, _ := time.Parse(time.DateOnly, days[0])
		to, _ := time.Parse(time.DateOnly, days[1])
		for _, f := range s.Between(nil, from, to, 10) {
			fmt.Println(f.Format(time.RFC3339), f.In(s.Location()).Format("15:04 MST"))
		}
	}
	// Output:
	// 2026-03-28T01:30:00Z 02:30 CET
	// 2026-03-29T01:00:00Z 03:00 CEST
	// 2026-10-24T00:30:00Z 02:30 CEST
	// 2026-10-25T00:30:00Z 02:30 CEST
}

func ExampleParse_error() {
	_, err := cronspec.Parse("0 9 * * MON-FRY", "Europe/Berlin", time.Now())
	fmt.Println(err)
	// Output:
	// schedules: bad expression "0 9 * * MON-FRY" at column 13 (day of week): "FRY" is not a number or a day name (SUN-SAT)
}
