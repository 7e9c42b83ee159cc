package ui

import (
	"encoding/base64"
	"fmt"
	"html/template"
	"maps"
	"slices"
	"strings"
	"time"
	"unicode/utf8"
)

// funcs are the template helpers.
var funcs = template.FuncMap{
	"age":    age,
	"dur":    humanDuration,
	"ts":     timestamp,
	"meta":   formatMetadata,
	"pct":    pct,
	"mul":    func(a, b int) int { return a * b },
	"add":    func(a, b int64) int64 { return a + b },
	"filter": func(path, what, prefix string) filterForm { return filterForm{path, what, prefix} },
	// payload and short are for templates guarded by ShowPayloads only.
	"payload":    payloadText,
	"short":      shortPayload,
	"trendScan":  func() int { return trendScan },
	"detailRows": func() int { return detailRows },
	// zoned and schedulePath are schedules.go's.
	"zoned":        zoned,
	"schedulePath": schedulePath,
	// partitionPath and leaseLeft are partitions.go's.
	"partitionPath": partitionPath,
	"leaseLeft":     leaseLeft,
}

// filterForm is what the "filter" template draws: a prefix filter of the list at Path.
type filterForm struct{ Path, What, Prefix string }

// maxPayloadShown is how much of a payload or response body a page shows.
const maxPayloadShown = 2048

// payloadText shows a payload or response body: as text when it is UTF-8, else in
// base64, cut at maxPayloadShown bytes with its size.
func payloadText(b []byte) string {
	if len(b) == 0 {
		return "(empty)"
	}
	shown := b[:min(len(b), maxPayloadShown)]
	var s string
	if utf8.Valid(shown) || utf8.Valid(b) {
		s = strings.ToValidUTF8(string(shown), "")
	} else {
		s = "base64:" + base64.StdEncoding.EncodeToString(shown)
	}
	if len(shown) < len(b) {
		s += fmt.Sprintf(" … (%d bytes)", len(b))
	}
	return s
}

// shortPayload is the start of a payload, for a table cell: its first shortPayloadRunes
// characters (payloadText's), with "…" when there is more.
func shortPayload(b []byte) string {
	s := []rune(payloadText(b))
	if len(s) <= shortPayloadRunes {
		return string(s)
	}
	return string(s[:shortPayloadRunes]) + "…"
}

const shortPayloadRunes = 40

// age is now - t for people ("5m12s"); "-" for the zero time.
func age(t, now time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return humanDuration(max(now.Sub(t), 0))
}

// humanDuration rounds d to what matters at its size: "2ms", "1.2s", "5m10s", "1h30m".
func humanDuration(d time.Duration) string {
	switch {
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Minute:
		return d.Round(100 * time.Millisecond).String()
	case d < time.Hour:
		d = d.Round(time.Second)
	default:
		d = d.Round(time.Minute)
	}
	s := d.String()
	if strings.HasSuffix(s, "m0s") { // "5m0s" -> "5m", "24h0m0s" -> "24h0m"
		s = s[:len(s)-2]
	}
	if strings.HasSuffix(s, "h0m") { // "24h0m" -> "24h"
		s = s[:len(s)-2]
	}
	return s
}

// timestamp formats t in UTC with milliseconds; "-" for the zero time.
func timestamp(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format("2006-01-02 15:04:05.000Z")
}

// formatMetadata shows metadata as sorted key=value pairs.
func formatMetadata(m map[string]string) string {
	parts := make([]string, 0, len(m))
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%s=%s", k, m[k]))
	}
	return strings.Join(parts, " ")
}

// pct is part/whole in percent, within 0..100; 0 when whole is not positive.
func pct(part, whole float64) float64 {
	if whole <= 0 {
		return 0
	}
	return min(max(100*part/whole, 0), 100)
}
