package outbox

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

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
	r, release, done := batchUnderWay(t, pool, &Config{Claimant: "leaver"}) // which the Leave waits for
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

// TestLeaveHonoursItsContext: a Leave whose ctx ends while the batch under way still runs
// returns ctx's error then, instead of waiting out the relay's lease for the batch.
func TestLeaveHonoursItsContext(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pgtest.Pool(t)
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := Enqueue(ctx, tx, Message{Topic: "t", Key: "k", Payload: []byte("x")})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	r, release, done := batchUnderWay(t, pool, &Config{Claimant: "stuck", ClaimTTL: time.Minute})
	lctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := r.Leave(lctx)
	waited := time.Since(start)
	close(release)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Leave during a batch that does not end: %v, want DeadlineExceeded", err)
	}
	if waited > 10*time.Second {
		t.Errorf("Leave returned after %v; its ctx ended after 200ms (the relay's lease is 15s)", waited)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// batchUnderWay starts a RunBatch of a relay made with cfg (its Handler set here) and
// returns once the batch's Handler is running: it blocks until release is closed, and the
// batch's error comes on done.
func batchUnderWay(t *testing.T, pool *pgxpool.Pool, cfg *Config) (r *Relay, release chan struct{}, done chan error) {
	t.Helper()
	entered := make(chan struct{})
	release, done = make(chan struct{}), make(chan error, 1)
	cfg.Handler = HandlerFunc(func(context.Context, Message) error {
		close(entered)
		<-release
		return nil
	})
	r, err := NewRelay(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	go func() { _, err := r.RunBatch(t.Context()); done <- err }()
	<-entered
	return r, release, done
}
