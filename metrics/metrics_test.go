package metrics_test

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgcoord/pgcoord/fenced"
	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/leases"
	"github.com/pgcoord/pgcoord/metrics"
	"github.com/pgcoord/pgcoord/outbox"
	"github.com/pgcoord/pgcoord/pgcoord"
	"github.com/pgcoord/pgcoord/semaphore"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// scrape serves c once and returns the exposition text.
func scrape(t *testing.T, c *metrics.Collector) string {
	t.Helper()
	srv := httptest.NewServer(metrics.Handler(c))
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("scrape = %d: %s", resp.StatusCode, b)
	}
	return string(b)
}

// sample returns the value of the series (name with its labels, as exposed), failing the
// test if it is absent.
func sample(t *testing.T, text, series string) string {
	t.Helper()
	for _, line := range strings.Split(text, "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			return v
		}
	}
	t.Fatalf("no series %s in:\n%s", series, text)
	return ""
}

func newCollector(t *testing.T, db pgcoord.DBTX, o *metrics.Opts) *metrics.Collector {
	t.Helper()
	c, err := metrics.New(db, o)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestMetricsInProcess: counts measured in this process (leases.Do's renewals, semaphore
// admissions and their latency, refused fenced writes) are exported when Opts names them,
// and only then.
func TestMetricsInProcess(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	lm := &leases.Metrics{}
	lm.NearMisses.Add(3)
	lm.Renewals.Add(7)
	fm := func() fenced.RefusalCounts { return fenced.RefusalCounts{Stale: 2, LeaseLost: 1} }
	sm := semaphore.NewMetrics()
	if _, err := semaphore.TryAcquire(t.Context(), pool, "tenant:1", 1, time.Minute, &semaphore.AcquireOpts{Metrics: sm}); err != nil {
		t.Fatal(err)
	}
	if _, err := semaphore.TryAcquire(t.Context(), pool, "tenant:1", 1, time.Minute, &semaphore.AcquireOpts{Metrics: sm}); !errors.Is(err, semaphore.ErrFull) {
		t.Fatalf("second acquire = %v, want ErrFull", err)
	}
	text := scrape(t, newCollector(t, pool, &metrics.Opts{Leases: lm, Semaphores: sm, Fenced: fm}))
	for series, want := range map[string]string{
		"pgcoord_lease_client_near_misses_total":                                        "3",
		"pgcoord_lease_client_renewals_total":                                           "7",
		`pgcoord_fence_client_rejections_total{reason="stale_token"}`:                   "2",
		`pgcoord_fence_client_rejections_total{reason="lease_lost"}`:                    "1",
		`pgcoord_semaphore_client_admissions_total{key="tenant:1"}`:                     "1",
		`pgcoord_semaphore_client_refusals_total{key="tenant:1"}`:                       "1",
		`pgcoord_semaphore_permits{key="tenant:1"}`:                                     "1",
		`pgcoord_semaphore_client_acquire_wait_seconds_count{key="tenant:1"}`:           "1",
		`pgcoord_semaphore_client_acquire_wait_seconds_bucket{key="tenant:1",le="300"}`: "1",
	} {
		if got := sample(t, text, series); want != "" && got != want {
			t.Errorf("%s = %s, want %s", series, got, want)
		}
	}
	plain := scrape(t, newCollector(t, pool, nil))
	for _, name := range []string{"pgcoord_lease_client_", "pgcoord_semaphore_client_", "pgcoord_fence_client_"} {
		if strings.Contains(plain, name) {
			t.Errorf("%s* exported without an in-process source", name)
		}
	}
}

// TestMetricsRecordedByTheDatabase: lease near misses and forced expiries and semaphore
// waits are recorded by the database, so a collector in any process exports them.
func TestMetricsRecordedByTheDatabase(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	ctx := t.Context()
	clock := pgtest.NewClock(t, pool)
	t0 := clock.Now()
	clock.Freeze(t0)
	l, err := leases.TryAcquire(ctx, pool, "nightly", 40*time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	// Renewed with 5s of 40s left: a near miss.
	clock.Advance(35 * time.Second)
	if _, err := leases.Renew(ctx, pool, l, 40*time.Second, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := leases.Expire(ctx, pool, "nightly", "test"); err != nil {
		t.Fatal(err)
	}
	// tenant:2 admits one at a time: a second acquirer waits in line for 3 seconds (by the
	// test's clock) until the first permit is released.
	clock.Freeze(t0)
	first, err := semaphore.TryAcquire(ctx, pool, "tenant:2", 1, time.Minute, nil)
	if err != nil {
		t.Fatal(err)
	}
	// A blocking Acquire's attempts, through the SQL API, at t0 + at.
	acquire := func(at time.Duration) int {
		t.Helper()
		clock.Freeze(t0.Add(at))
		var n int
		err := pool.QueryRow(ctx, `SELECT count(*) FROM pgcoord_semaphore_acquire('tenant:2', 'second', 1, '1 minute', '1 minute')`).Scan(&n)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := acquire(time.Second); n != 0 {
		t.Fatal("the second acquirer was admitted to a full key")
	}
	if err := semaphore.Release(ctx, pool, first); err != nil {
		t.Fatal(err)
	}
	if n := acquire(4 * time.Second); n != 1 {
		t.Fatal("the second acquirer was not admitted after the release")
	}

	text := scrape(t, newCollector(t, pool, nil))
	for series, want := range map[string]string{
		`pgcoord_lease_near_misses_total{name="nightly"}`:               "1",
		`pgcoord_lease_forced_expiries_total{name="nightly"}`:           "1",
		`pgcoord_semaphore_wait_admissions{key="tenant:2"}`:             "2",
		`pgcoord_semaphore_wait_seconds{key="tenant:2",quantile="0.5"}`: "",
	} {
		if got := sample(t, text, series); want != "" && got != want {
			t.Errorf("%s = %s, want %s", series, got, want)
		}
	}
	p99, err := strconv.ParseFloat(sample(t, text, `pgcoord_semaphore_wait_seconds{key="tenant:2",quantile="0.99"}`), 64)
	if err != nil || p99 < 3*0.8 || p99 > 3*1.2 {
		t.Errorf("p99 wait = %v (%v), want 3s within 20%%", p99, err)
	}
}

// TestMetricsSourceFails: a source whose query fails (here: no pgcoord schema) reports
// pgcoord_up 0 and nothing else; the scrape still succeeds.
func TestMetricsSourceFails(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.Schema(t) // not migrated
	text := scrape(t, newCollector(t, pool, &metrics.Opts{Logger: discard()}))
	for _, src := range []string{"leases", "semaphores", "jobs", "schedules", "outbox", "idempotency", "idempotency_keys"} {
		if v := sample(t, text, fmt.Sprintf(`pgcoord_up{source=%q}`, src)); v != "0" {
			t.Errorf("pgcoord_up{source=%q} = %s, want 0", src, v)
		}
	}
	if strings.Contains(text, "pgcoord_leases_held") || strings.Contains(text, "pgcoord_idempotency_keys_in_flight") {
		t.Fatal("a failed source exported its metrics")
	}
}

// TestMetricsBounded: a source reads at most MaxRows rows per scrape and says so.
func TestMetricsBounded(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	for i := range 3 {
		if _, err := leases.TryAcquire(t.Context(), pool, fmt.Sprintf("l%d", i), time.Minute, nil); err != nil {
			t.Fatal(err)
		}
	}
	text := scrape(t, newCollector(t, pool, &metrics.Opts{MaxRows: 2}))
	if v := sample(t, text, `pgcoord_rows_truncated{source="leases"}`); v != "1" {
		t.Errorf("truncated = %s, want 1", v)
	}
	if v := sample(t, text, "pgcoord_leases_held"); v != "2" {
		t.Errorf("held = %s, want 2 (a lower bound)", v)
	}
	// The outbox's topics too.
	err := pgx.BeginFunc(t.Context(), pool, func(tx pgx.Tx) error {
		for _, topic := range []string{"a", "b", "c"} {
			if _, err := outbox.Enqueue(t.Context(), tx, outbox.Message{Topic: topic, Key: "k"}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	text = scrape(t, newCollector(t, pool, &metrics.Opts{MaxRows: 2}))
	if v := sample(t, text, `pgcoord_rows_truncated{source="outbox"}`); v != "1" || strings.Contains(text, `topic="c"`) {
		t.Errorf("outbox truncated = %s with 3 topics and MaxRows 2, want 1 and topics a and b only", v)
	}
	text = scrape(t, newCollector(t, pool, nil))
	if v := sample(t, text, `pgcoord_outbox_pending{topic="c"}`); v != "1" {
		t.Errorf("pending of topic c = %s, want 1", v)
	}
	if v := sample(t, text, `pgcoord_rows_truncated{source="leases"}`); v != "0" {
		t.Errorf("truncated = %s with room, want 0", v)
	}
	if v := sample(t, text, "pgcoord_leases_held"); v != "3" {
		t.Errorf("held = %s, want 3", v)
	}
}

// TestMetricsNewRejects: bad options fail before any query.
func TestMetricsNewRejects(t *testing.T) {
	t.Parallel()
	if _, err := metrics.New(nil, nil); !errors.Is(err, pgcoord.ErrInvalidArgument) {
		t.Errorf("nil db: %v", err)
	}
	pool := pgtest.Pool(t)
	for _, o := range []metrics.Opts{{MaxRows: -1}, {MaxRows: pgcoord.MaxListLimit + 1}, {Timeout: -time.Second}, {MaxStaleness: -time.Second}} {
		if _, err := metrics.New(pool, &o); !errors.Is(err, pgcoord.ErrInvalidArgument) {
			t.Errorf("New(%+v) = %v, want ErrInvalidArgument", o, err)
		}
	}
}

func discard() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }
