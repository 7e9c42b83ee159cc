package dedupe_test

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgcoord/pgcoord/dedupe"
	"github.com/pgcoord/pgcoord/internal/pgtest"
)

func ExampleClaim() {
	ctx := context.Background()
	pool := pgtest.ExamplePool() // your *pgxpool.Pool, with pgcoord migrated

	// A webhook handler: the provider may deliver the same event several times.
	handle := func(eventID string) error {
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			first, err := dedupe.Claim(ctx, tx, "billing-webhook", eventID, &dedupe.ClaimOpts{Retention: 30 * 24 * time.Hour})
			if err != nil {
				return err
			}
			if !first {
				fmt.Println(eventID, "already handled")
				return nil
			}
			// ... apply the event with tx: it commits together with the claim ...
			fmt.Println(eventID, "handled")
			return nil
		})
	}
	_ = handle("evt_1")
	_ = handle("evt_1") // redelivered
	_ = handle("evt_2")
	// Output:
	// evt_1 handled
	// evt_1 already handled
	// evt_2 handled
}

func ExampleClaim_rollback() {
	ctx := context.Background()
	pool := pgtest.ExamplePool()

	// A claim whose transaction rolls back leaves nothing: the retry does the work.
	for attempt := 1; attempt <= 2; attempt++ {
		tx, _ := pool.Begin(ctx)
		first, _ := dedupe.Claim(ctx, tx, "reports", "2024-W07", nil)
		fmt.Printf("attempt %d: first=%v\n", attempt, first)
		if attempt == 1 {
			tx.Rollback(ctx) // the work failed
			continue
		}
		tx.Commit(ctx)
	}
	// Output:
	// attempt 1: first=true
	// attempt 2: first=true
}

func ExampleInsertOnce() {
	ctx := context.Background()
	pool := pgtest.ExamplePool()
	pool.Exec(ctx, `CREATE TABLE email_sends (user_id bigint, campaign_id bigint, UNIQUE (user_id, campaign_id))`)

	// The weekly email job runs on three replicas; each sends to user 7 only if its
	// INSERT is the one that recorded the send.
	for replica := 1; replica <= 3; replica++ {
		inserted, err := dedupe.InsertOnce(ctx, pool,
			`INSERT INTO email_sends (user_id, campaign_id) VALUES ($1, $2) ON CONFLICT DO NOTHING`, 7, 2024)
		if err != nil {
			panic(err)
		}
		fmt.Printf("replica %d sends: %v\n", replica, inserted)
	}
	// Output:
	// replica 1 sends: true
	// replica 2 sends: false
	// replica 3 sends: false
}

func ExampleTransition() {
	ctx := context.Background()
	pool := pgtest.ExamplePool()
	pool.Exec(ctx, `CREATE TABLE orders (id bigint PRIMARY KEY, status text NOT NULL)`)
	pool.Exec(ctx, `INSERT INTO orders VALUES (42, 'pending')`)

	pay := dedupe.TransitionSpec{Table: "orders", IDColumn: "id", ID: 42, StateColumn: "status", From: "pending", To: "paid"}
	// The payment confirmation arrives twice; only one caller books it.
	for i := 1; i <= 2; i++ {
		moved, err := dedupe.Transition(ctx, pool, pay)
		if err != nil {
			panic(err)
		}
		fmt.Printf("confirmation %d moved pending -> paid: %v\n", i, moved)
	}
	// Output:
	// confirmation 1 moved pending -> paid: true
	// confirmation 2 moved pending -> paid: false
}

func ExampleGC() {
	ctx := context.Background()
	pool := pgtest.ExamplePool()

	// Two claims kept a microsecond (in practice: days, longer than any redelivery can
	// come), so that this example has something to collect; one kept forever.
	pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		dedupe.Claim(ctx, tx, "msg", "a", &dedupe.ClaimOpts{Retention: time.Microsecond})
		dedupe.Claim(ctx, tx, "msg", "b", &dedupe.ClaimOpts{Retention: time.Microsecond})
		dedupe.Claim(ctx, tx, "msg", "c", nil)
		return nil
	})

	deleted, err := dedupe.GC(ctx, pool, nil)
	fmt.Println("deleted:", deleted, err)
	// Output:
	// deleted: 2 <nil>
}
