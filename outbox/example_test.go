package outbox_test

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/outbox"
	"github.com/pgcoord/pgcoord/outbox/inbox"
)

func ExampleEnqueue() {
	ctx := context.Background()
	pool := pgtest.ExamplePool() // your *pgxpool.Pool, with pgcoord migrated
	pool.Exec(ctx, `CREATE TABLE orders (id text PRIMARY KEY, total int)`)

	// The business change and its message commit together, or not at all.
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO orders VALUES ('o-42', 1999)`); err != nil {
			return err
		}
		_, err := outbox.Enqueue(ctx, tx, outbox.Message{
			Topic: "orders", Key: "o-42", JSON: true,
			Payload: []byte(`{"event": "order_placed", "id": "o-42", "total": 1999}`),
		})
		return err
	})
	fmt.Println("committed:", err == nil)

	stats, _ := outbox.Stats(ctx, pool, nil)
	fmt.Printf("%s: %d pending\n", stats[0].Topic, stats[0].Pending)
	// Output:
	// committed: true
	// orders: 1 pending
}

func ExampleRelay() {
	ctx := context.Background()
	pool := pgtest.ExamplePool()
	pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		for _, ev := range []string{"placed", "paid", "shipped"} {
			outbox.Enqueue(ctx, tx, outbox.Message{Topic: "orders", Key: "o-42", Payload: []byte(ev)})
		}
		return nil
	})

	delivered := make(chan string)
	relay, err := outbox.NewRelay(pool, &outbox.Config{
		Handler: outbox.HandlerFunc(func(ctx context.Context, m outbox.Message) error {
			delivered <- fmt.Sprintf("%d %s/%s %s", m.ID, m.Topic, m.Key, m.Payload) // publish it somewhere
			return nil
		}),
	})
	if err != nil {
		panic(err)
	}
	ctx, stop := context.WithCancel(ctx)
	done := make(chan error)
	go func() { done <- relay.Run(ctx) }() // runs until ctx ends
	for range 3 {
		fmt.Println(<-delivered) // one key: in commit order
	}
	stop()
	<-done
	// Output:
	// 1 orders/o-42 placed
	// 2 orders/o-42 paid
	// 3 orders/o-42 shipped
}

// A consumer applies each message once, however often it is delivered.
func ExampleHandlerFunc_inbox() {
	ctx := context.Background()
	pool := pgtest.ExamplePool()
	pool.Exec(ctx, `CREATE TABLE balances (account text PRIMARY KEY, cents bigint)`)
	pool.Exec(ctx, `INSERT INTO balances VALUES ('acme', 0)`)

	credit := outbox.HandlerFunc(func(ctx context.Context, m outbox.Message) error {
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			first, err := inbox.Claim(ctx, tx, "ledger", m.ID)
			if err != nil || !first {
				return err // already applied: acknowledge
			}
			_, err = tx.Exec(ctx, `UPDATE balances SET cents = cents + 500 WHERE account = $1`, m.Key)
			return err
		})
	})
	m := outbox.Message{ID: 7, Topic: "payments", Key: "acme"}
	credit.Handle(ctx, m)
	credit.Handle(ctx, m) // redelivered
	var cents int64
	pool.QueryRow(ctx, `SELECT cents FROM balances WHERE account = 'acme'`).Scan(&cents)
	fmt.Println("balance:", cents)
	// Output:
	// balance: 500
}

func ExampleGC() {
	ctx := context.Background()
	pool := pgtest.ExamplePool()
	// Run daily: delete what was delivered more than 7 days ago, 1000 rows per statement.
	deleted, err := outbox.GC(ctx, pool, &outbox.GCOpts{OlderThan: 7 * 24 * time.Hour})
	fmt.Println(deleted, err)
	// Output:
	// 0 <nil>
}
