package dedupe_test

import (
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgcoord/pgcoord/dedupe"
	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/pgcoord"
)

// orderStatus returns order id's status.
func orderStatus(t *testing.T, db pgcoord.DBTX, table string, id int) string {
	t.Helper()
	var s string
	if err := db.QueryRow(t.Context(), `SELECT status::text FROM `+table+` WHERE id = $1`, id).Scan(&s); err != nil {
		t.Fatal(err)
	}
	return s
}

var payOrder = dedupe.TransitionSpec{Table: "orders", IDColumn: "id", ID: 42, StateColumn: "status", From: "pending", To: "paid"}

func TestTransitionOnlyFromTheExpectedState(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pgtest.Pool(t)
	exec(t, pool, `CREATE TABLE orders (id int PRIMARY KEY, status text NOT NULL)`)
	exec(t, pool, `INSERT INTO orders VALUES (42, 'pending'), (43, 'pending')`)

	if ok, err := dedupe.Transition(ctx, pool, payOrder); err != nil || !ok {
		t.Fatalf("pending -> paid = %v, %v; want true", ok, err)
	}
	if ok, err := dedupe.Transition(ctx, pool, payOrder); err != nil || ok {
		t.Fatalf("pending -> paid again = %v, %v; want false", ok, err)
	}
	if s := orderStatus(t, pool, "orders", 42); s != "paid" {
		t.Fatalf("order 42 is %s", s)
	}
	if s := orderStatus(t, pool, "orders", 43); s != "pending" {
		t.Fatalf("order 43 changed to %s", s)
	}
	// A missing row is no transition either.
	missing := payOrder
	missing.ID = 1000
	if ok, err := dedupe.Transition(ctx, pool, missing); err != nil || ok {
		t.Fatalf("transition of a missing row = %v, %v; want false", ok, err)
	}
	// The next step of the state machine.
	ship := payOrder
	ship.From, ship.To = "paid", "shipped"
	if ok, err := dedupe.Transition(ctx, pool, ship); err != nil || !ok {
		t.Fatalf("paid -> shipped = %v, %v; want true", ok, err)
	}
}

// Of many concurrent transitions of one row, exactly one wins; the losers that waited for
// its commit re-check the committed row under READ COMMITTED.
func TestTransitionConcurrentExactlyOneWins(t *testing.T) {
	t.Parallel()
	const n = 16
	ctx := t.Context()
	pool := pgtest.PoolMax(t, n+1)
	exec(t, pool, `CREATE TABLE orders (id int PRIMARY KEY, status text NOT NULL)`)
	for round := range 5 {
		exec(t, pool, `INSERT INTO orders VALUES ($1, 'pending')`, round)
		spec := payOrder
		spec.ID = round
		var (
			wg   sync.WaitGroup
			mu   sync.Mutex
			wins int
			errs []error
		)
		start := make(chan struct{})
		for i := range n {
			wg.Go(func() {
				<-start
				// Half in transactions that do more work before committing, so others wait.
				var ok bool
				var err error
				if i%2 == 0 {
					err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
						if ok, err = dedupe.Transition(ctx, tx, spec); err != nil || !ok {
							return err
						}
						_, err := tx.Exec(ctx, `SELECT pg_sleep(0.01)`)
						return err
					})
				} else {
					ok, err = dedupe.Transition(ctx, pool, spec)
				}
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					errs = append(errs, err)
				}
				if ok {
					wins++
				}
			})
		}
		close(start)
		wg.Wait()
		if len(errs) > 0 || wins != 1 {
			t.Fatalf("round %d: %d of %d concurrent transitions won (errors %v); want exactly 1", round, wins, n, errs)
		}
	}
}

// A transition waiting for another transaction's transition of the row gets false under
// READ COMMITTED, and 40001 under REPEATABLE READ.
func TestTransitionIsolationLevels(t *testing.T) {
	t.Parallel()
	for _, iso := range []pgx.TxIsoLevel{pgx.ReadCommitted, pgx.RepeatableRead, pgx.Serializable} {
		t.Run(strings.ReplaceAll(string(iso), " ", "_"), func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			pool := pgtest.PoolMax(t, 4)
			exec(t, pool, `CREATE TABLE orders (id int PRIMARY KEY, status text NOT NULL)`)
			exec(t, pool, `INSERT INTO orders VALUES (42, 'pending')`)
			loser := begin(t, pool, pgx.TxOptions{IsoLevel: iso})
			exec(t, loser, `SELECT 1`) // takes the snapshot
			winner := begin(t, pool, pgx.TxOptions{})
			if ok, err := dedupe.Transition(ctx, winner, payOrder); err != nil || !ok {
				t.Fatalf("winner = %v, %v", ok, err)
			}
			waiter, blocker := pgtest.BackendPID(t, loser), pgtest.BackendPID(t, winner)
			p := pgtest.Go(func() (bool, error) { return dedupe.Transition(ctx, loser, payOrder) })
			pgtest.WaitBlocked(t, pool, p, waiter, blocker)
			if err := winner.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			ok, err := p.Wait(t)
			if iso == pgx.ReadCommitted {
				if err != nil || ok {
					t.Fatalf("READ COMMITTED loser = %v, %v; want false", ok, err)
				}
			} else if ok || sqlState(err) != "40001" {
				t.Fatalf("%s loser = %v, %v; want SQLSTATE 40001", iso, ok, err)
			}
			_ = loser.Rollback(ctx)
			if s := orderStatus(t, pool, "orders", 42); s != "paid" {
				t.Fatalf("order is %s", s)
			}
		})
	}
}

// Identifiers are quoted, so odd names work and nothing can be injected; a schema-qualified
// table and an enum state column work.
func TestTransitionIdentifiersAndTypes(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pgtest.Pool(t)
	var schema string
	if err := pool.QueryRow(ctx, `SELECT current_schema()`).Scan(&schema); err != nil {
		t.Fatal(err)
	}
	exec(t, pool, `CREATE TYPE order_state AS ENUM ('pending', 'paid')`)
	exec(t, pool, `CREATE TABLE "Odd Orders" ("Order ID" text PRIMARY KEY, "state; DROP" order_state NOT NULL)`)
	exec(t, pool, `INSERT INTO "Odd Orders" VALUES ('o-1', 'pending')`)
	spec := dedupe.TransitionSpec{Table: schema + ".Odd Orders", IDColumn: "Order ID", ID: "o-1", StateColumn: "state; DROP", From: "pending", To: "paid"}
	if ok, err := dedupe.Transition(ctx, pool, spec); err != nil || !ok {
		t.Fatalf("transition on odd names and an enum = %v, %v; want true", ok, err)
	}
	if ok, err := dedupe.Transition(ctx, pool, spec); err != nil || ok {
		t.Fatalf("again = %v, %v; want false", ok, err)
	}
	// A state outside the enum is the server's error.
	bad := spec
	bad.To = "refunded"
	if _, err := dedupe.Transition(ctx, pool, bad); sqlState(err) != "22P02" {
		t.Fatalf("state outside the enum: %v, want SQLSTATE 22P02", err)
	}
	// A table or column that does not exist is the server's error.
	missing := payOrder
	if _, err := dedupe.Transition(ctx, pool, missing); sqlState(err) != "42P01" {
		t.Fatalf("missing table: %v, want SQLSTATE 42P01", err)
	}
	// Names are matched exactly: an unquoted-style lower-case name is another table.
	lower := spec
	lower.Table = "odd orders"
	if _, err := dedupe.Transition(ctx, pool, lower); sqlState(err) != "42P01" {
		t.Fatalf("lower-cased table name: %v, want SQLSTATE 42P01", err)
	}
}

// An id column that is not unique changes several rows: true, with ErrNotUnique.
func TestTransitionNotUnique(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pgtest.Pool(t)
	exec(t, pool, `CREATE TABLE orders (id int, status text)`)
	exec(t, pool, `INSERT INTO orders VALUES (42, 'pending'), (42, 'pending')`)
	tx := begin(t, pool, pgx.TxOptions{})
	ok, err := dedupe.Transition(ctx, tx, payOrder)
	if !ok || !errors.Is(err, dedupe.ErrNotUnique) {
		t.Fatalf("transition of two rows = %v, %v; want true and ErrNotUnique", ok, err)
	}
	_ = tx.Rollback(ctx)
	if n := queryInt64(t, pool, `SELECT count(*) FROM orders WHERE status = 'pending'`); n != 2 {
		t.Fatalf("%d pending after rollback, want 2", n)
	}
}

func TestTransitionRejectsBadInputBeforeSQL(t *testing.T) {
	t.Parallel()
	with := func(f func(*dedupe.TransitionSpec)) dedupe.TransitionSpec {
		s := payOrder
		f(&s)
		return s
	}
	cases := map[string]dedupe.TransitionSpec{
		"empty table":          with(func(s *dedupe.TransitionSpec) { s.Table = "" }),
		"empty schema":         with(func(s *dedupe.TransitionSpec) { s.Table = ".orders" }),
		"three parts":          with(func(s *dedupe.TransitionSpec) { s.Table = "a.b.c" }),
		"long table":           with(func(s *dedupe.TransitionSpec) { s.Table = strings.Repeat("t", 64) }),
		"NUL in table":         with(func(s *dedupe.TransitionSpec) { s.Table = "ord\x00ers" }),
		"bad UTF-8 column":     with(func(s *dedupe.TransitionSpec) { s.StateColumn = "st\xffate" }),
		"empty id column":      with(func(s *dedupe.TransitionSpec) { s.IDColumn = "" }),
		"empty state column":   with(func(s *dedupe.TransitionSpec) { s.StateColumn = "" }),
		"same columns":         with(func(s *dedupe.TransitionSpec) { s.StateColumn = "id" }),
		"nil id":               with(func(s *dedupe.TransitionSpec) { s.ID = nil }),
		"from equals to":       with(func(s *dedupe.TransitionSpec) { s.To = "pending" }),
		"NUL in state":         with(func(s *dedupe.TransitionSpec) { s.To = "pa\x00id" }),
		"bad UTF-8 from state": with(func(s *dedupe.TransitionSpec) { s.From = "\xff" }),
	}
	for what, spec := range cases {
		if ok, err := dedupe.Transition(t.Context(), noSQL{}, spec); ok || !errors.Is(err, pgcoord.ErrInvalidArgument) {
			t.Errorf("%s: Transition = %v, %v; want ErrInvalidArgument", what, ok, err)
		}
	}
	if _, err := dedupe.Transition(t.Context(), nil, payOrder); !errors.Is(err, pgcoord.ErrInvalidArgument) {
		t.Errorf("nil db: %v, want ErrInvalidArgument", err)
	}
	// The longest identifier is accepted.
	if _, err := dedupe.Transition(t.Context(), nil, with(func(s *dedupe.TransitionSpec) { s.Table = strings.Repeat("t", 63) })); !strings.Contains(err.Error(), "nil") {
		t.Errorf("a 63-byte table name was refused: %v", err)
	}
}
