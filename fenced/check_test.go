package fenced_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/fenced"
	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/pgcoord"
)

// check runs fenced.Check in a transaction of its own, committed if the check passed and
// rolled back otherwise.
func check(ctx context.Context, pool *pgxpool.Pool, resource string, token int64) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		return fenced.Check(ctx, tx, resource, token)
	})
}

// register returns the highest token recorded for resource, or -1 if none is.
func register(t *testing.T, pool *pgxpool.Pool, resource string) int64 {
	t.Helper()
	return queryInt64(t, pool, `SELECT coalesce(max(fence_token), -1) FROM pgcoord_fences WHERE resource = $1`, resource)
}

func TestCheckAcceptsEqualOrHigherAndKeepsTheMax(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pgtest.Pool(t)

	steps := []struct {
		token     int64
		stale     bool
		wantAfter int64
	}{
		{token: 5, wantAfter: 5},              // first token of a resource
		{token: 7, wantAfter: 7},              // higher
		{token: 7, wantAfter: 7},              // equal: the same holder writing again
		{token: 6, stale: true, wantAfter: 7}, // lower
		{token: 1, stale: true, wantAfter: 7}, // much lower
		{token: 1 << 40, wantAfter: 1 << 40},  // far higher
		{token: 8, stale: true, wantAfter: 1 << 40},
	}
	for i, s := range steps {
		err := check(ctx, pool, "orders/42", s.token)
		switch {
		case s.stale && !errors.Is(err, fenced.ErrStale):
			t.Fatalf("step %d: Check(%d) = %v, want ErrStale", i, s.token, err)
		case s.stale && !strings.Contains(err.Error(), fmt.Sprint(s.token)):
			t.Errorf("step %d: ErrStale %q does not name the refused token", i, err)
		case !s.stale && err != nil:
			t.Fatalf("step %d: Check(%d) = %v, want it accepted", i, s.token, err)
		}
		if got := register(t, pool, "orders/42"); got != s.wantAfter {
			t.Fatalf("step %d: after Check(%d) the register holds %d, want %d", i, s.token, got, s.wantAfter)
		}
	}

	// Registers are per resource: another resource starts from nothing.
	if err := check(ctx, pool, "orders/43", 1); err != nil {
		t.Fatalf("Check of another resource: %v", err)
	}
	if got := register(t, pool, "orders/42"); got != 1<<40 {
		t.Errorf("checking orders/43 changed orders/42's register to %d", got)
	}
}

func TestCheckRolledBackChangesNothing(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pgtest.Pool(t)
	if err := check(ctx, pool, "r", 10); err != nil {
		t.Fatal(err)
	}
	var before string
	if err := pool.QueryRow(ctx, `SELECT row(f.*)::text FROM pgcoord_fences f WHERE resource = 'r'`).Scan(&before); err != nil {
		t.Fatal(err)
	}

	// A refused check, then a rollback.
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := fenced.Check(ctx, tx, "r", 9); !errors.Is(err, fenced.ErrStale) {
		t.Fatalf("Check(9) after 10 = %v, want ErrStale", err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	// An accepted check, then a rollback: the higher token was never committed.
	tx, err = pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := fenced.Check(ctx, tx, "r", 100); err != nil {
		t.Fatalf("Check(100): %v", err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}

	var after string
	if err := pool.QueryRow(ctx, `SELECT row(f.*)::text FROM pgcoord_fences f WHERE resource = 'r'`).Scan(&after); err != nil {
		t.Fatal(err)
	}
	if after != before {
		t.Errorf("register row after rolled-back checks = %s, want it unchanged: %s", after, before)
	}
	if err := check(ctx, pool, "r", 11); err != nil {
		t.Errorf("Check(11) after a rolled-back Check(100): %v, want it accepted", err)
	}
}

// TestCheckOrdersConcurrentWriters runs two transactions on one resource: the first checks
// its token and stays open; the second checks while the first is open. The second must
// wait for the first to end (a lock wait, seen in pg_stat_activity), and then be judged
// against what the first committed.
func TestCheckOrdersConcurrentWriters(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name          string
		first, second int64
		commitFirst   bool
		wantStale     bool
		wantRegister  int64
	}{
		{"lower after higher commits is stale", 10, 5, true, true, 10},
		{"lower after higher rolls back is accepted", 10, 5, false, false, 5},
		{"higher after lower commits is accepted", 5, 10, true, false, 10},
		{"equal after equal commits is accepted", 7, 7, true, false, 7},
	}
	for _, c := range cases {
		for _, existing := range []bool{false, true} {
			name := c.name + "/new resource"
			if existing {
				name = c.name + "/existing resource"
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				ctx := t.Context()
				pool := pgtest.Pool(t)
				want := c.wantRegister
				if existing {
					if err := check(ctx, pool, "r", 1); err != nil {
						t.Fatal(err)
					}
				}

				first, err := pool.Begin(ctx)
				if err != nil {
					t.Fatal(err)
				}
				defer func() { _ = first.Rollback(ctx) }()
				if err := fenced.Check(ctx, first, "r", c.first); err != nil {
					t.Fatalf("first Check(%d): %v", c.first, err)
				}
				second, err := pool.Begin(ctx)
				if err != nil {
					t.Fatal(err)
				}
				defer func() { _ = second.Rollback(ctx) }()
				firstPID, secondPID := pgtest.BackendPID(t, first), pgtest.BackendPID(t, second)

				p := pgtest.Go(func() (struct{}, error) { return struct{}{}, fenced.Check(ctx, second, "r", c.second) })
				pgtest.WaitBlocked(t, pool, p, secondPID, firstPID)

				if c.commitFirst {
					err = first.Commit(ctx)
				} else {
					err = first.Rollback(ctx)
				}
				if err != nil {
					t.Fatal(err)
				}
				_, err = p.Wait(t)
				if c.wantStale && !errors.Is(err, fenced.ErrStale) {
					t.Fatalf("second Check(%d) = %v, want ErrStale", c.second, err)
				}
				if !c.wantStale && err != nil {
					t.Fatalf("second Check(%d) = %v, want it accepted", c.second, err)
				}
				if err := second.Commit(ctx); err != nil {
					t.Fatal(err)
				}
				if got := register(t, pool, "r"); got != want {
					t.Errorf("register = %d, want %d", got, want)
				}
			})
		}
	}
}

// Under REPEATABLE READ or SERIALIZABLE, a check whose snapshot predates another writer's
// committed check of the same resource fails with 40001 (docs/sql-api.md,
// pgcoord_fence_check), whether that writer raised the register or wrote it with the token
// it held: every accepted check writes the register.
func TestCheckUnderSnapshotIsolationConflicts(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		iso   pgx.TxIsoLevel
		other int64 // the other writer's token, the register at 7
	}{{pgx.RepeatableRead, 9}, {pgx.RepeatableRead, 7}, {pgx.Serializable, 9}, {pgx.Serializable, 7}} {
		iso, other := c.iso, c.other
		t.Run(fmt.Sprintf("%s/%d", iso, other), func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			pool := pgtest.Pool(t)
			if err := check(ctx, pool, "r", 7); err != nil {
				t.Fatal(err)
			}
			rr, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: iso})
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = rr.Rollback(ctx) }()
			if _, err := rr.Exec(ctx, `SELECT 1 FROM pgcoord_fences`); err != nil { // takes the snapshot
				t.Fatal(err)
			}
			if err := check(ctx, pool, "r", other); err != nil {
				t.Fatal(err)
			}
			err = fenced.Check(ctx, rr, "r", other)
			if pgErr := (*pgconn.PgError)(nil); !errors.As(err, &pgErr) || pgErr.Code != "40001" {
				t.Errorf("a %s Check(%d) after another writer's committed Check(%d) = %v, want SQLSTATE 40001", iso, other, other, err)
			}
			if got := register(t, pool, "r"); got != other {
				t.Errorf("register = %d, want %d", got, other)
			}
		})
	}
}

// TestCheckHistory has writers with random tokens race to write one resource, each doing
// Check and then an insert into a log table in one transaction. Each write also takes the
// next number from a one-row counter: the row lock it holds until commit makes those
// numbers follow commit order exactly, a witness independent of the fence register. Over the whole history, the tokens of
// committed writes in commit order never decrease, and every refused token was lower than
// one committed before it was refused.
func TestCheckHistory(t *testing.T) {
	t.Parallel()
	const (
		writers   = 8
		perWriter = 40
		spread    = 8
	)
	ctx := t.Context()
	pool := pgtest.PoolMax(t, writers+1)
	exec(t, pool, `CREATE TABLE writes (token bigint NOT NULL, commit_no bigint NOT NULL UNIQUE)`)
	exec(t, pool, `CREATE TABLE commit_counter (n bigint NOT NULL)`)
	exec(t, pool, `INSERT INTO commit_counter VALUES (0)`)

	type refusal struct {
		token int64
		// highest is the register's value that the refused transaction saw committed
		// when its check was refused (read in that transaction right after).
		highest int64
	}
	var (
		mu       sync.Mutex
		refused  []refusal
		accepted int
		wg       sync.WaitGroup
		errs     = make(chan error, writers)
	)
	for w := range writers {
		wg.Go(func() {
			rnd := rand.New(rand.NewPCG(uint64(w), 42))
			for i := range perWriter {
				// Tokens drift upwards, with enough spread that writers overtake
				// each other: some writes are accepted, many are refused.
				token := 2*int64(i) + rnd.Int64N(spread) + 1
				err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					if err := fenced.Check(ctx, tx, "account/7", token); err != nil {
						if errors.Is(err, fenced.ErrStale) {
							var highest int64
							if err := tx.QueryRow(ctx, `SELECT fence_token FROM pgcoord_fences WHERE resource = 'account/7'`).Scan(&highest); err != nil {
								return err
							}
							mu.Lock()
							refused = append(refused, refusal{token, highest})
							mu.Unlock()
						}
						return err
					}
					// The write, and as part of it the commit-order witness.
					_, err := tx.Exec(ctx, `WITH c AS (UPDATE commit_counter SET n = n + 1 RETURNING n)
						INSERT INTO writes (token, commit_no) SELECT $1, n FROM c`, token)
					return err
				})
				switch {
				case errors.Is(err, fenced.ErrStale):
				case err != nil:
					errs <- err
					return
				default:
					mu.Lock()
					accepted++
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}

	rows, err := pool.Query(ctx, `SELECT token, commit_no FROM writes ORDER BY commit_no`)
	if err != nil {
		t.Fatal(err)
	}
	history, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) ([2]int64, error) {
		var v [2]int64
		err := r.Scan(&v[0], &v[1])
		return v, err
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(history) != accepted {
		t.Fatalf("%d writes committed, but %d transactions reported success", len(history), accepted)
	}
	if accepted == 0 || len(refused) == 0 || accepted+len(refused) != writers*perWriter {
		t.Fatalf("%d accepted, %d refused of %d: want both outcomes, adding up", accepted, len(refused), writers*perWriter)
	}
	var highest int64
	for i, h := range history {
		token, commitNo := h[0], h[1]
		if commitNo != int64(i+1) {
			t.Fatalf("commit numbers are not 1..%d: position %d has %d", len(history), i, commitNo)
		}
		if token < highest {
			t.Fatalf("commit %d wrote token %d after token %d had committed", commitNo, token, highest)
		}
		highest = token
	}
	if got := register(t, pool, "account/7"); got != highest {
		t.Errorf("register = %d, want the last committed token %d", got, highest)
	}
	for _, r := range refused {
		if r.token >= r.highest {
			t.Errorf("token %d was refused while the register held %d", r.token, r.highest)
		}
	}
	t.Logf("%d writes accepted, %d refused; tokens rose to %d", accepted, len(refused), highest)
}

func TestCheckBadInput(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pgtest.Pool(t)
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()

	if err := fenced.Check(ctx, tx, "", 1); !errors.Is(err, pgcoord.ErrInvalidName) {
		t.Errorf("Check with an empty resource = %v, want ErrInvalidName", err)
	}
	if err := fenced.Check(ctx, tx, strings.Repeat("x", pgcoord.MaxNameLen+1), 1); !errors.Is(err, pgcoord.ErrInvalidName) {
		t.Errorf("Check with an oversized resource = %v, want ErrInvalidName", err)
	}
	if err := fenced.Check(ctx, nil, "r", 1); !errors.Is(err, pgcoord.ErrInvalidArgument) {
		t.Errorf("Check with a nil transaction = %v, want ErrInvalidArgument", err)
	}
	for _, token := range []int64{0, -3} {
		if err := fenced.Check(ctx, tx, "r", token); !errors.Is(err, pgcoord.ErrInvalidArgument) {
			t.Errorf("Check with token %d = %v, want ErrInvalidArgument (no grant has it)", token, err)
		}
		if _, err := fenced.Write(ctx, tx, "r", token, `SELECT 1`); !errors.Is(err, pgcoord.ErrInvalidArgument) {
			t.Errorf("Write with token %d = %v, want ErrInvalidArgument", token, err)
		}
	}
	// None of them reached the database: the transaction is still usable and no
	// register row exists.
	if n := queryInt64(t, tx, `SELECT count(*) FROM pgcoord_fences`); n != 0 {
		t.Errorf("%d register rows after rejected calls, want 0", n)
	}
}
