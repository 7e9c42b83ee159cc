// Package doctor checks a pgcoord installation and the database around it, and explains
// each finding: what it means for pgcoord's guarantees and what to do. `pgcoord doctor`
// prints its report, and the operator dashboard shows it.
package doctor

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Status grades a finding.
type Status string

// The statuses of a finding, from good to bad.
const (
	OK        Status = "ok"        // as it should be
	Info      Status = "info"      // worth knowing, nothing to fix
	Attention Status = "attention" // something to fix or look at
)

// Finding is the outcome of one check.
type Finding struct {
	// Check names the check: schema, notify, clock, time, transactions, replication,
	// leases, semaphores, jobs, schedules, idempotency, outbox, retention, audit, advisory.
	Check string `json:"check"`
	// Status grades it.
	Status Status `json:"status"`
	// Summary says what was found, in one line.
	Summary string `json:"summary"`
	// Explain says what it means for pgcoord and what to do; empty when all is well.
	Explain string `json:"explain,omitempty"`
}

// Options tune the checks. The zero value means the defaults.
type Options struct {
	// NotifyTimeout bounds the wait for the LISTEN/NOTIFY round trip. Default 2s.
	NotifyTimeout time.Duration
	// LongTransaction is the age from which an open transaction is reported. Default 5m.
	LongTransaction time.Duration
	// MaxStaleness is the slack after a job's period before it counts as overdue, as in
	// `pgcoord jobs check`. Default 5m.
	MaxStaleness time.Duration
	// OutboxLag is the age from which the oldest pending outbox message of a topic is
	// reported: its relays are down, or cannot keep up, or its key is parked. Default 5m.
	OutboxLag time.Duration
	// ClockTolerance is the clock difference between this host and the database from
	// which it is reported. Default 1s.
	ClockTolerance time.Duration
}

// WithDefaults returns o with every zero field set to its default.
func (o Options) WithDefaults() Options {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&o.NotifyTimeout, 2*time.Second)
	def(&o.LongTransaction, 5*time.Minute)
	def(&o.MaxStaleness, 5*time.Minute)
	def(&o.ClockTolerance, time.Second)
	def(&o.OutboxLag, 5*time.Minute)
	return o
}

// check is one check of the report.
type check struct {
	name string
	run  func(ctx context.Context, pool *pgxpool.Pool, o Options) Finding
	// needsSchema skips the check when pgcoord is not installed (or the schema check failed).
	needsSchema bool
}

var checks = []check{
	{"notify", checkNotify, false},
	{"clock", checkClock, false},
	{"time", checkTime, true},
	{"transactions", checkTransactions, false},
	{"replication", checkReplication, false},
	{"leases", checkLeases, true},
	{"semaphores", checkSemaphores, true},
	{"jobs", checkJobs, true},
	{"schedules", checkSchedules, true},
	{"partitions", checkPartitions, true},
	{"idempotency", checkIdempotency, true},
	{"outbox", checkOutbox, true},
	{"retention", checkRetention, true},
	{"audit", checkAudit, true},
	{"advisory", checkAdvisory, true},
}

// Run runs every check against the schema pool's connections resolve to and returns the
// findings, schema first. A check that cannot run (a query fails) is itself a finding
// needing attention; Run returns an error only when ctx ends.
func Run(ctx context.Context, pool *pgxpool.Pool, opts Options) ([]Finding, error) {
	o := opts.WithDefaults()
	schema, installed := checkSchema(ctx, pool)
	findings := []Finding{schema}
	for _, c := range checks {
		if err := ctx.Err(); err != nil {
			return findings, err
		}
		if c.needsSchema && !installed {
			continue
		}
		f := c.run(ctx, pool, o)
		f.Check = c.name
		findings = append(findings, f)
	}
	return findings, ctx.Err()
}

// NeedsAttention reports whether any finding needs attention.
func NeedsAttention(findings []Finding) bool {
	for _, f := range findings {
		if f.Status == Attention {
			return true
		}
	}
	return false
}

// failed is the finding of a check that could not run.
func failed(err error) Finding {
	return Finding{Status: Attention, Summary: "the check failed: " + err.Error()}
}
