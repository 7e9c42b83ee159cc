package partition_test

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgcoord/pgcoord/fenced"
	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/partition"
)

// A sharded worker pool: each process joins the group "orders" of 16 partitions and works
// only on the partitions granted to it. Here two members share them 8 and 8; when one
// leaves, the other is granted its partitions, each under a new fence token.
func ExampleJoin() {
	ctx := context.Background()
	pool := pgtest.ExamplePool() // your *pgxpool.Pool, with pgcoord migrated

	var mu sync.Mutex
	workers := map[string]map[int]bool{} // member → the partitions it works on
	member := func(name string) *partition.Options {
		workers[name] = map[int]bool{}
		return &partition.Options{
			Partitions: 16, // creates the group if it does not exist
			Member:     name,
			OnAssign: func(p partition.Partition) {
				mu.Lock()
				defer mu.Unlock()
				workers[name][p.ID] = true // start the partition's work under p.Context
			},
			OnRevoke: func(ctx context.Context, p partition.Partition) {
				mu.Lock()
				defer mu.Unlock()
				delete(workers[name], p.ID) // p.Context is done: wait for its work to stop
			},
		}
	}
	a, err := partition.Join(ctx, pool, "orders", member("a"))
	if err != nil {
		panic(err)
	}
	b, err := partition.Join(ctx, pool, "orders", member("b"))
	if err != nil {
		panic(err)
	}
	waitUntil(func() bool { return len(a.Owned()) == 8 && len(b.Owned()) == 8 })
	fmt.Println("a:", len(a.Owned()), "b:", len(b.Owned()))

	if err := a.Leave(ctx); err != nil {
		panic(err)
	}
	waitUntil(func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(workers["b"]) == 16 // OnAssign ran for each
	})
	mu.Lock()
	fmt.Println("after a left, b works on", len(workers["b"]), "partitions, a on", len(workers["a"]))
	mu.Unlock()
	_ = b.Leave(ctx)
	// Output:
	// a: 8 b: 8
	// after a left, b works on 16 partitions, a on 0
}

// Route each key to its partition; a member works on a key only if it owns the key's
// partition.
func ExampleKeyPartition() {
	for _, key := range []string{"order:1", "order:2", "order:3"} {
		fmt.Println(key, "→ partition", partition.KeyPartition(key, 16))
	}
	// Output:
	// order:1 → partition 8
	// order:2 → partition 11
	// order:3 → partition 9
}

// A write for a partition's key, fenced: Member.Check holds the grant for the transaction
// (fenced.Check with p.Resource() refuses stale tokens of the partition as well).
func ExampleMember_Check() {
	ctx := context.Background()
	pool := pgtest.ExamplePool()
	m, err := partition.Join(ctx, pool, "ledger", &partition.Options{Partitions: 4, Member: "w1"})
	if err != nil {
		panic(err)
	}
	defer func() { _ = m.Leave(ctx) }()
	_, _ = pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS ledger_entries (key text, amount int, fence bigint)`)

	key := "account:7"
	for _, p := range m.Owned() {
		if p.ID != partition.KeyPartition(key, m.Partitions()) {
			continue
		}
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if err := m.Check(ctx, tx, p); err != nil {
				return err // partition.ErrRevoked: it moved on
			}
			if err := fenced.Check(ctx, tx, p.Resource(), p.Token); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `INSERT INTO ledger_entries VALUES ($1, 100, $2)`, key, p.Token)
			return err
		})
		fmt.Println("written by the owner of partition", p.ID, "error:", err)
	}
	// Output:
	// written by the owner of partition 3 error: <nil>
}

// An operator moves a member's partitions away before deploying it.
func ExampleDrain() {
	ctx := context.Background()
	pool := pgtest.ExamplePool()
	a, _ := partition.Join(ctx, pool, "jobs", &partition.Options{Partitions: 8, Member: "node-1"})
	b, _ := partition.Join(ctx, pool, "jobs", &partition.Options{Member: "node-2"})
	defer func() { _ = a.Leave(ctx); _ = b.Leave(ctx) }()

	drained, err := partition.Drain(ctx, pool, "jobs", "node-1", "deploy-bot")
	if err != nil {
		panic(err)
	}
	waitUntil(func() bool { return len(a.Owned()) == 0 && len(b.Owned()) == 8 })
	fmt.Println("drained:", drained, "node-1 owns", len(a.Owned()), "node-2 owns", len(b.Owned()))
	// Output:
	// drained: true node-1 owns 0 node-2 owns 8
}

// Resize a group on purpose: every grant is revoked, then all partitions are granted under
// the new count.
func ExampleResize() {
	ctx := context.Background()
	pool := pgtest.ExamplePool()
	m, _ := partition.Join(ctx, pool, "shards", &partition.Options{Partitions: 4, Member: "w"})
	defer func() { _ = m.Leave(ctx) }()

	g, err := partition.Resize(ctx, pool, "shards", 8, "ops")
	if err != nil {
		panic(err)
	}
	waitUntil(func() bool { return len(m.Owned()) == 8 })
	fmt.Println("partitions:", g.Partitions, "epoch:", g.Epoch, "owned:", len(m.Owned()))
	// Output:
	// partitions: 8 epoch: 2 owned: 8
}

// waitUntil polls cond until it holds, for the examples (whose members settle in a few
// heartbeats, woken by the group's notifications).
func waitUntil(cond func() bool) {
	deadline := time.Now().Add(pgtest.WaitLimit)
	for !cond() {
		if time.Now().After(deadline) {
			panic(fmt.Sprintf("not within %v", pgtest.WaitLimit))
		}
		time.Sleep(5 * time.Millisecond)
	}
}
