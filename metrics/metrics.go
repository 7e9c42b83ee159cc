// Package metrics exports pgcoord's state to Prometheus: a Collector that reads the
// database at scrape time through the same public API the CLI uses (leases.List,
// semaphore.List, singleton.ListJobs, schedules.List, partition.Groups, outbox.Stats,
// idempotency.List), with one bounded query per source per scrape. `pgcoord metrics
// --listen` serves it alone; `pgcoord ui` serves it at /metrics beside the dashboard. An
// application registers it with its own registry to export, beside the database's state,
// what its own calls measured: it creates the counters, names them in Opts and passes them
// to the calls they should count, a call given none being counted nowhere (package
// fenced's calls take no options: their refusals are counted for the whole process, and
// read by fenced.Refusals):
//
//	leaseMetrics, semMetrics := &leases.Metrics{}, semaphore.NewMetrics()
//	c, err := metrics.New(pool, &metrics.Opts{
//		Leases: leaseMetrics, Semaphores: semMetrics, Fenced: fenced.Refusals,
//	})
//	...
//	prometheus.MustRegister(c)
//	...
//	err = leases.Do(ctx, pool, "nightly", time.Minute, run, &leases.DoOpts{Metrics: leaseMetrics})
//	...
//	permit, err := semaphore.Acquire(ctx, pool, key, 4, time.Minute, &semaphore.AcquireOpts{Metrics: semMetrics})
//
// Each primitive is a source registered by its own file (leases.go, semaphores.go,
// jobs.go, schedules.go, partitions.go, outbox.go, idempotency.go, ratelimits.go): adding
// one is one more file with a register call in its init.
//
// # Guarantees
//
//   - A scrape runs one query per source, each capped at Opts.MaxRows rows (the outbox's
//     is one aggregate over its pending and dead messages, a row per topic), whatever the
//     number of leases, keys, jobs or messages: pgcoord_rows_truncated{source} says when
//     a source had more rows than it read (its counts are then lower bounds).
//   - Ages and expiries are judged by the database clock of the query, never this
//     process's. Lease near misses, forced expiries and semaphore waits are recorded by
//     the database as they happen, so every process (the dashboard's too) sees them.
//   - A source whose query fails reports pgcoord_up{source} 0 and none of its other
//     metrics; the other sources still report. The scrape itself succeeds.
//
// # Failure modes
//
//   - What only the calling process can measure — keep-alive renewals and their errors
//     (leases.Metrics), admission latency including refused TryAcquire calls
//     (semaphore.Metrics), refused fenced writes, whose transactions roll back
//     (fenced.Refusals) — is exported, under pgcoord_*_client_* names, only when Opts names
//     it, i.e. by a collector running in the process that measured it; `pgcoord metrics`
//     and `pgcoord ui` show none of it. A leases or semaphore call counts only into the
//     Metrics its options name.
//   - A per-name metric (one series per lease, key, job or topic) is bounded by
//     Opts.MaxRows; with many thousands of tenants, lower it or scrape the counts only.
package metrics

import (
	"context"
	"log/slog"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/pgcoord/pgcoord/fenced"
	"github.com/pgcoord/pgcoord/internal/base"
	"github.com/pgcoord/pgcoord/leases"
	"github.com/pgcoord/pgcoord/pgcoord"
	"github.com/pgcoord/pgcoord/ratelimit"
	"github.com/pgcoord/pgcoord/semaphore"
)

// check makes this package's argument errors ("metrics: cause").
var check = base.Check("metrics")

// Defaults of Opts.
const (
	DefaultMaxRows      = 1000
	DefaultMaxStaleness = 5 * time.Minute
	DefaultTimeout      = 10 * time.Second
)

// Opts are the options of New. A nil *Opts means the defaults.
type Opts struct {
	// MaxRows caps the rows one source reads per scrape. Default DefaultMaxRows; at most
	// pgcoord.MaxListLimit.
	MaxRows int
	// MaxStaleness is how long past its period a job may go without success before it is
	// overdue (as `pgcoord jobs check --max-staleness`). Default DefaultMaxStaleness.
	MaxStaleness time.Duration
	// Timeout bounds one scrape's queries. Default DefaultTimeout.
	Timeout time.Duration
	// Leases, if set, are keep-alive counts measured in this process to export beside the
	// database's state: the Metrics given to leases.Do (DoOpts.Metrics) or to Electors
	// (ElectorConfig.Metrics).
	Leases *leases.Metrics
	// Semaphores, if set, are admission counts and waits measured in this process: the
	// Metrics given to semaphore's calls (AcquireOpts.Metrics, NextOpts.Metrics).
	Semaphores *semaphore.Metrics
	// Ratelimits, if set, are the rate limit decisions of this process's calls: the
	// Metrics given to package ratelimit's calls (Opts.Metrics).
	Ratelimits *ratelimit.Metrics
	// Fenced, if set, reads the writes this process's fenced calls refused: pass
	// fenced.Refusals.
	Fenced func() fenced.RefusalCounts
	// Logger receives the errors of failed sources. Default slog.Default().
	Logger *slog.Logger
}

// Collector is a prometheus.Collector that reads pgcoord's state from the database at
// every scrape.
type Collector struct {
	db   pgcoord.DBTX
	opts Opts
}

// New returns a Collector reading from db (a pool: scrapes may run concurrently). It
// returns an error wrapping pgcoord.ErrInvalidArgument for a nil db or an out-of-range
// option.
func New(db pgcoord.DBTX, opts *Opts) (*Collector, error) {
	if err := check.DB(db); err != nil {
		return nil, err
	}
	var o Opts
	if opts != nil {
		o = *opts
	}
	if o.MaxRows == 0 {
		o.MaxRows = DefaultMaxRows
	}
	if _, err := check.ListLimit(o.MaxRows); err != nil {
		return nil, err
	}
	if o.MaxStaleness < 0 || o.Timeout < 0 {
		return nil, check.Invalid("negative MaxStaleness or Timeout")
	}
	if o.MaxStaleness == 0 {
		o.MaxStaleness = DefaultMaxStaleness
	}
	if o.Timeout == 0 {
		o.Timeout = DefaultTimeout
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return &Collector{db: db, opts: o}, nil
}

// Handler serves the collector's metrics in the Prometheus text format, from a registry of
// their own (no Go runtime metrics).
func Handler(c *Collector) http.Handler {
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError})
}

// source is one primitive's metrics.
type source struct {
	name  string
	descs []*prometheus.Desc
	// collect reads the primitive's state and returns its metrics; truncated reports that
	// there were more rows than it read.
	collect func(ctx context.Context, db pgcoord.DBTX, o *Opts) (ms []prometheus.Metric, truncated bool, err error)
}

var sources []source

// register adds a source; called from the init of each source's file.
func register(s source) { sources = append(sources, s) }

var (
	upDesc = prometheus.NewDesc("pgcoord_up",
		"1 if the last scrape read the source's state from the database, 0 if its query failed.", []string{"source"}, nil)
	truncatedDesc = prometheus.NewDesc("pgcoord_rows_truncated",
		"1 if the source had more rows than one scrape reads (Opts.MaxRows): its counts are lower bounds.", []string{"source"}, nil)
)

// Describe sends the descriptors of every metric the collector may send.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- upDesc
	ch <- truncatedDesc
	for _, s := range sources {
		for _, d := range s.descs {
			ch <- d
		}
	}
}

// Collect reads every source from the database and sends its metrics.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), c.opts.Timeout)
	defer cancel()
	for _, s := range sources {
		ms, truncated, err := s.collect(ctx, c.db, &c.opts)
		if err != nil {
			c.opts.Logger.Error("pgcoord metrics: source failed", "source", s.name, "err", err)
			ch <- gauge(upDesc, 0, s.name)
			continue
		}
		ch <- gauge(upDesc, 1, s.name)
		ch <- gauge(truncatedDesc, boolValue(truncated), s.name)
		for _, m := range ms {
			ch <- m
		}
	}
}

func gauge(d *prometheus.Desc, v float64, labels ...string) prometheus.Metric {
	return prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
}

func counter(d *prometheus.Desc, v float64, labels ...string) prometheus.Metric {
	return prometheus.MustNewConstMetric(d, prometheus.CounterValue, v, labels...)
}

func boolValue(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
