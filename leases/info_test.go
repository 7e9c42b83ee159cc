package leases_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/leases"
	"github.com/pgcoord/pgcoord/pgcoord"
)

func TestGetListAndMetadata(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	if _, err := leases.Get(ctx, pool, "nope"); !errors.Is(err, leases.ErrNotFound) {
		t.Fatalf("Get of an unknown lease: %v", err)
	}
	clock := pgtest.NewClock(t, pool)
	held := mustAcquire(t, pool, "a-held", time.Hour, &leases.AcquireOpts{Metadata: map[string]string{"job": "billing"}})
	mustAcquire(t, pool, "b-expired", time.Second, nil)
	free := mustAcquire(t, pool, "c-free", time.Minute, nil)
	if err := leases.Release(ctx, pool, free, nil); err != nil {
		t.Fatal(err)
	}
	clock.Advance(time.Minute) // b-expired's grant runs out; a-held's does not
	info, err := leases.Get(ctx, pool, "a-held")
	if err != nil || info.Holder != held.Holder || info.Metadata["job"] != "billing" || info.Metadata["host"] == "" ||
		info.Metadata["pid"] == "" || info.Metadata["app"] == "" || info.Remaining() <= 0 {
		t.Fatalf("Get: %+v, %v", info, err)
	}
	names := func(opts *leases.ListOpts) string {
		t.Helper()
		infos, err := leases.List(ctx, pool, opts)
		if err != nil {
			t.Fatal(err)
		}
		var ns []string
		for _, i := range infos {
			ns = append(ns, i.Name)
		}
		return strings.Join(ns, ",")
	}
	for _, c := range []struct {
		opts *leases.ListOpts
		want string
	}{
		{nil, "a-held,b-expired,c-free"},
		{&leases.ListOpts{Held: true}, "a-held"},
		{&leases.ListOpts{Expired: true}, "b-expired"},
		{&leases.ListOpts{Limit: 2}, "a-held,b-expired"},
		{&leases.ListOpts{After: "b-expired"}, "c-free"},
	} {
		if got := names(c.opts); got != c.want {
			t.Errorf("List(%+v) = %s, want %s", c.opts, got, c.want)
		}
	}
	if _, err := leases.List(ctx, pool, &leases.ListOpts{Held: true, Expired: true}); !errors.Is(err, pgcoord.ErrInvalidArgument) {
		t.Errorf("List Held+Expired: %v", err)
	}
	if _, err := leases.Expire(ctx, pool, "c-free", ""); !errors.Is(err, leases.ErrNotFound) {
		t.Errorf("Expire of a free lease: %v", err)
	}
}

// A renewal that finds less than a quarter of its grant left is a near miss, counted by the
// database across grants (so any process, the dashboard's too, can see it); forced expiries
// are counted too.
func TestNearMissesAndForcedExpiriesAreRecorded(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	clock := pgtest.NewClock(t, pool)
	t0 := time.Now().Truncate(time.Millisecond)
	clock.Freeze(t0)
	l := mustAcquire(t, pool, "late", 40*time.Second, nil)
	renew := func(l leases.Lease, at time.Duration, ttl time.Duration) leases.Lease {
		t.Helper()
		clock.Freeze(t0.Add(at))
		r, err := leases.Renew(ctx, pool, l, ttl, nil)
		if err != nil {
			t.Fatalf("renew at %v: %v", at, err)
		}
		return r
	}
	l = renew(l, 20*time.Second, 40*time.Second) // 20s of 40s left: on time
	l = renew(l, 49*time.Second, 10*time.Second) // 11s of 40s left: on time (a quarter is 10s)
	l = renew(l, 55*time.Second, 40*time.Second) // 4s of 10s left: on time, judged on the grant renewed
	l = renew(l, 94*time.Second, 40*time.Second) // 1s of 40s left: a near miss
	i, err := leases.Get(ctx, pool, "late")
	if err != nil {
		t.Fatal(err)
	}
	if i.NearMisses != 1 || !i.LastNearMissAt.Equal(t0.Add(94*time.Second)) {
		t.Fatalf("near misses = %d at %v, want 1 at %v", i.NearMisses, i.LastNearMissAt, t0.Add(94*time.Second))
	}
	renew(l, 126*time.Second, 40*time.Second) // 8s of 40s left: a near miss
	if _, err := leases.Expire(ctx, pool, "late", "test"); err != nil {
		t.Fatal(err)
	}
	// A new grant keeps the counts; a late renewal of it adds to them.
	l2 := mustAcquire(t, pool, "late", time.Minute, nil)
	if _, err := leases.Expire(ctx, pool, "late", "test"); err != nil {
		t.Fatal(err)
	}
	if _, err := leases.Renew(ctx, pool, l2, time.Minute, nil); !errors.Is(err, leases.ErrLost) {
		t.Fatalf("renew after a forced expiry: %v, want ErrLost", err)
	}
	all, err := leases.List(ctx, pool, nil)
	if err != nil || len(all) != 1 {
		t.Fatalf("List = %v, %v", all, err)
	}
	if all[0].NearMisses != 2 || all[0].ForcedExpiries != 2 {
		t.Fatalf("near misses %d, forced expiries %d; want 2 and 2", all[0].NearMisses, all[0].ForcedExpiries)
	}
}
