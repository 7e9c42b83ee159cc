package singleton_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/singleton"
)

// Several replicas (each with its own pool, as separate pods would have) run Schedule on
// a 200ms job for a bounded time: every tick in the window ran exactly once, by one of
// them, and no tick was missed — unless this process, where every replica runs, or the
// database was stalled when the tick was due (a loaded machine can stop either for longer
// than a slot: a claim that commits after its slot ended finds the tick gone by). One
// missed tick that neither watch explains is allowed on a loaded machine (a slow round
// trip of every replica at once that the commit probe happened not to share); a Schedule
// that skips ticks misses more.
func TestScheduleReplicasRunEachTickOnce(t *testing.T) {
	t.Parallel()
	const (
		replicas = 4
		every    = 200 * time.Millisecond
		window   = 2400 * time.Millisecond
	)
	pool, schema := migrated(t, 4)
	// A long lease: a runner slowed down by a loaded machine is not taken over here.
	job := singleton.Job{Name: "tick200", Every: every, TTL: 10 * time.Second}
	var (
		mu    sync.Mutex
		calls = map[time.Time][]string{}
	)
	ctx, cancel := context.WithTimeout(t.Context(), window)
	defer cancel()
	stalls := watchStalls(ctx, every/4)
	stalls.watchCommits(ctx, t, pool, every/4)
	errs := make(chan error, replicas)
	for i := range replicas {
		p := poolOn(t, schema, 3)
		holder := fmt.Sprintf("replica-%d", i)
		go func() {
			errs <- singleton.Schedule(ctx, p, job, func(ctx context.Context, run singleton.Run) error {
				mu.Lock()
				calls[run.ScheduledFor.UTC()] = append(calls[run.ScheduledFor.UTC()], holder)
				mu.Unlock()
				select { // some work
				case <-time.After(20 * time.Millisecond):
					return nil
				case <-ctx.Done():
					return ctx.Err()
				}
			}, &singleton.ScheduleOpts{Holder: holder})
		}()
	}
	for range replicas {
		if err := within(t, window+15*time.Second, errs, "Schedule returning"); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Schedule returned %v, want ctx's error", err)
		}
	}
	rs := runs(t, pool, job.Name)
	// At least half the window's ticks ran (each missing one is judged below: a starved
	// machine can stall for several slots).
	if len(rs) < int(window/every)/2 {
		t.Fatalf("%d ticks ran in %v, want about %d", len(rs), window, window/every)
	}
	byHolder := map[string]int{}
	// unexplained are the missed ticks that no stall explains.
	var unexplained []time.Time
	skipped := 0           // ticks in the ledger claimed too late to run
	for i, r := range rs { // newest first
		who := calls[r.ScheduledFor.UTC()]
		if r.State == "skipped" && len(who) == 0 {
			// Claimed after its slot had passed (every replica late): a missed tick, judged
			// as those that ran nowhere.
			if !stalls.near(r.ScheduledFor, every) {
				unexplained = append(unexplained, r.ScheduledFor)
			}
			skipped++
			continue
		}
		// The newest tick's claim may have committed just as the replicas stopped, its
		// reply cut off with their context: then fn never ran for it.
		cutOff := i == 0 && len(who) == 0
		if !cutOff && (len(who) != 1 || who[0] != r.Holder) {
			t.Errorf("tick %v: fn ran on %v; want once, on %s", r.ScheduledFor, who, r.Holder)
		}
		byHolder[r.Holder]++
		if i > 0 {
			for m := r.ScheduledFor.Add(every); m.Before(rs[i-1].ScheduledFor); m = m.Add(every) {
				if !stalls.near(m, every) {
					unexplained = append(unexplained, m)
				}
			}
		}
		// The newest run may have been cut short when the replicas stopped.
		if i > 0 && (r.State != "succeeded" || r.Attempt != 1) {
			t.Errorf("tick %v: %s, attempt %d; want succeeded at the first attempt", r.ScheduledFor, r.State, r.Attempt)
		}
	}
	switch {
	case len(unexplained) > 1:
		t.Errorf("no run of the ticks %v, though neither this process nor the database was stalled then: ticks were missed", unexplained)
	case len(unexplained) == 1:
		t.Logf("one tick missed that no stall explains: %v", unexplained[0])
	}
	if ran, cutOff := len(rs)-skipped, len(calls[rs[0].ScheduledFor.UTC()]) == 0; len(calls) != ran && !(cutOff && len(calls) == ran-1) {
		t.Errorf("fn ran for %d ticks, the ledger has %d that ran", len(calls), ran)
	}
	t.Logf("%d ticks; runs per replica: %v", len(rs), byHolder)
}

// stallWatch records the moments this process did not run (a GC pause, a starved CPU):
// a goroutine that wakes every few milliseconds notes each gap longer than a threshold.
type stallWatch struct {
	mu     sync.Mutex
	stalls [][2]time.Time
}

func watchStalls(ctx context.Context, threshold time.Duration) *stallWatch {
	w := &stallWatch{}
	go func() {
		last := time.Now()
		for ctx.Err() == nil {
			time.Sleep(5 * time.Millisecond)
			now := time.Now()
			if now.Sub(last) > threshold {
				w.mu.Lock()
				w.stalls = append(w.stalls, [2]time.Time{last, now})
				w.mu.Unlock()
			}
			last = now
		}
	}()
	return w
}

// watchCommits records the moments the database was slow to commit: a goroutine commits a
// one-row update every few milliseconds and notes each that took longer than threshold.
func (w *stallWatch) watchCommits(ctx context.Context, t *testing.T, pool *pgxpool.Pool, threshold time.Duration) {
	t.Helper()
	if _, err := pool.Exec(ctx, `CREATE TABLE commit_probe (n bigint); INSERT INTO commit_probe VALUES (0)`); err != nil {
		t.Fatal(err)
	}
	go func() {
		for ctx.Err() == nil {
			start := time.Now()
			if _, err := pool.Exec(ctx, `UPDATE commit_probe SET n = n + 1`); err != nil {
				return // ctx ended
			}
			if now := time.Now(); now.Sub(start) > threshold {
				w.mu.Lock()
				w.stalls = append(w.stalls, [2]time.Time{start, now})
				w.mu.Unlock()
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()
}

// near reports whether a stall overlapped the slot starting at slot, give or take a slot
// of length every (the database's clock and this host's are one machine's here).
func (w *stallWatch) near(slot time.Time, every time.Duration) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, s := range w.stalls {
		if s[0].Before(slot.Add(2*every)) && s[1].After(slot.Add(-every)) {
			return true
		}
	}
	return false
}
