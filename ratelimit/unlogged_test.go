package ratelimit_test

import (
	"errors"
	"testing"
	"time"

	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/pgcoord"
	"github.com/pgcoord/pgcoord/ratelimit"
)

// An unlogged policy decides exactly as a durable one, alone and nested with one, with its
// keys in the UNLOGGED table; Cancel, Reset, State, Delete and gc reach them there; and its
// mode cannot change under its keys. (What a crash or a failover does to them:
// integration_test/TestFailoverRatelimitUnloggedKeysReset.)
func TestUnloggedPolicy(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	clock := pgtest.NewClock(t, pool)
	clock.Freeze(t0)
	u := mustSet(t, pool, ratelimit.Policy{Name: "fast", Rate: 1, Period: time.Second, Burst: 2, Unlogged: true})
	if !u.Unlogged {
		t.Fatalf("Set returned %+v, want Unlogged", u)
	}
	mustSet(t, pool, ratelimit.Policy{Name: "durable", Rate: 1, Period: time.Second, Burst: 3})
	rows := func(table string) (n int) {
		t.Helper()
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+table).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	var persistence string
	if err := pool.QueryRow(ctx, `SELECT relpersistence FROM pg_class WHERE oid = 'pgcoord_ratelimit_state_unlogged'::regclass`).Scan(&persistence); err != nil || persistence != "u" {
		t.Fatalf("the unlogged keys' table has persistence %q (%v), want u", persistence, err)
	}

	// Alone: a burst of 2, then refused for a second.
	k := lim("fast", "k")
	for i := range 2 {
		if d := allow(t, pool, 1, k); !d.Allowed || d.Remaining != int64(1-i) {
			t.Fatalf("call %d: %+v", i, d)
		}
	}
	if d := allow(t, pool, 1, k); d.Allowed || d.RetryAfter != time.Second {
		t.Fatalf("third call: %+v, want refused for 1s", d)
	}
	if rows("pgcoord_ratelimit_state_unlogged") != 1 || rows("pgcoord_ratelimit_state") != 0 {
		t.Fatal("the unlogged policy's key is not (only) in the unlogged table")
	}
	if st, err := ratelimit.State(ctx, pool, k); err != nil || st.Remaining != 0 || st.ResetAfter != 2*time.Second {
		t.Fatalf("State = %+v, %v", st, err)
	}

	// Nested with a durable policy: all or nothing across the two tables.
	both := []ratelimit.Limit{lim("fast", "n"), lim("durable", "n")}
	for range 2 {
		if d := allow(t, pool, 1, both...); !d.Allowed {
			t.Fatalf("nested: %+v", d)
		}
	}
	if d := allow(t, pool, 1, both...); d.Allowed || d.Policy != "fast" {
		t.Fatalf("nested third call: %+v, want refused by fast", d)
	}
	if st, _ := ratelimit.State(ctx, pool, lim("durable", "n")); st.Remaining != 1 {
		t.Fatalf("the durable key was charged by a refused call: %+v", st)
	}

	// Reserve and Cancel; Reset.
	clock.Advance(2 * time.Second)
	r, err := ratelimit.Reserve(ctx, pool, 2, []ratelimit.Limit{k}, time.Hour, nil)
	if err != nil || !r.Allowed {
		t.Fatalf("Reserve: %+v, %v", r, err)
	}
	if err := r.Cancel(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if st, _ := ratelimit.State(ctx, pool, k); st.Remaining != 2 {
		t.Fatalf("after Cancel the key admits %d, want its full burst 2", st.Remaining)
	}
	allow(t, pool, 2, k)
	if ok, err := ratelimit.Reset(ctx, pool, k); err != nil || !ok {
		t.Fatalf("Reset = %v, %v", ok, err)
	}
	if st, _ := ratelimit.State(ctx, pool, k); st.Remaining != 2 {
		t.Fatalf("after Reset the key admits %d, want 2", st.Remaining)
	}

	// Its mode is fixed.
	if _, err := ratelimit.Set(ctx, pool, ratelimit.Policy{Name: "fast", Rate: 1, Period: time.Second, Burst: 2}); !errors.Is(err, pgcoord.ErrInvalidArgument) {
		t.Fatalf("making the unlogged policy durable: %v, want ErrInvalidArgument", err)
	}
	if _, err := ratelimit.Set(ctx, pool, ratelimit.Policy{Name: "fast", Rate: 5, Period: time.Second, Burst: 2, Unlogged: true}); err != nil {
		t.Fatalf("changing the unlogged policy's rate: %v", err)
	}

	// gc collects keys at rest in both tables; Delete removes the policy's keys.
	clock.Advance(time.Hour)
	if _, err := pgcoord.GC(ctx, pool, &pgcoord.GCOpts{OlderThan: time.Hour}); err != nil {
		t.Fatal(err)
	}
	if n := rows("pgcoord_ratelimit_state_unlogged") + rows("pgcoord_ratelimit_state"); n != 0 {
		t.Fatalf("%d key rows at rest left after gc", n)
	}
	allow(t, pool, 1, k)
	if ok, err := ratelimit.Delete(ctx, pool, "fast"); err != nil || !ok {
		t.Fatalf("Delete = %v, %v", ok, err)
	}
	if rows("pgcoord_ratelimit_state_unlogged") != 0 {
		t.Fatal("Delete left the policy's unlogged keys")
	}
}
