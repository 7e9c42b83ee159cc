package ui

import (
	"testing"
	"time"
)

func TestUIHumanDuration(t *testing.T) {
	for d, want := range map[time.Duration]string{
		1500 * time.Microsecond:        "2ms",
		1234 * time.Millisecond:        "1.2s",
		5 * time.Minute:                "5m",
		5*time.Minute + 12*time.Second: "5m12s",
		5*time.Minute + 10*time.Second: "5m10s",
		24 * time.Hour:                 "24h",
		90 * time.Minute:               "1h30m",
		10*time.Hour + 20*time.Second:  "10h",
	} {
		if got := humanDuration(d); got != want {
			t.Errorf("humanDuration(%v) = %q, want %q", d, got, want)
		}
	}
}
