package ui

import (
	"fmt"
	"strings"
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

// TestUIPayloadText: text is shown as text, binary as base64, both cut at maxPayloadShown
// bytes with the full size said, never splitting a UTF-8 character.
func TestUIPayloadText(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("é", maxPayloadShown) // 2 bytes each
	for in, want := range map[string]string{
		"":             "(empty)",
		`{"id": 1}`:    `{"id": 1}`,
		"\xff\x00\x01": "base64:/wAB",
		long:           strings.Repeat("é", maxPayloadShown/2) + fmt.Sprintf(" … (%d bytes)", 2*maxPayloadShown),
		"a" + long:     "a" + strings.Repeat("é", maxPayloadShown/2-1) + fmt.Sprintf(" … (%d bytes)", 2*maxPayloadShown+1),
	} {
		if got := payloadText([]byte(in)); got != want {
			t.Errorf("payloadText(%.20q) = %.40q..., want %.40q...", in, got, want)
		}
	}
}
