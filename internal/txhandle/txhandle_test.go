package txhandle

import (
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgcoord/pgcoord/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// Begin's transactions are real ones, each its own: what the first rolled back is gone,
// what the second committed stays; from the second on, BEGIN rides with the batch (one
// round trip instead of two); Owned refuses to end the transaction.
func TestBeginReusesTheConnectionsTx(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pgtest.Pool(t)
	if _, err := pool.Exec(ctx, `CREATE TABLE notes (n int)`); err != nil {
		t.Fatal(err)
	}
	rt := &pgtest.RoundTrips{}
	cc := pool.Config().ConnConfig.Copy()
	cc.Tracer = rt
	c, err := pgx.ConnectConfig(ctx, cc)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	var first pgx.Tx
	for i, end := range []string{"ROLLBACK", "COMMIT", "COMMIT"} {
		b := &pgx.Batch{}
		b.Queue(`INSERT INTO notes VALUES ($1)`, i)
		before := rt.N()
		tx, br, err := Begin(ctx, c, b)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := br.Exec(); err != nil {
			t.Fatal(err)
		}
		if err := br.Close(); err != nil {
			t.Fatal(err)
		}
		want := 1
		if i == 0 {
			want = 2 // the connection's first: BEGIN, then the batch
		}
		if rt.N()-before != int64(want) {
			t.Errorf("Begin %d took %d round trips, want %d", i, rt.N()-before, want)
		}
		if i == 0 {
			first = tx
		} else if tx != first {
			t.Errorf("Begin %d made a new pgx.Tx on a connection that has one", i)
		}
		owned := Owned(tx, errors.New("owned"))
		if err := owned.Commit(ctx); err == nil || owned.Rollback(ctx) == nil {
			t.Fatal("Owned let the transaction be ended")
		}
		if _, err := owned.Exec(ctx, `INSERT INTO notes VALUES ($1 + 10)`, i); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Exec(ctx, end); err != nil {
			t.Fatal(err)
		}
	}
	var notes []int
	if err := pool.QueryRow(ctx, `SELECT array_agg(n ORDER BY n) FROM notes`).Scan(&notes); err != nil {
		t.Fatal(err)
	}
	if len(notes) != 4 || notes[0] != 1 || notes[1] != 2 || notes[2] != 11 || notes[3] != 12 {
		t.Errorf("notes %v, want those of the two committed transactions: [1 2 11 12]", notes)
	}
}
