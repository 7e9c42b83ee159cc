package leases_test

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/leases"
)

func ExampleElector() {
	pool := pgtest.ExamplePool() // your *pgxpool.Pool, with pgcoord migrated

	elected := make(chan int64)
	e, err := leases.NewElector(pool, &leases.ElectorConfig{
		Name: "outbox-relay",
		// Runs while this process leads; ctx ends when leadership does.
		OnStartedLeading: func(ctx context.Context, lease leases.Lease) {
			elected <- lease.Token
			// ... relay messages, sending lease.Token with every write (package fenced) ...
			<-ctx.Done()
		},
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		panic(err)
	}
	ctx, shutdown := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- e.Run(ctx) }()

	fmt.Println("leading with token", <-elected)
	fmt.Println("IsLeader:", e.IsLeader())

	shutdown() // resign: the lease is released and the next candidate is woken at once
	fmt.Println("Run returned", <-done)
	fmt.Println("IsLeader:", e.IsLeader())
	// Output:
	// leading with token 1
	// IsLeader: true
	// Run returned <nil>
	// IsLeader: false
}
