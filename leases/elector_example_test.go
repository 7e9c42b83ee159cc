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

// Two replicas campaign for one role; when the leader shuts down, it resigns and the
// other takes over at once, with a higher fence token.
func ExampleNewElector() {
	pool := pgtest.ExamplePool()

	type term struct {
		replica string
		token   int64
	}
	terms := make(chan term)
	candidate := func(replica string) *leases.Elector {
		e, err := leases.NewElector(pool, &leases.ElectorConfig{
			Name: "billing-leader",
			OnStartedLeading: func(ctx context.Context, lease leases.Lease) {
				terms <- term{replica, lease.Token}
				<-ctx.Done() // lead until shutdown or until leadership is lost
			},
			Logger: slog.New(slog.DiscardHandler),
		})
		if err != nil {
			panic(err)
		}
		return e
	}
	run := func(e *leases.Elector) (shutdown func()) {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error)
		go func() { done <- e.Run(ctx) }()
		return func() { cancel(); <-done }
	}

	a, b := candidate("a"), candidate("b")
	stopA := run(a)
	fmt.Println("leader:", <-terms)
	stopB := run(b) // b waits: a leads
	fmt.Println("b leads:", b.IsLeader())

	stopA() // a shuts down, releasing the lease
	fmt.Println("leader:", <-terms)
	stopB()
	// Output:
	// leader: {a 1}
	// b leads: false
	// leader: {b 2}
}
