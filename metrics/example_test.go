package metrics_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/leases"
	"github.com/pgcoord/pgcoord/metrics"
	"github.com/pgcoord/pgcoord/semaphore"
)

// printSeries prints the lines of a Prometheus exposition that start with one of prefixes.
func printSeries(exposition string, prefixes ...string) {
	for _, line := range strings.Split(exposition, "\n") {
		for _, p := range prefixes {
			if strings.HasPrefix(line, p) {
				fmt.Println(line)
			}
		}
	}
}

// An application exports pgcoord's state from its own registry, beside its own metrics,
// together with what only it can measure: here the semaphore admissions of its calls,
// counted in a Metrics it passes to each call and to the collector.
func ExampleNew() {
	ctx := context.Background()
	pool := pgtest.ExamplePool() // your *pgxpool.Pool, with pgcoord migrated

	admissions := semaphore.NewMetrics() // one for the application
	p, err := semaphore.TryAcquire(ctx, pool, "tenant:42", 2, time.Minute, &semaphore.AcquireOpts{Metrics: admissions})
	if err != nil {
		panic(err)
	}
	defer semaphore.Release(ctx, pool, p)

	c, err := metrics.New(pool, &metrics.Opts{Semaphores: admissions})
	if err != nil {
		panic(err)
	}
	reg := prometheus.NewRegistry() // or prometheus.MustRegister(c) on the default registry
	reg.MustRegister(c)
	handler := promhttp.HandlerFor(reg, promhttp.HandlerOpts{}) // serve it at /metrics

	// A scrape reads the database's state at that moment.
	rec := httptest.NewRecorder()
	handler.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	printSeries(rec.Body.String(), "pgcoord_semaphore_permits{", "pgcoord_semaphore_client_admissions_total{")
	// Output:
	// pgcoord_semaphore_client_admissions_total{key="tenant:42"} 1
	// pgcoord_semaphore_permits{key="tenant:42"} 1
}

// Handler serves a collector alone, as `pgcoord metrics --listen` does: the database's
// state, without the Go runtime's metrics.
func ExampleHandler() {
	ctx := context.Background()
	pool := pgtest.ExamplePool()

	lease, err := leases.TryAcquire(ctx, pool, "nightly-export", time.Minute, nil)
	if err != nil {
		panic(err)
	}
	defer leases.Release(ctx, pool, lease, nil)

	c, err := metrics.New(pool, nil)
	if err != nil {
		panic(err)
	}
	srv := httptest.NewServer(metrics.Handler(c)) // or http.Handle("/metrics", metrics.Handler(c))
	defer srv.Close()

	resp, err := http.Get(srv.URL)
	if err != nil {
		panic(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	printSeries(string(body), "pgcoord_leases_held ", `pgcoord_up{source="leases"}`)
	// Output:
	// pgcoord_leases_held 1
	// pgcoord_up{source="leases"} 1
}
