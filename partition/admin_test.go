package partition_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/partition"
	"github.com/pgcoord/pgcoord/pgcoord"
)

// TestGroupInfo: GetGroup and Groups count a group's live members, its partitions without a
// live grant and the grants made, and say how long the oldest unowned partition has been
// without an owner by the database clock — since it was created or released, or since its
// grant lapsed.
func TestGroupInfo(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	ctx := t.Context()
	clock := pgtest.NewClock(t, pool)
	t0 := time.Date(2027, 1, 4, 9, 0, 0, 0, time.UTC)
	clock.Freeze(t0)
	if _, err := pool.Exec(ctx, `SELECT pgcoord_partition_create('g', 4)`); err != nil {
		t.Fatal(err)
	}
	expect := func(when string, members, unowned int, unownedFor time.Duration, grants int64) {
		t.Helper()
		g, err := partition.GetGroup(ctx, pool, "g")
		if err != nil {
			t.Fatalf("%s: %v", when, err)
		}
		if g.Name != "g" || g.Partitions != 4 || g.Members != members || g.Unowned != unowned || g.UnownedFor != unownedFor || g.Grants != grants {
			t.Errorf("%s: %+v, want %d members, %d unowned for %v, %d grants", when, g, members, unowned, unownedFor, grants)
		}
		gs, err := partition.Groups(ctx, pool, "", 0)
		if err != nil || len(gs) != 1 || gs[0] != g {
			t.Errorf("%s: Groups = %+v, %v; want [%+v]", when, gs, err, g)
		}
	}
	clock.Freeze(t0.Add(5 * time.Second))
	expect("created 5s ago", 0, 4, 5*time.Second, 0)
	if _, err := pool.Exec(ctx, `SELECT pgcoord_partition_heartbeat('g', 'a', 1, interval '10 seconds', '{}', true)`); err != nil {
		t.Fatal(err)
	}
	expect("a holds all", 1, 0, 0, 4)
	clock.Freeze(t0.Add(20 * time.Second)) // a's grants lapsed at 15s
	expect("a's grants lapsed 5s ago", 0, 4, 5*time.Second, 4)

	if _, err := partition.GetGroup(ctx, pool, "nope"); !errors.Is(err, partition.ErrUnknownGroup) {
		t.Errorf("GetGroup of an unknown group: %v, want ErrUnknownGroup", err)
	}
	if _, err := partition.GetGroup(ctx, pool, strings.Repeat("g", partition.MaxGroupLen+1)); !errors.Is(err, pgcoord.ErrInvalidName) {
		t.Errorf("GetGroup of a long name: %v, want ErrInvalidName", err)
	}
}
