package pgtest

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Clock is the test suite's seam for time. pgcoord's SQL reads time only through two
// functions of its schema, pgcoord_now() (the transaction's start) and pgcoord_clock() (the
// current instant); no SQL API argument and no Go option lets a caller choose "now". A
// Clock replaces those two functions in one test's schema, so a test can judge an expiry
// an hour from now without sleeping. Every connection to the schema sees the change from
// its next statement on; other schemas are not affected.
//
// Production code has no such seam: replacing the functions needs ownership of the
// schema's functions (this harness connects as the owner), and `pgcoord doctor` reports a
// clock that is not the database's.
type Clock struct {
	t    testing.TB
	pool *pgxpool.Pool

	mu     sync.Mutex
	offset time.Duration // added to the real clocks when not frozen
	frozen time.Time     // both functions return this, when not zero
}

// NewClock returns the clock of the schema pool reaches, running with the database's own
// time. The functions are put back when t ends.
func NewClock(t testing.TB, pool *pgxpool.Pool) *Clock {
	t.Helper()
	c := &Clock{t: t, pool: Direct(t, pool)}
	t.Cleanup(func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		c.offset, c.frozen = 0, time.Time{}
		_ = c.install()
	})
	return c
}

// Advance moves the clock forward by d (backward for a negative d): a frozen clock stays
// frozen at its new instant, a running one runs on d ahead of the database's.
func (c *Clock) Advance(d time.Duration) {
	c.t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.frozen.IsZero() {
		c.offset += d
	} else {
		c.frozen = c.frozen.Add(d)
	}
	c.mustInstall()
}

// Freeze stops the clock at instant at: pgcoord_now() and pgcoord_clock() both return it
// until the next Advance, Freeze or Run.
func (c *Clock) Freeze(at time.Time) {
	c.t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.frozen = at
	c.mustInstall()
}

// Run lets the clock run with the database's own time again, shifted by offset.
func (c *Clock) Run(offset time.Duration) {
	c.t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.frozen, c.offset = time.Time{}, offset
	c.mustInstall()
}

// Now returns pgcoord_now() as a new transaction on the schema sees it.
func (c *Clock) Now() time.Time {
	c.t.Helper()
	var now time.Time
	if err := c.pool.QueryRow(context.Background(), "SELECT pgcoord_now()").Scan(&now); err != nil {
		c.t.Fatalf("pgtest: clock: %v", err)
	}
	return now
}

func (c *Clock) mustInstall() {
	c.t.Helper()
	if err := c.install(); err != nil {
		c.t.Fatalf("pgtest: clock: %v", err)
	}
}

// install replaces the two functions with ones that return the clock's time.
func (c *Clock) install() error {
	now, clock := "now()", "clock_timestamp()"
	if !c.frozen.IsZero() {
		at := fmt.Sprintf("timestamptz '%s'", c.frozen.UTC().Format(time.RFC3339Nano))
		now, clock = at, at
	} else if c.offset != 0 {
		shift := fmt.Sprintf(" + interval '%d microseconds'", c.offset.Microseconds())
		now, clock = now+shift, clock+shift
	}
	_, err := c.pool.Exec(context.Background(), fmt.Sprintf(`
CREATE OR REPLACE FUNCTION pgcoord_now() RETURNS timestamptz LANGUAGE sql STABLE PARALLEL SAFE AS $$ SELECT %s $$;
CREATE OR REPLACE FUNCTION pgcoord_clock() RETURNS timestamptz LANGUAGE sql VOLATILE PARALLEL SAFE AS $$ SELECT %s $$;`,
		now, clock))
	return err
}

// At runs fn with the clock of pool's schema frozen at at, then lets it run with the
// database's own time again; with a zero at it just runs fn.
func At(t testing.TB, pool *pgxpool.Pool, at time.Time, fn func()) {
	t.Helper()
	if at.IsZero() {
		fn()
		return
	}
	clock := NewClock(t, pool)
	clock.Freeze(at)
	defer clock.Run(0)
	fn()
}
