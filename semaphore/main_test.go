package semaphore_test

import (
	"context"
	"testing"
	"time"

	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/pgcoord"
	"github.com/pgcoord/pgcoord/semaphore"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

var ctx = context.Background()

func mustTry(t testing.TB, db pgcoord.DBTX, key string, limit int, ttl time.Duration, opts *semaphore.AcquireOpts) semaphore.Permit {
	t.Helper()
	p, err := semaphore.TryAcquire(ctx, db, key, limit, ttl, opts)
	if err != nil {
		t.Fatalf("TryAcquire(%q): %v", key, err)
	}
	return p
}

func mustGet(t testing.TB, db pgcoord.DBTX, key string) semaphore.KeyStatus {
	t.Helper()
	s, err := semaphore.Get(ctx, db, key)
	if err != nil {
		t.Fatalf("Get(%q): %v", key, err)
	}
	return s
}

// eventually polls cond every few milliseconds until it is true, failing t after
// pgtest.WaitLimit.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(pgtest.WaitLimit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, pgtest.WaitLimit)
		}
		time.Sleep(3 * time.Millisecond)
	}
}
