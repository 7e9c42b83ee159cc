package bench_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/internal/bench"
	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/leases"
)

// TestRunLeases runs every lease scenario and floor briefly at concurrency 1 and 2 and checks
// that each was measured against the floor it names, and that the scenarios did the work
// they claim: every counted acquire_release and contended op is one grant (the fence
// tokens drawn say so), and every lease they took was released.
func TestRunLeases(t *testing.T) {
	t.Parallel()
	wantFloor := map[string]string{
		"leases.acquire_release":  "floor.lease",
		"leases.contended":        bench.FloorLeaseContended,
		"leases.handoff":          bench.FloorNotify,
		"leases.renew":            bench.FloorRenewDurable,
		bench.FloorLeaseContended: "floor.select1",
		bench.FloorNotify:         "floor.select1",
		bench.FloorRenewDurable:   "floor.select1",
	}
	// run measures the named scenarios in a bench schema of their own and checks each result.
	run := func(names []string, afterRun func(ctx context.Context, pool *pgxpool.Pool) error) []bench.Result {
		t.Helper()
		var scenarios []bench.Scenario
		for _, name := range names {
			s, ok := bench.Lookup(name)
			if !ok {
				t.Fatalf("%s is not registered", name)
			}
			scenarios = append(scenarios, s)
		}
		results, err := bench.Run(t.Context(), poolConfig(t), scenarios, &bench.Options{
			Concurrency: []int{1, 2},
			Duration:    300 * time.Millisecond,
			AfterRun:    afterRun,
		})
		if err != nil {
			t.Fatal(err)
		}
		seen := map[string]int{}
		for _, r := range results {
			seen[r.Scenario]++
			if want, ok := wantFloor[r.Scenario]; !ok || r.Floor != want {
				t.Errorf("%s c=%d: measured against %q, want %q", r.Scenario, r.Concurrency, r.Floor, want)
			}
			if r.Ops <= 0 || r.OpsPerSec <= 0 || r.FloorOpsPerSec <= 0 || r.Ratio <= 0 {
				t.Errorf("%s c=%d: empty measurement %+v", r.Scenario, r.Concurrency, r)
			}
			if r.P50 <= 0 || r.P50 > r.P99 {
				t.Errorf("%s c=%d: p50 %v, p99 %v: want 0 < p50 <= p99", r.Scenario, r.Concurrency, r.P50, r.P99)
			}
			t.Logf("%-28s c=%d %9.1f ops/s p50 %-10v p99 %-10v floor %-28s %9.1f ops/s ratio %.3f",
				r.Scenario, r.Concurrency, r.OpsPerSec, r.P50, r.P99, r.Floor, r.FloorOpsPerSec, r.Ratio)
		}
		for _, name := range names {
			if seen[name] != 2 {
				t.Errorf("%s: %d results, want one per concurrency (2)", name, seen[name])
			}
		}
		return results
	}

	// The granting scenarios, each alone in its schema: fence tokens come from one counter
	// (pgcoord_token_seq) that only grants draw from, and their floors draw none. Every op
	// of acquire_release (one lease per worker) is exactly one grant. A contended attempt
	// that waited for the row lock of a grant being made may burn a token, so contended
	// draws at least one per op.
	for _, tc := range []struct {
		scenario string
		exact    bool
	}{{"leases.acquire_release", true}, {"leases.contended", false}} {
		var drawn, held int64
		results := run([]string{tc.scenario}, func(ctx context.Context, pool *pgxpool.Pool) error {
			return pool.QueryRow(ctx, `SELECT
				(SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM pgcoord_token_seq),
				(SELECT count(*) FROM pgcoord_leases WHERE holder IS NOT NULL)`).Scan(&drawn, &held)
		})
		var ops int64
		for _, r := range results {
			ops += r.Ops
		}
		if drawn < ops || (tc.exact && drawn != ops) {
			t.Errorf("%s: %d fence tokens drawn for %d counted ops; want one grant per op", tc.scenario, drawn, ops)
		}
		if held != 0 {
			t.Errorf("%s: %d leases still held after the bench", tc.scenario, held)
		}
	}

	run([]string{"leases.handoff", "leases.renew", bench.FloorLeaseContended, bench.FloorNotify, bench.FloorRenewDurable}, nil)
}

// TestLeaseBenchesListed checks the lease scenarios' registrations: one-line descriptions,
// floors that exist, and the contended scenario saying what its ops count.
func TestLeaseBenchesListed(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"leases.acquire_release", "leases.contended", "leases.handoff", "leases.renew",
		bench.FloorLeaseContended, bench.FloorNotify, bench.FloorRenewDurable} {
		s, ok := bench.Lookup(name)
		if !ok {
			t.Errorf("%s is not registered", name)
			continue
		}
		if _, ok := bench.Lookup(s.Floor); !ok {
			t.Errorf("%s: floor %q is not registered", name, s.Floor)
		}
		if s.Description == "" || strings.Contains(s.Description, "\n") {
			t.Errorf("%s: description %q, want one line", name, s.Description)
		}
	}
	if s, _ := bench.Lookup("leases.contended"); !strings.Contains(s.Description, "successes/s") {
		t.Errorf("leases.contended must say that its ops are successes: %q", s.Description)
	}
}

// TestFailedTryAcquireWritesNothing backs leases.contended's premise and the documented
// guarantee "a failed TryAcquire writes nothing and locks nothing": a thousand refused
// TryAcquire calls on a held lease, inside one transaction, leave that transaction without
// a transaction id — so they wrote no tuple, locked no row (a row lock needs an xid) and
// their commit writes no WAL and waits for no flush — and the refused SQL call itself,
// under EXPLAIN (ANALYZE, WAL), generates zero WAL records and bytes. Both measures are of
// this session alone, so concurrent tests cannot disturb them; the controls (a granted
// acquire in the same setting) show that each measure does see a write.
func TestFailedTryAcquireWritesNothing(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	ctx := t.Context()
	const name = "held"
	holder, err := leases.TryAcquire(ctx, pool, name, time.Hour, nil)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	// Set the hint bits of the holder's row first: the first reader after a commit may
	// dirty the page (and, with checksums, log it), which is not the acquire's doing.
	if _, err := leases.TryAcquire(ctx, conn, name, time.Minute, nil); !errors.Is(err, leases.ErrHeld) {
		t.Fatalf("TryAcquire of a held lease = %v, want ErrHeld", err)
	}

	// In one transaction: 1000 refused attempts, then the transaction's xid.
	xidAfter := func(fn func(tx pgx.Tx) error) (assigned bool) {
		t.Helper()
		tx, err := conn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx) //nolint:errcheck
		if err := fn(tx); err != nil {
			t.Fatal(err)
		}
		var xid *int64
		if err := tx.QueryRow(ctx, "SELECT txid_current_if_assigned()").Scan(&xid); err != nil {
			t.Fatal(err)
		}
		// While the transaction is open, another session can lock the held lease's row: the
		// attempts left no lock on it.
		var locked bool
		err = pool.QueryRow(ctx, `SELECT NOT EXISTS (SELECT 1 FROM pgcoord_leases WHERE name = $1 FOR UPDATE SKIP LOCKED)`, name).Scan(&locked)
		if err != nil {
			t.Fatal(err)
		}
		if locked {
			t.Errorf("the held lease's row is locked by the transaction of the attempts")
		}
		return xid != nil
	}
	if xidAfter(func(tx pgx.Tx) error {
		for i := range 1000 {
			if _, err := leases.TryAcquire(ctx, tx, name, time.Minute, nil); !errors.Is(err, leases.ErrHeld) {
				return fmt.Errorf("attempt %d: %v, want ErrHeld", i, err)
			}
		}
		return nil
	}) {
		t.Errorf("1000 refused TryAcquire calls assigned a transaction id: they wrote or locked something, and their commit costs a WAL flush")
	}
	// Control: a granted acquire in the same setting does get an xid.
	if !xidAfter(func(tx pgx.Tx) error {
		_, err := leases.TryAcquire(ctx, tx, "free", time.Minute, nil)
		return err
	}) {
		t.Errorf("control: a granted TryAcquire assigned no transaction id; the measure is blind")
	}

	// The refused SQL call under EXPLAIN (ANALYZE, WAL): the WAL this backend generated.
	walOf := func(lease string) (records, bytes int64) {
		t.Helper()
		tx, err := conn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx) //nolint:errcheck
		var plan []byte
		if err := tx.QueryRow(ctx, `EXPLAIN (ANALYZE, WAL, FORMAT JSON)
			SELECT * FROM pgcoord_lease_acquire($1, 'someone-else', interval '1 minute')`, lease).Scan(&plan); err != nil {
			t.Fatal(err)
		}
		var out []struct {
			Plan struct {
				Records int64 `json:"WAL Records"`
				Bytes   int64 `json:"WAL Bytes"`
				Rows    int64 `json:"Actual Rows"`
			} `json:"Plan"`
		}
		if err := json.Unmarshal(plan, &out); err != nil || len(out) != 1 {
			t.Fatalf("EXPLAIN output %s: %v", plan, err)
		}
		return out[0].Plan.Records, out[0].Plan.Bytes
	}
	for i := range 10 { // the plpgsql plan is cached after a few calls: both kinds count
		if rec, b := walOf(name); rec != 0 || b != 0 {
			t.Errorf("refused pgcoord_lease_acquire call %d generated %d WAL records, %d bytes; want none", i, rec, b)
		}
	}
	if rec, b := walOf("free-too"); rec == 0 || b == 0 {
		t.Errorf("control: a granting pgcoord_lease_acquire call generated no WAL; the measure is blind")
	}

	if err := leases.Release(ctx, pool, holder, nil); err != nil {
		t.Fatal(err)
	}
}
