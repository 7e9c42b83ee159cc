package metrics_test

import (
	"strings"
	"testing"
	"time"

	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/metrics"
	"github.com/pgcoord/pgcoord/ratelimit"
)

// Policies and shadow refusals come from the database; admitted and refused calls from the
// process that made them, when Opts names its ratelimit.Metrics.
func TestMetricsRatelimits(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	ctx := t.Context()
	pgtest.NewClock(t, pool).Freeze(time.Date(2026, 12, 6, 0, 0, 0, 0, time.UTC)) // the second call comes at once
	for _, p := range []ratelimit.Policy{
		{Name: "api", Rate: 10, Period: time.Second, Burst: 1},
		{Name: "new", Rate: 1, Period: time.Hour, Burst: 1, Shadow: true},
	} {
		if _, err := ratelimit.Set(ctx, pool, p); err != nil {
			t.Fatal(err)
		}
	}
	m := &ratelimit.Metrics{}
	call := []ratelimit.Limit{{Policy: "api", Key: "k"}, {Policy: "new", Key: "k"}}
	for range 2 {
		if _, err := ratelimit.Allow(ctx, pool, 1, call, &ratelimit.Opts{Metrics: m}); err != nil {
			t.Fatal(err)
		}
	}
	text := scrape(t, newCollector(t, pool, &metrics.Opts{Ratelimits: m}))
	for series, want := range map[string]string{
		`pgcoord_ratelimit_rate_per_second{policy="api"}`:      "10",
		`pgcoord_ratelimit_burst{policy="api"}`:                "1",
		`pgcoord_ratelimit_shadow{policy="new"}`:               "1",
		`pgcoord_ratelimit_shadow_refused_total{policy="new"}`: "0",
		`pgcoord_ratelimit_client_allowed_total{policy="api"}`: "1",
		`pgcoord_ratelimit_client_allowed_total{policy="new"}`: "1",
		`pgcoord_ratelimit_client_refused_total{policy="api"}`: "1",
		`pgcoord_ratelimit_client_refused_total{policy="new"}`: "0",
	} {
		if got := sample(t, text, series); got != want {
			t.Errorf("%s = %s, want %s", series, got, want)
		}
	}
	if plain := scrape(t, newCollector(t, pool, nil)); strings.Contains(plain, "pgcoord_ratelimit_client_") {
		t.Error("pgcoord_ratelimit_client_* exported without an in-process source")
	}
}

// A Metrics counts at most MaxPolicies policies one by one, the others together under "".
func TestRatelimitMetricsBounded(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	m := &ratelimit.Metrics{MaxPolicies: 2}
	for _, name := range []string{"a", "b", "c", "d"} {
		if _, err := ratelimit.Set(t.Context(), pool, ratelimit.Policy{Name: name, Rate: 1, Period: time.Second, Burst: 5}); err != nil {
			t.Fatal(err)
		}
		if _, err := ratelimit.Allow(t.Context(), pool, 1, []ratelimit.Limit{{Policy: name, Key: "k"}}, &ratelimit.Opts{Metrics: m}); err != nil {
			t.Fatal(err)
		}
	}
	snap := m.Snapshot()
	if len(snap) != 3 || snap[0].Policy != "" || snap[0].Allowed != 2 {
		t.Fatalf("snapshot = %+v; want a, b and the others (2) under \"\"", snap)
	}
}
