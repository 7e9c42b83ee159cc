package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/outbox"
	"github.com/pgcoord/pgcoord/outbox/inbox"
)

// A consumer applies each message once, however often the relay delivers it: the inbox
// record and the message's effect commit in one transaction, or neither does.
func ExampleClaim() {
	ctx := context.Background()
	pool := pgtest.ExamplePool() // the consumer's *pgxpool.Pool, with pgcoord migrated
	if _, err := pool.Exec(ctx, `CREATE TABLE shipments (order_id text PRIMARY KEY)`); err != nil {
		panic(err)
	}

	crash := false // to show a delivery that dies before COMMIT
	// ship is the consumer's outbox.Handler: one delivery of one message.
	ship := outbox.HandlerFunc(func(ctx context.Context, m outbox.Message) error {
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			first, err := inbox.Claim(ctx, tx, "shipping", m.ID)
			if err != nil {
				return err
			}
			if !first {
				fmt.Println(m.ID, "applied before: acknowledged")
				return nil
			}
			if _, err := tx.Exec(ctx, `INSERT INTO shipments VALUES ($1)`, m.Key); err != nil {
				return err
			}
			if crash {
				return errors.New("crashed before COMMIT") // the record rolls back with the effect
			}
			fmt.Println(m.ID, "applied")
			return nil
		})
	})

	m := outbox.Message{ID: 7, Topic: "orders", Key: "o-42"}
	ship.Handle(ctx, m)
	ship.Handle(ctx, m) // redelivered: its answer was lost, say

	// A delivery that fails leaves no record: the redelivery applies the message.
	m = outbox.Message{ID: 8, Topic: "orders", Key: "o-43"}
	crash = true
	fmt.Println(ship.Handle(ctx, m))
	crash = false
	ship.Handle(ctx, m)
	// Output:
	// 7 applied
	// 7 applied before: acknowledged
	// crashed before COMMIT
	// 8 applied
}

func ExampleGC() {
	ctx := context.Background()
	pool := pgtest.ExamplePool() // your *pgxpool.Pool, with pgcoord migrated

	// Two messages applied by the consumer "billing".
	for _, id := range []int64{7, 8} {
		pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := inbox.Claim(ctx, tx, "billing", id)
			return err // ... and the message's effect, in tx
		})
	}

	// Run daily with the default retention of 30 days, longer than any redelivery. A
	// retention of a microsecond here, so that this example has something to collect.
	deleted, err := inbox.GC(ctx, pool, &inbox.GCOpts{OlderThan: time.Microsecond})
	fmt.Println("deleted:", deleted, err)
	// Output:
	// deleted: 2 <nil>
}
