package ui_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/internal/ui"
	"github.com/pgcoord/pgcoord/leases"
	"github.com/pgcoord/pgcoord/semaphore"
	"github.com/pgcoord/pgcoord/singleton"
)

// TestUIMetrics: /metrics serves, in the Prometheus text format, the state created
// through the public API — leases held, expired and expired by an operator; per key the
// limit, permits, waiters and counters; per job the last-success age and the overdue and
// failing flags.
func TestUIMetrics(t *testing.T) {
	t.Parallel()
	d := newDash(t, ui.Config{})
	now := dbNow(t, d.pool)
	holdLease(t, d.pool, "held", "w1", time.Minute, time.Time{}, nil)
	holdLease(t, d.pool, "dead", "w2", time.Second, now.Add(-time.Hour), nil)
	forced := holdLease(t, d.pool, "forced", "w3", time.Minute, time.Time{}, nil)
	if _, err := leases.Expire(t.Context(), d.pool, "forced", "alice"); err != nil {
		t.Fatal(err)
	}
	permit(t, d.pool, "tenant:a", "p1", 1, time.Minute, time.Time{})
	// A waiter in line for tenant:a, until the test ends.
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	waiter := pgtest.Go(func() (semaphore.Permit, error) {
		return semaphore.Acquire(ctx, d.pool, "tenant:a", 1, time.Minute, nil)
	})
	deadline := time.Now().Add(pgtest.WaitLimit)
	for s, _ := semaphore.Get(t.Context(), d.pool, "tenant:a"); s.Waiters != 1; s, _ = semaphore.Get(t.Context(), d.pool, "tenant:a") {
		if time.Now().After(deadline) || waiter.Returned() {
			t.Fatal("the waiter never got in line")
		}
		time.Sleep(10 * time.Millisecond) // polling a condition, not waiting for time to pass
	}
	tick(t, d.pool, singleton.Job{Name: "fresh", Every: time.Hour}, time.Time{}, true, nil)
	day := 24 * time.Hour // long slots: the test never straddles a boundary in practice
	tick(t, d.pool, singleton.Job{Name: "stuck", Every: day}, now.Add(-60*day), false, nil)

	code, text, resp := d.do(t, http.MethodGet, "/metrics", nil)
	if code != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/plain") {
		t.Fatalf("GET /metrics = %d %q", code, resp.Header.Get("Content-Type"))
	}
	for series, want := range map[string]string{
		`pgcoord_up{source="leases"}`:                      "1",
		`pgcoord_up{source="semaphores"}`:                  "1",
		`pgcoord_up{source="jobs"}`:                        "1",
		"pgcoord_leases_held":                              "1",
		"pgcoord_leases_expired":                           "1",
		"pgcoord_leases_forced_expired":                    "1",
		`pgcoord_semaphore_limit{key="tenant:a"}`:          "1",
		`pgcoord_semaphore_permits{key="tenant:a"}`:        "1",
		`pgcoord_semaphore_waiters{key="tenant:a"}`:        "1",
		`pgcoord_semaphore_admitted_total{key="tenant:a"}`: "1",
		`pgcoord_job_overdue{job="stuck"}`:                 "1",
		`pgcoord_job_overdue{job="fresh"}`:                 "0",
		`pgcoord_job_failing{job="fresh"}`:                 "0",
		`pgcoord_job_missed_ticks{job="stuck"}`:            "60",
		`pgcoord_lease_fence_token{name="forced"}`:         fmt.Sprint(forced.Token),
	} {
		if got := metricSample(t, text, series); got != want {
			t.Errorf("%s = %s, want %s", series, got, want)
		}
	}
	if age := metricSample(t, text, `pgcoord_job_last_success_age_seconds{job="fresh"}`); strings.HasPrefix(age, "-") {
		t.Errorf("last success age %s is negative", age)
	}
	if strings.Contains(text, `pgcoord_job_last_success_age_seconds{job="stuck"}`) {
		t.Error("a job that never succeeded has a last-success age")
	}
	for _, help := range []string{"# HELP pgcoord_semaphore_waiters", "# TYPE pgcoord_semaphore_admitted_total counter"} {
		if !strings.Contains(text, help) {
			t.Errorf("no %q", help)
		}
	}
}

// metricSample returns the value of a series in the exposition text.
func metricSample(t *testing.T, text, series string) string {
	t.Helper()
	for _, line := range strings.Split(text, "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			return v
		}
	}
	t.Fatalf("no series %s in:\n%s", series, text)
	return ""
}

// TestUIMetricsOutboxAndIdempotency: /metrics serves per topic the outbox's pending, due,
// in-flight and dead messages and the oldest pending age, and the idempotency keys in
// flight, stuck and completed, from state created through the public API.
func TestUIMetricsOutboxAndIdempotency(t *testing.T) {
	t.Parallel()
	d := newDash(t, ui.Config{})
	outboxState(t, d.pool)
	beginKey(t, d.pool, "payments", "live-1", "charged", false)
	beginKey(t, d.pool, "payments", "dead-1", "reserved", true)
	completeKey(t, d.pool, "payments", "done-1", "ok")

	_, text, _ := d.do(t, http.MethodGet, "/metrics", nil)
	for series, want := range map[string]string{
		`pgcoord_up{source="outbox"}`:                 "1",
		`pgcoord_up{source="idempotency"}`:            "1",
		`pgcoord_up{source="idempotency_keys"}`:       "1",
		`pgcoord_outbox_pending{topic="orders"}`:      "2",
		`pgcoord_outbox_due{topic="orders"}`:          "1",
		`pgcoord_outbox_in_flight{topic="orders"}`:    "0",
		`pgcoord_outbox_dead{topic="orders"}`:         "1",
		`pgcoord_outbox_dead{topic="audit"}`:          "1",
		`pgcoord_outbox_pending{topic="audit"}`:       "0",
		`pgcoord_outbox_max_attempts{topic="orders"}`: "0",
		"pgcoord_idempotency_keys_in_flight":          "2",
		"pgcoord_idempotency_keys_stuck":              "1",
		"pgcoord_idempotency_keys_completed":          "1",
	} {
		if got := metricSample(t, text, series); got != want {
			t.Errorf("%s = %s, want %s", series, got, want)
		}
	}
	if age := metricSample(t, text, `pgcoord_outbox_oldest_pending_age_seconds{topic="orders"}`); age == "0" || strings.HasPrefix(age, "-") {
		t.Errorf("oldest pending age of orders = %s, want positive", age)
	}
	if age := metricSample(t, text, `pgcoord_outbox_oldest_pending_age_seconds{topic="audit"}`); age != "0" {
		t.Errorf("oldest pending age of audit (nothing pending) = %s, want 0", age)
	}
}
