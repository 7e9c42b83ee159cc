package semaphore_test

import (
	"math"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/semaphore"
)

// waitsBase is an instant one minute into a 5-minute window of the admission-wait
// histogram (windows are aligned with date_bin('5 minutes', t, 'epoch')): the tests set
// the schema's clock (pgtest.Clock) to every instant, so nothing depends on real time.
var waitsBase = time.Date(2030, 1, 1, 0, 1, 0, 0, time.UTC)

// joinLine makes holder stand in line for key at instant at, the way a blocking Acquire
// does on its first refused attempt (it may wait an hour), and checks that it was refused.
func joinLine(t *testing.T, pool *pgxpool.Pool, clock *pgtest.Clock, key, holder string, at time.Time) {
	t.Helper()
	clock.Freeze(at)
	var admitted int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pgcoord_semaphore_acquire($1, $2, 1, interval '1 hour', interval '1 hour')`,
		key, holder).Scan(&admitted); err != nil {
		t.Fatal(err)
	}
	if admitted != 0 {
		t.Fatalf("%s was admitted to %q at %v; want it in line", holder, key, at)
	}
}

// waitedInLine admits holder to key (limit 1) at at+wait after it stood in line from at
// behind the current holder, which it returns in place of blocker.
func waitedInLine(t *testing.T, pool *pgxpool.Pool, clock *pgtest.Clock, key string, blocker semaphore.Permit, holder string, at time.Time, wait time.Duration) semaphore.Permit {
	t.Helper()
	joinLine(t, pool, clock, key, holder, at)
	if err := semaphore.Release(ctx, pool, blocker); err != nil {
		t.Fatal(err)
	}
	return tryAt(t, pool, clock, key, holder, at.Add(wait))
}

// tryAt admits holder (a new identity if "") to key (limit 1) at instant at.
func tryAt(t *testing.T, pool *pgxpool.Pool, clock *pgtest.Clock, key, holder string, at time.Time) semaphore.Permit {
	t.Helper()
	clock.Freeze(at)
	return mustTry(t, pool, key, 1, time.Hour, &semaphore.AcquireOpts{Holder: holder})
}

// statusAt is the status of key as List reports it at instant now.
func statusAt(t *testing.T, pool *pgxpool.Pool, clock *pgtest.Clock, key string, now time.Time) semaphore.KeyStatus {
	t.Helper()
	clock.Freeze(now)
	all, err := semaphore.List(ctx, pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range all {
		if s.Key == key {
			return s
		}
	}
	t.Fatalf("no key %q in %+v", key, all)
	return semaphore.KeyStatus{}
}

// near reports whether got is the histogram's report of a wait of want: within 20%, or 0
// for a wait under a millisecond.
func near(got, want time.Duration) bool {
	if want < time.Millisecond {
		return got == 0
	}
	return math.Abs(float64(got-want)) <= 0.2*float64(want)
}

func checkWaits(t *testing.T, what string, s semaphore.KeyStatus, n int64, p50, p99 time.Duration) {
	t.Helper()
	if s.Waited != n || !near(s.WaitP50, p50) || !near(s.WaitP99, p99) {
		t.Errorf("%s: Waited %d, p50 %v, p99 %v; want %d, about %v and %v", what, s.Waited, s.WaitP50, s.WaitP99, n, p50, p99)
	}
}

// The database records how long each admitted holder stood in line, from its first
// refused attempt to its admission; a holder that never stood in line waited 0.
func TestAdmissionWaitsAreRecorded(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	clock := pgtest.NewClock(t, pool)
	tryAt(t, pool, clock, "never", "", waitsBase)
	checkWaits(t, "a key whose only admission was immediate", statusAt(t, pool, clock, "never", waitsBase), 1, 0, 0)

	held := tryAt(t, pool, clock, "k", "first", waitsBase)
	at := waitsBase
	for i, wait := range []time.Duration{3 * time.Second, 3 * time.Second, 3 * time.Second, time.Minute} {
		at = at.Add(time.Second)
		held = waitedInLine(t, pool, clock, "k", held, "waiter"+string(rune('a'+i)), at, wait)
		at = at.Add(wait)
	}
	// Waits 0, 3s, 3s, 3s, 60s: the median is 3s, the 99th percentile 60s.
	s := statusAt(t, pool, clock, "k", at)
	checkWaits(t, "after waits in line", s, 5, 3*time.Second, time.Minute)
	if s.Admitted != 5 {
		t.Errorf("Admitted %d, want 5", s.Admitted)
	}

	// A blocking Acquire admitted at its first attempt waited 0.
	if err := semaphore.Release(ctx, pool, held); err != nil {
		t.Fatal(err)
	}
	if _, err := semaphore.Acquire(ctx, pool, "k", 1, time.Hour, nil); err != nil {
		t.Fatal(err)
	}
	checkWaits(t, "after an Acquire admitted at once", statusAt(t, pool, clock, "k", at), 6, 3*time.Second, time.Minute)
}

// A real blocking Acquire that waits for a release is recorded with its wait by the
// database clock: from its first refused attempt (its line registration) to its permit.
func TestBlockingAcquireWaitIsRecorded(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	held := mustTry(t, pool, "k", 1, time.Hour, nil)
	call := waitFor(t, pool, "k", 1, &semaphore.AcquireOpts{Holder: "waiter"})
	var since time.Time
	if err := pool.QueryRow(ctx, `SELECT since FROM pgcoord_semaphore_waiters WHERE key = 'k' AND holder = 'waiter'`).Scan(&since); err != nil {
		t.Fatal(err)
	}
	if err := semaphore.Release(ctx, pool, held); err != nil {
		t.Fatal(err)
	}
	p, err := call.Wait(t)
	if err != nil {
		t.Fatal(err)
	}
	checkWaits(t, "after a blocking Acquire", mustGet(t, pool, "k"), 2, 0, p.AcquiredAt.Sub(since))
}

// Waits count for 5 to 10 minutes: the window of the status's instant and the one before;
// older windows count no more, whether the key was busy since or not.
func TestAdmissionWaitWindowsRotate(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	clock := pgtest.NewClock(t, pool)
	const window = 5 * time.Minute
	// Window 0: an immediate admission and a wait of 10 s.
	held := tryAt(t, pool, clock, "k", "first", waitsBase)
	held = waitedInLine(t, pool, clock, "k", held, "w0", waitsBase, 10*time.Second)
	checkWaits(t, "window 0, read in window 0", statusAt(t, pool, clock, "k", waitsBase.Add(time.Minute)), 2, 0, 10*time.Second)
	checkWaits(t, "window 0, read in window 1", statusAt(t, pool, clock, "k", waitsBase.Add(window)), 2, 0, 10*time.Second)
	checkWaits(t, "window 0, read in window 2", statusAt(t, pool, clock, "k", waitsBase.Add(2*window)), 0, 0, 0)

	// Window 1: a wait of 2 minutes. Window 0 is now the previous one and still counts.
	w1 := waitsBase.Add(window)
	held = waitedInLine(t, pool, clock, "k", held, "w1", w1, 2*time.Minute)
	checkWaits(t, "windows 0 and 1, read in window 1", statusAt(t, pool, clock, "k", w1.Add(3*time.Minute)), 3, 10*time.Second, 2*time.Minute)
	// Read in window 2, only window 1 counts.
	checkWaits(t, "windows 0 and 1, read in window 2", statusAt(t, pool, clock, "k", waitsBase.Add(2*window)), 1, 2*time.Minute, 2*time.Minute)

	// Window 2: an immediate admission rotates window 0 out.
	w2 := waitsBase.Add(2 * window)
	if err := semaphore.Release(ctx, pool, held); err != nil {
		t.Fatal(err)
	}
	held = tryAt(t, pool, clock, "k", "", w2)
	checkWaits(t, "windows 1 and 2, read in window 2", statusAt(t, pool, clock, "k", w2), 2, 0, 2*time.Minute)

	// Window 5, after two idle windows: nothing from before counts, not even as the
	// previous window.
	w5 := waitsBase.Add(5 * window)
	held = waitedInLine(t, pool, clock, "k", held, "w5", w5, 20*time.Millisecond)
	checkWaits(t, "window 5 after a gap", statusAt(t, pool, clock, "k", w5.Add(time.Second)), 1, 20*time.Millisecond, 20*time.Millisecond)
	checkWaits(t, "window 5 after a gap, read in window 6", statusAt(t, pool, clock, "k", w5.Add(window)), 1, 20*time.Millisecond, 20*time.Millisecond)

	// An admission whose instant lies in an earlier window than the key's current one (a
	// transaction that started before a window's first admission and commits after it)
	// counts in the current window.
	if err := semaphore.Release(ctx, pool, held); err != nil {
		t.Fatal(err)
	}
	tryAt(t, pool, clock, "k", "", w5.Add(-time.Second))
	checkWaits(t, "a late admission", statusAt(t, pool, clock, "k", w5.Add(time.Second)), 2, 0, 20*time.Millisecond)
}
