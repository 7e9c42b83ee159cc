package sqlclients

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/examples/internal/exampletest"
	"github.com/pgcoord/pgcoord/fenced"
	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/leases"
)

// Exit codes of worker.py.
const (
	exitHeld   = 3
	exitFenced = 4
)

// workerDB is a test schema with pgcoord, the worker's orders table and orders 1 to 3, and
// what worker.py needs to reach it.
type workerDB struct {
	pool   *pgxpool.Pool
	schema string
	url    string // a libpq connection string
	python string
	// schemaURL is a connection string whose search_path is the schema, for a worker
	// started without --schema.
	schemaURL string
}

func newWorkerDB(t *testing.T) *workerDB {
	t.Helper()
	py := python(t)
	ctx := context.Background()
	pool := pgtest.Pool(t)
	ddl, err := os.ReadFile("orders.sql")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pgtest.Direct(t, pool).Exec(ctx, string(ddl)); err != nil {
		t.Fatalf("orders.sql: %v", err)
	}
	w := &workerDB{pool: pool, python: py}
	if _, err := pool.Exec(ctx, `INSERT INTO orders (id, total_cents) SELECT i, 1000 * i FROM generate_series(1, 3) i`); err != nil {
		t.Fatal(err)
	}
	if err := pool.QueryRow(ctx, `SELECT current_schema()`).Scan(&w.schema); err != nil {
		t.Fatal(err)
	}
	// The server's URL, or in pooler mode PgBouncer's: the worker selects pgcoord's schema in
	// each transaction, which works through a pooler in transaction mode too.
	w.url = libpqURL(t, pgtest.PoolerURL(t, ""), "")
	if pgtest.BehindPooler() {
		w.schemaURL = libpqURL(t, pgtest.PoolerURL(t, w.schema), "") // an alias sets search_path
	} else {
		w.schemaURL = libpqURL(t, pgtest.URL(t), w.schema)
	}
	return w
}

// libpqURL returns u, a connection string of pgtest's, for libpq: without pgx's own query
// parameter, and with a search_path of schema, if set, in libpq's options.
func libpqURL(t *testing.T, u, schema string) string {
	t.Helper()
	parsed, err := url.Parse(u)
	if err != nil {
		t.Fatal(err)
	}
	q := parsed.Query()
	q.Del("default_query_exec_mode")
	if schema != "" {
		q.Set("options", "-csearch_path="+schema)
	}
	parsed.RawQuery = q.Encode()
	return parsed.String()
}

// start starts worker.py for the order, as holder, with more arguments; it is killed when t
// ends if it still runs. With schemaFlag it passes the schema with --schema, else in the
// connection string's search_path.
func (w *workerDB) start(t *testing.T, order int, holder string, schemaFlag bool, args ...string) *exampletest.Process {
	t.Helper()
	args = append([]string{"worker.py", "--order", fmt.Sprint(order), "--holder", holder}, args...)
	url := w.schemaURL
	if schemaFlag {
		args, url = append(args, "--schema", w.schema), w.url
	}
	cmd := exec.Command(w.python, args...)
	cmd.Env = append(os.Environ(), "PGCOORD_DATABASE_URL="+url)
	return exampletest.Start(t, cmd)
}

// waitStopped waits until process p has stopped (state T in /proc).
func waitStopped(t *testing.T, p *exampletest.Process) {
	t.Helper()
	exampletest.WaitFor(t, "worker.py to stop itself", func(context.Context) (bool, error) {
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.Pid()))
		if err != nil {
			return false, fmt.Errorf("worker.py exited? %w", err)
		}
		// "pid (comm) state ...": the state follows the last parenthesis.
		fields := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
		return len(fields) > 0 && fields[0] == "T", nil
	})
}

// order returns the order's status and fence token, and the payloads of the outbox
// messages of its key.
func (w *workerDB) order(t *testing.T, id int) (status string, token int64, messages []string) {
	t.Helper()
	err := w.pool.QueryRow(context.Background(), `
		SELECT o.status, coalesce(o.fence_token, 0),
		       ARRAY(SELECT m.topic || ' ' || m.state || ' ' || convert_from(m.payload, 'UTF8')
		               FROM pgcoord_outbox m WHERE m.key = 'order-' || o.id ORDER BY m.id)
		  FROM orders o WHERE o.id = $1`, id).Scan(&status, &token, &messages)
	if err != nil {
		t.Fatal(err)
	}
	return status, token, messages
}

// The worker takes the lease, pays the order through the fence with its token, enqueues
// the message in the same transaction, and releases the lease; given pgcoord's schema with
// --schema, or on the connection's search_path.
func TestPythonWorkerPaysThroughTheFence(t *testing.T) {
	t.Parallel()
	for _, schemaFlag := range []bool{true, false} {
		t.Run(fmt.Sprintf("--schema=%v", schemaFlag), func(t *testing.T) {
			t.Parallel()
			payOrder(t, schemaFlag)
		})
	}
}

func payOrder(t *testing.T, schemaFlag bool) {
	t.Helper()
	w := newWorkerDB(t)
	code, out := w.start(t, 1, "py-a", schemaFlag).Wait(t)
	if code != 0 {
		t.Fatalf("worker.py exited with %d; output:\n%s", code, out)
	}
	ctx := context.Background()
	var holder *string
	var leaseToken, fenceToken int64
	err := w.pool.QueryRow(ctx, `
		SELECT l.holder, l.fence_token, f.fence_token
		  FROM pgcoord_leases l JOIN pgcoord_fences f ON f.resource = l.name
		 WHERE l.name = 'order:1'`).Scan(&holder, &leaseToken, &fenceToken)
	if err != nil {
		t.Fatalf("the lease and fence register of order:1: %v", err)
	}
	if holder != nil || leaseToken < 1 || fenceToken != leaseToken {
		t.Errorf("lease order:1: holder %v, token %d, register %d; want released, and the register at the lease's token", holder, leaseToken, fenceToken)
	}
	if want := fmt.Sprintf("order:1: paid with fence token %d;", leaseToken); !strings.Contains(out, want) {
		t.Errorf("output does not say %q:\n%s", want, out)
	}
	status, token, messages := w.order(t, 1)
	if status != "paid" || token != leaseToken {
		t.Errorf("order 1: %s with token %d, want paid with %d", status, token, leaseToken)
	}
	if len(messages) != 1 {
		t.Fatalf("outbox messages of order-1: %q, want one", messages)
	}
	topic, rest, _ := strings.Cut(messages[0], " ")
	state, payload, _ := strings.Cut(rest, " ")
	var got map[string]any
	if err := json.Unmarshal([]byte(payload), &got); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"event": "paid", "order_id": 1.0, "fence_token": float64(leaseToken)}
	if topic != "orders" || state != "pending" || fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("outbox message: topic %s, state %s, payload %v; want orders, pending, %v", topic, state, got, want)
	}
}

// While a Go holder has the order's lease, the worker does nothing and says so.
func TestPythonWorkerSkipsAHeldLease(t *testing.T) {
	t.Parallel()
	w := newWorkerDB(t)
	if _, err := leases.TryAcquire(context.Background(), w.pool, "order:2", time.Hour, nil); err != nil {
		t.Fatal(err)
	}
	code, out := w.start(t, 2, "py-a", true).Wait(t)
	if code != exitHeld || !strings.Contains(out, "order:2: held by another worker") {
		t.Fatalf("worker.py exited with %d, want %d (held); output:\n%s", code, exitHeld, out)
	}
	if status, _, messages := w.order(t, 2); status != "new" || len(messages) != 0 {
		t.Errorf("order 2 is %s with messages %q; want new and none", status, messages)
	}
}

// The incident of the paused payment worker, with a real pause: the worker takes the lease
// for one second and stops (SIGSTOP). When the database says the lease expired, a Go worker
// takes it over — and pays the order through the fence, or not yet. Then the Python worker
// wakes up (SIGCONT) and tries to pay: the fence refuses its token (SQLSTATE PGC01), its
// transaction aborts, and neither its payment nor its message exists.
func TestPythonWorkerStalledPastItsLeaseIsFenced(t *testing.T) {
	t.Parallel()
	for _, newerWrote := range []bool{true, false} {
		t.Run(fmt.Sprintf("newer holder wrote=%v", newerWrote), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			w := newWorkerDB(t)
			p := w.start(t, 3, "py-stalled", true, "--ttl", "1", "--stall")
			waitStopped(t, p)

			var b leases.Lease
			exampletest.WaitFor(t, "the stalled worker's lease to expire", func(ctx context.Context) (bool, error) {
				var err error
				b, err = leases.TryAcquire(ctx, w.pool, "order:3", time.Minute, &leases.AcquireOpts{Holder: "go-b"})
				if errors.Is(err, leases.ErrHeld) {
					return false, nil
				}
				return err == nil, err
			})
			if newerWrote {
				err := pgx.BeginFunc(ctx, w.pool, func(tx pgx.Tx) error {
					_, err := fenced.Write(ctx, tx, "order:3", b.Token,
						`UPDATE orders SET status = 'paid', fence_token = $1 WHERE id = 3`, b.Token)
					return err
				})
				if err != nil {
					t.Fatal(err)
				}
			}

			if err := p.Signal(syscall.SIGCONT); err != nil {
				t.Fatal(err)
			}
			code, out := p.Wait(t)
			if code != exitFenced || !strings.Contains(out, "fenced out, nothing written (SQLSTATE PGC01") {
				t.Fatalf("worker.py exited with %d, want %d (fenced out, SQLSTATE PGC01); output:\n%s", code, exitFenced, out)
			}
			status, token, messages := w.order(t, 3)
			wantStatus, wantToken := "new", int64(0)
			if newerWrote {
				wantStatus, wantToken = "paid", b.Token
			}
			if status != wantStatus || token != wantToken || len(messages) != 0 {
				t.Errorf("order 3: %s with token %d and messages %q; want %s with %d and none", status, token, messages, wantStatus, wantToken)
			}
			var holder string
			if err := w.pool.QueryRow(ctx, `SELECT holder FROM pgcoord_leases WHERE name = 'order:3'`).Scan(&holder); err != nil || holder != "go-b" {
				t.Errorf("lease order:3 held by %q (%v), want go-b (the stalled worker's release changed nothing)", holder, err)
			}
		})
	}
}
