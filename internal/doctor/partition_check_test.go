package doctor_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/pgcoord/pgcoord/internal/doctor"
	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/partition"
)

// A group with a live member and a partition nobody has held for longer than the check's
// bound calls for attention, naming the group; a group whose partitions are all held, and
// one with no live member, do not.
func TestPartitionWithoutOwner(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t)
	clock := pgtest.NewClock(t, pool)
	check := func() doctor.Finding {
		t.Helper()
		return findings(t, ctx, func() ([]doctor.Finding, error) { return doctor.Run(ctx, pool, doctor.Options{}) })["partitions"]
	}
	t0 := time.Date(2026, 6, 1, 10, 0, 0, 0, time.UTC)
	clock.Freeze(t0)
	// "served": one member holds both partitions. "stuck": its only member is drained (and
	// stays live), so its partitions go to nobody. "idle": no member.
	for _, q := range []string{
		`SELECT count(*) FROM pgcoord_partition_create('served', 2)`,
		`SELECT count(*) FROM pgcoord_partition_heartbeat('served', 'a', 1, '1 hour')`,
		`SELECT count(*) FROM pgcoord_partition_create('stuck', 2)`,
		`SELECT count(*) FROM pgcoord_partition_heartbeat('stuck', 'b', 1, '1 hour')`,
		`SELECT count(*) FROM pgcoord_partition_create('idle', 2)`,
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := partition.Drain(ctx, pool, "stuck", "b", "ops"); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `SELECT count(*) FROM pgcoord_partition_heartbeat('stuck', 'b', 1, '1 hour', '{0,1}')`); err != nil {
		t.Fatal(err)
	}
	if f := check(); f.Status != doctor.OK {
		t.Fatalf("partitions just released: %+v, want OK", f)
	}
	clock.Freeze(t0.Add(5 * time.Minute))
	if _, err := pool.Exec(ctx, `SELECT count(*) FROM pgcoord_partition_heartbeat('served', 'a', 1, '1 hour')`); err != nil {
		t.Fatal(err)
	}
	f := check()
	if f.Status != doctor.Attention || !strings.Contains(f.Summary, "stuck (2 of 2 partitions without an owner") ||
		strings.Contains(f.Summary, "served") || strings.Contains(f.Summary, "idle") || f.Explain == "" {
		t.Errorf("a group whose partitions nobody holds: %+v", f)
	}
}
