package fenced_test

import (
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/fenced"
	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/leases"
)

// gc runs pgcoord_gc (the SQL function behind `pgcoord gc`) with the given retention until
// a call removes fewer leases and registers than its batch, and returns how many of each
// it removed in all.
func gc(t *testing.T, pool *pgxpool.Pool, olderThan string) (leasesRemoved, fencesRemoved int64) {
	t.Helper()
	const batch = 100000
	for {
		rows, err := pool.Query(t.Context(), `SELECT kind, removed FROM pgcoord_gc($1::interval, $2, false)`, olderThan, batch)
		if err != nil {
			t.Fatal(err)
		}
		removed := map[string]int64{}
		for rows.Next() {
			var kind string
			var n int64
			if err := rows.Scan(&kind, &n); err != nil {
				t.Fatal(err)
			}
			removed[kind] = n
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		leasesRemoved += removed["leases"]
		fencesRemoved += removed["fences"]
		if removed["leases"] < batch && removed["fences"] < batch {
			return leasesRemoved, fencesRemoved
		}
	}
}

// Storage is bounded without letting a token go backwards. 100,000 released lease names
// are collected by pgcoord_gc, with the fence registers nobody wrote for longer than the
// retention; afterwards
//   - a re-acquired name gets a token higher than every token before it;
//   - an old token is refused by fenced.Check, for a resource whose register was collected
//     (the register of the lease's own name) as well as for one that never had a register:
//     the retired floor remembers the highest collected token;
//   - the documented exemption: the current grant of the lease named like a resource,
//     granted before the collection (a leader holding its lease for longer than the
//     retention), may still write that never-written resource; the same grant writing a
//     resource not named like its lease for the first time is refused (the documented
//     false refusal).
func TestGCCollectsLeasesAndRegistersWithoutLettingOldTokensThrough(t *testing.T) {
	t.Parallel()
	const names = 100000
	ctx := t.Context()
	pool := pgtest.Pool(t)
	clock := pgtest.NewClock(t, pool)

	// order:1 is granted to A, who writes its register; then to B, who does not write.
	a, err := leases.TryAcquire(ctx, pool, "order:1", time.Minute, &leases.AcquireOpts{Holder: "A"})
	if err != nil {
		t.Fatal(err)
	}
	if err := check(ctx, pool, "order:1", a.Token); err != nil {
		t.Fatal(err)
	}
	if err := leases.Release(ctx, pool, a, nil); err != nil {
		t.Fatal(err)
	}
	b, err := leases.TryAcquire(ctx, pool, "order:1", time.Minute, &leases.AcquireOpts{Holder: "B"})
	if err != nil {
		t.Fatal(err)
	}
	if err := leases.Release(ctx, pool, b, nil); err != nil {
		t.Fatal(err)
	}
	// A leader that holds its lease across the collection (renewed below).
	leader, err := leases.TryAcquire(ctx, pool, "leader", 24*time.Hour, &leases.AcquireOpts{Holder: "leader"})
	if err != nil {
		t.Fatal(err)
	}
	// 100,000 released names. Granting and releasing each through the SQL API takes 20s
	// here, so they are written as pgcoord_lease_release leaves them (a row with no holder,
	// its token from the schema's counter), except the last, which goes through the API.
	if _, err := pool.Exec(ctx, `
		INSERT INTO pgcoord_leases (name, fence_token, holder, acquired_at, released_at)
		SELECT 'job:' || i, pgcoord_next_token(), NULL, pgcoord_now(), pgcoord_now()
		  FROM generate_series(1, $1::int - 1) i`, names); err != nil {
		t.Fatal(err)
	}
	last, err := leases.TryAcquire(ctx, pool, "job:last", time.Minute, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := leases.Release(ctx, pool, last, nil); err != nil {
		t.Fatal(err)
	}
	highest := last.Token
	if n := queryInt64(t, pool, `SELECT count(*) FROM pgcoord_leases WHERE holder IS NULL AND name LIKE 'job:%'`); n != names {
		t.Fatalf("%d released names, want %d", n, names)
	}
	if max := queryInt64(t, pool, `SELECT max(fence_token) FROM pgcoord_leases`); max != highest || highest <= leader.Token {
		t.Fatalf("highest token %d, the last grant's %d, the leader's %d", max, highest, leader.Token)
	}

	clock.Advance(2 * time.Hour)
	if _, err := leases.Renew(ctx, pool, leader, 24*time.Hour, nil); err != nil {
		t.Fatalf("the leader's renewal: %v", err)
	}
	leasesRemoved, fencesRemoved := gc(t, pool, "1 hour")
	if leasesRemoved != names+1 || fencesRemoved != 1 {
		t.Fatalf("gc removed %d leases and %d registers, want %d (every released name) and 1 (order:1's)", leasesRemoved, fencesRemoved, names+1)
	}
	if left := queryInt64(t, pool, `SELECT count(*) FROM pgcoord_leases`); left != 1 {
		t.Fatalf("%d lease rows left, want the leader's only", left)
	}
	if floor := queryInt64(t, pool, `SELECT fence_token FROM pgcoord_fence_floor`); floor != highest {
		t.Fatalf("the retired floor is %d, want the highest collected token %d", floor, highest)
	}

	// A re-acquired name gets a higher token than every token before it.
	again, err := leases.TryAcquire(ctx, pool, "job:1", time.Minute, nil)
	if err != nil {
		t.Fatal(err)
	}
	if again.Token <= highest {
		t.Fatalf("job:1 re-acquired with token %d, not above the highest earlier token %d", again.Token, highest)
	}
	// Old tokens are refused, whether the resource had a register (order:1's, collected) or
	// never had one.
	for _, c := range []struct {
		resource string
		token    int64
	}{
		{"order:1", a.Token},
		{"order:1", b.Token},
		{"job:2", highest - 1},
		{"never-written", b.Token},
	} {
		if err := check(ctx, pool, c.resource, c.token); !errors.Is(err, fenced.ErrStale) {
			t.Errorf("Check(%q, old token %d) after gc: %v, want ErrStale", c.resource, c.token, err)
		}
	}
	if got := register(t, pool, "order:1"); got != -1 {
		t.Errorf("a refused check left order:1's register at %d", got)
	}
	// The new grant of job:1 writes its never-written resource.
	if err := check(ctx, pool, "job:1", again.Token); err != nil {
		t.Errorf("the new grant of job:1 writing job:1: %v", err)
	}

	// The exemption: the leader's grant, older than the floor, writes the resource named
	// like its lease for the first time: accepted. A resource not named like its lease:
	// refused, the documented false refusal of a grant older than the retention.
	if leader.Token >= highest {
		t.Fatalf("the leader's token %d is not below the floor %d: the case proves nothing", leader.Token, highest)
	}
	if err := check(ctx, pool, "leader", leader.Token); err != nil {
		t.Errorf("the current grant of lease leader writing resource leader for the first time: %v, want it accepted", err)
	}
	if err := check(ctx, pool, "leader:report", leader.Token); !errors.Is(err, fenced.ErrStale) {
		t.Errorf("the leader's old grant writing a never-written resource not named like its lease: %v, want ErrStale", err)
	}
}
