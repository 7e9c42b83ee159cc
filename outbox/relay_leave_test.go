package outbox

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgcoord/pgcoord/internal/pgtest"
)

// A claim made while the relay's Leave is under way takes nothing and does not join the
// group again: a member joined again under the relay's name would take the leaving one's
// place, and the leave, which goes by name, would then remove it.
func TestClaimsDuringLeaveDoNotJoinAgain(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pgtest.Pool(t)
	enqueue := func(key string) {
		t.Helper()
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := Enqueue(ctx, tx, Message{Topic: "t", Key: key, Payload: []byte(key)})
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	enqueue("a")
	entered, release := make(chan struct{}), make(chan struct{})
	r, err := NewRelay(pool, &Config{Claimant: "leaver", Handler: HandlerFunc(func(context.Context, Message) error {
		close(entered)
		<-release
		return nil
	})})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { _, err := r.RunBatch(ctx); done <- err }()
	<-entered // a batch under way, which the Leave waits for
	left := make(chan error, 1)
	go func() { left <- r.Leave(ctx) }()
	leaving := func() bool {
		r.gmu.Lock()
		defer r.gmu.Unlock()
		return r.leaving
	}
	for deadline := time.Now().Add(pgtest.WaitLimit); !leaving(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			close(release)
			t.Fatal("the Leave did not start")
		}
	}
	enqueue("b")
	if n, err := r.RunBatch(ctx); n != 0 || err != nil {
		t.Fatalf("a batch during the Leave = %d, %v; want 0, nil", n, err)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := <-left; err != nil {
		t.Fatal(err)
	}
	r.gmu.Lock()
	member := r.member
	r.gmu.Unlock()
	var rows int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pgcoord_partition_members WHERE member = 'leaver'`).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if member != nil || rows != 0 {
		t.Fatalf("after the Leave the relay is a member (%v, %d rows): the batch during it joined again", member != nil, rows)
	}
	// The next batch joins again and takes the message left.
	if n, err := r.RunBatch(ctx); n != 1 || err != nil {
		t.Fatalf("the batch after the Leave = %d, %v; want 1", n, err)
	}
	if err := r.Leave(ctx); err != nil {
		t.Fatal(err)
	}
}
