package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/examples/internal/exampletest"
	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/outbox"
	"github.com/pgcoord/pgcoord/outbox/sink"
)

func TestMain(m *testing.M) { exampletest.Main(m, main) }

// newPool returns a pool on a fresh schema with pgcoord and the example's tables.
func newPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool := pgtest.Pool(t)
	if err := createTables(context.Background(), pgtest.Direct(t, pool), "outbox-webhook", schema); err != nil {
		t.Fatal(err)
	}
	return pool
}

// flakyReceiver is the shipping service's endpoint with a bad day: it counts the
// deliveries of each message, and fails the first delivery of two messages in three —
// one way or the other.
type flakyReceiver struct {
	next       http.Handler
	mu         sync.Mutex
	deliveries map[int64]int // message id -> deliveries
}

// downFirst and lostFirst say how the first delivery of a message fails, if it does.
func downFirst(messageID int64) bool { return messageID%3 == 0 } // refused before shipping
func lostFirst(messageID int64) bool { return messageID%3 == 1 } // shipped, answer lost

func (f *flakyReceiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	id, _ := strconv.ParseInt(r.Header.Get(sink.HeaderIdempotencyKey), 10, 64)
	f.mu.Lock()
	f.deliveries[id]++
	first := f.deliveries[id] == 1
	f.mu.Unlock()
	switch {
	case first && downFirst(id):
		http.Error(w, "shipping is down", http.StatusServiceUnavailable)
	case first && lostFirst(id):
		f.next.ServeHTTP(httptest.NewRecorder(), r) // ships, but the answer never reaches the relay
		http.Error(w, "gateway timeout", http.StatusGatewayTimeout)
	default:
		f.next.ServeHTTP(w, r)
	}
}

// shipped returns how many shipments each order got.
func shipped(t *testing.T, pool *pgxpool.Pool) map[int64]int {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT order_id, count(*) FROM shipments GROUP BY order_id`)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (s [2]int64, err error) {
		return s, row.Scan(&s[0], &s[1])
	})
	if err != nil {
		t.Fatal(err)
	}
	m := map[int64]int{}
	for _, s := range got {
		m[s[0]] = int(s[1])
	}
	return m
}

// drained reports whether every message of the outbox is delivered (none pending or dead).
func drained(ctx context.Context, pool *pgxpool.Pool) (bool, error) {
	stats, err := outbox.Stats(ctx, pool, nil)
	return len(stats) == 0, err
}

var errRollback = errors.New("the order's transaction fails")

// Four producers place 96 orders for five customers, and one order in four rolls back
// after its message was written. The receiver fails the first delivery of two messages in
// three: refused before shipping, or shipped with the answer lost. Every committed order is
// shipped exactly once — the refused ones on their redelivery, the lost ones not again —
// and no rolled-back order is ever delivered.
func TestEveryCommittedOrderShippedOnce(t *testing.T) {
	t.Parallel()
	const producers, perProducer = 4, 24
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pool := newPool(t)
	receiver := &flakyReceiver{next: receive(pool, slog.New(slog.DiscardHandler)), deliveries: map[int64]int{}}
	srv := httptest.NewServer(receiver)
	defer srv.Close()

	done := make(chan error)
	go func() {
		done <- run(ctx, pool, config{Addr: "127.0.0.1:0", WebhookURL: srv.URL + "/webhooks/orders",
			Backoff: 10 * time.Millisecond, Poll: 20 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	}()

	var mu sync.Mutex
	committed, rolledBack := map[int64]bool{}, map[int64]bool{}
	var wg sync.WaitGroup
	errs := make(chan error, producers)
	for p := range producers {
		wg.Go(func() {
			for i := range perProducer {
				var o order
				err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) (err error) {
					o, err = insertOrder(ctx, tx, order{Customer: fmt.Sprintf("customer-%d", (p+i)%5), AmountCents: 100})
					if err == nil && i%4 == 3 {
						err = errRollback
					}
					return err
				})
				if err != nil && !errors.Is(err, errRollback) {
					errs <- err
					return
				}
				mu.Lock()
				if err == nil {
					committed[o.ID] = true
				} else {
					rolledBack[o.ID] = true
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	exampletest.WaitFor(t, "every committed order shipped, every message delivered", func(ctx context.Context) (bool, error) {
		ok, err := drained(ctx, pool)
		return ok && len(shipped(t, pool)) == len(committed), err
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("run: %v", err)
	}

	ships := shipped(t, pool)
	for id := range committed {
		if ships[id] != 1 {
			t.Errorf("committed order %d shipped %d times, want 1", id, ships[id])
		}
	}
	for id := range rolledBack {
		if ships[id] != 0 {
			t.Errorf("rolled-back order %d shipped %d times, want 0", id, ships[id])
		}
	}
	if len(ships) != len(committed) || len(committed) != producers*perProducer*3/4 {
		t.Errorf("%d orders shipped, %d committed; want %d of each", len(ships), len(committed), producers*perProducer*3/4)
	}
	receiver.mu.Lock()
	defer receiver.mu.Unlock()
	if len(receiver.deliveries) != len(committed) {
		t.Errorf("%d messages delivered, want %d: one per committed order", len(receiver.deliveries), len(committed))
	}
	retried := 0
	for id, n := range receiver.deliveries {
		if (downFirst(id) || lostFirst(id)) && n < 2 {
			t.Errorf("message %d, whose first delivery failed, was delivered %d times; want a redelivery", id, n)
		}
		if n > 1 {
			retried++
		}
	}
	t.Logf("%d of %d messages delivered more than once", retried, len(receiver.deliveries))
}

// freeAddr returns a local address no one listens on (for the program's ADDR).
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// The program itself: started with PGCOORD_DATABASE_URL and ADDR, without WEBHOOK_URL, it
// takes orders on POST /orders and relays them to its own receiver, which ships each once;
// it exits 0 on SIGTERM, and fails clearly without PGCOORD_DATABASE_URL.
func TestMainProgram(t *testing.T) {
	t.Parallel()
	const orders = 5
	pool := pgtest.Pool(t)
	addr := freeAddr(t)
	p := exampletest.StartMain(t, exampletest.EnvDatabaseURL+"="+exampletest.DatabaseURL(t, pool), "ADDR="+addr)
	placeOrder := func() (*http.Response, error) {
		return http.Post("http://"+addr+"/orders", "application/json", strings.NewReader(`{"customer": "acme", "amount_cents": 4200}`))
	}
	exampletest.WaitFor(t, "the order API answers", func(context.Context) (bool, error) {
		resp, err := placeOrder()
		if err != nil {
			return false, nil // connection refused until it listens
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusCreated {
			return false, fmt.Errorf("POST /orders: %s, want 201", resp.Status)
		}
		return true, nil
	})
	for range orders - 1 {
		resp, err := placeOrder()
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusCreated {
			t.Fatalf("POST /orders: %s, want 201", resp.Status)
		}
	}
	exampletest.WaitFor(t, "every order shipped", func(ctx context.Context) (bool, error) {
		ok, err := drained(ctx, pool)
		return ok && len(shipped(t, pool)) == orders, err
	})
	p.Stop(t)
	for id, n := range shipped(t, pool) {
		if n != 1 {
			t.Errorf("order %d shipped %d times, want 1", id, n)
		}
	}
	if n := exampletest.Count(t, pool, `SELECT count(*) FROM orders`); n != orders {
		t.Errorf("%d orders, want %d", n, orders)
	}

	code, out := exampletest.RunMain(t)
	if code != 1 || !strings.Contains(out, "PGCOORD_DATABASE_URL is not set") {
		t.Errorf("without PGCOORD_DATABASE_URL: exit code %d, output %q; want 1 and the variable named", code, out)
	}
}

// The program's server disconnects a client that sends its headers a byte at a time
// (slowloris) once the header timeout has passed, instead of holding a connection for it.
func TestServerDisconnectsSlowloris(t *testing.T) {
	saved := headerTimeout
	headerTimeout = 200 * time.Millisecond
	t.Cleanup(func() { headerTimeout = saved })
	ctx, cancel := context.WithCancel(t.Context())
	addr, done := freeAddr(t), make(chan error, 1)
	go func() {
		done <- serve(ctx, addr, http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
			t.Error("the handler ran for a request whose headers never ended")
		}))
	}()
	sent := exampletest.Slowloris(t, addr)
	t.Logf("disconnected after %d header bytes sent one by one", sent)
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
