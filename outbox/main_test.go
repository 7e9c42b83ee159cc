package outbox_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/outbox"
	"github.com/pgcoord/pgcoord/pgcoord"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// noSQL is a pgx.Tx on which any call panics: passing it proves that a function rejected
// its input before running any SQL.
type noSQL struct{ pgx.Tx }

// enqueue writes msgs in one committed transaction and returns them as stored.
func enqueue(t *testing.T, pool *pgxpool.Pool, msgs ...outbox.Message) []outbox.Message {
	t.Helper()
	var out []outbox.Message
	err := pgx.BeginFunc(t.Context(), pool, func(tx pgx.Tx) error {
		for _, m := range msgs {
			got, err := outbox.Enqueue(t.Context(), tx, m)
			if err != nil {
				return err
			}
			out = append(out, got)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// msg is a message of topic "t" with a text payload.
func msg(key, payload string) outbox.Message {
	return outbox.Message{Topic: "t", Key: key, Payload: []byte(payload)}
}

// walkOrder returns n keys of topic, distinct, in the order a lone relay's claim walks
// them: by bucket (a hash of topic and key, which depends on the schema), then key.
func walkOrder(t *testing.T, db pgcoord.DBTX, topic string, n int) []string {
	t.Helper()
	rows, err := db.Query(t.Context(), `SELECT k FROM (SELECT 'k' || g AS k FROM generate_series(1, $2) g) s
		ORDER BY pgcoord_outbox_bucket($1, k), k`, topic, n)
	if err != nil {
		t.Fatal(err)
	}
	keys, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return keys
}

// dbNow returns the database clock.
func dbNow(t *testing.T, db pgcoord.DBTX) time.Time {
	t.Helper()
	var now time.Time
	if err := db.QueryRow(t.Context(), "SELECT now()").Scan(&now); err != nil {
		t.Fatal(err)
	}
	return now
}

// get reads message id.
func get(t *testing.T, db pgcoord.DBTX, id int64) outbox.Message {
	t.Helper()
	m, err := outbox.Get(t.Context(), db, id)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// recorder is a Handler that records the payloads it was given, and fails those listed in
// fail.
type recorder struct {
	mu   sync.Mutex
	got  []outbox.Message
	fail map[string]bool // payloads to fail
}

func (r *recorder) Handle(_ context.Context, m outbox.Message) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.got = append(r.got, m)
	if r.fail[string(m.Payload)] {
		return errBoom
	}
	return nil
}

func (r *recorder) payloads() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, m := range r.got {
		out = append(out, string(m.Payload))
	}
	return out
}

type boom struct{}

func (boom) Error() string { return "boom" }

var errBoom error = boom{}

// newRelay returns a relay on pool with cfg (Handler h), failing t on error.
func newRelay(t *testing.T, pool *pgxpool.Pool, h outbox.Handler, cfg outbox.Config) *outbox.Relay {
	t.Helper()
	cfg.Handler = h
	r, err := outbox.NewRelay(pool, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	// A relay that claimed is a member of its partition group, heartbeating until Leave.
	t.Cleanup(func() { _ = r.Leave(context.Background()) })
	return r
}

// runBatch runs one batch of r and returns how many messages it claimed.
func runBatch(t *testing.T, r *outbox.Relay) int {
	t.Helper()
	n, err := r.RunBatch(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// waitFor waits, at most pgtest.WaitLimit, until cond holds.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(pgtest.WaitLimit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %s", pgtest.WaitLimit, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// pending counts the pending messages.
func pending(t *testing.T, db pgcoord.DBTX) int64 {
	t.Helper()
	var n int64
	if err := db.QueryRow(t.Context(), "SELECT count(*) FROM pgcoord_outbox WHERE state = 'pending'").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// openOnCleanup closes gate when the test ends, if the test has not: a Handler blocked on
// it lets its batch end, so that the relay's Leave (a cleanup registered before this one)
// does not wait for it after a failure.
func openOnCleanup(t *testing.T, gate chan struct{}) {
	t.Cleanup(func() {
		select {
		case <-gate:
		default:
			close(gate)
		}
	})
}
