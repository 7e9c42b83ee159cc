//go:build unix

package demo_test

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/pgcoord/pgcoord/internal/demo"
	"github.com/pgcoord/pgcoord/internal/pgtest"
)

func TestMain(m *testing.M) {
	demo.WorkerMain() // this test binary is also the demo's worker processes
	pgtest.Main(m)
}

// TestRun runs the whole demo and checks that each incident happens the naive way and is
// prevented with pgcoord, and that the report says so.
func TestRun(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var out bytes.Buffer
	res, err := demo.Run(ctx, demo.Config{DatabaseURL: pgtest.URL(t), Out: &out})
	if err != nil {
		t.Fatalf("demo: %v\n%s", err, out.String())
	}
	t.Log("\n" + out.String())

	p := res.Payment
	if p.Charges["naive"] != 2 || p.LateA["naive"] != "charged" {
		t.Errorf("naive lock: %d charges, A's late charge %q; want the double charge: 2, charged", p.Charges["naive"], p.LateA["naive"])
	}
	if p.Charges["fenced"] != 1 || p.LateA["fenced"] != "rejected" {
		t.Errorf("fencing: %d charges, A's late charge %q; want 1, rejected", p.Charges["fenced"], p.LateA["fenced"])
	}
	if p.Charges["provider"] != 1 || p.LateA["provider"] != "replayed" {
		t.Errorf("provider idempotency key: %d charges, A's late charge %q; want 1, replayed", p.Charges["provider"], p.LateA["provider"])
	}

	e := res.Emails
	if e.FewestPerCustomer["naive"] != 3 || e.MostPerCustomer["naive"] != 3 {
		t.Errorf("cron in 3 replicas: %d to %d emails per customer, want 3", e.FewestPerCustomer["naive"], e.MostPerCustomer["naive"])
	}
	if e.FewestPerCustomer["pgcoord"] != 1 || e.MostPerCustomer["pgcoord"] != 1 {
		t.Errorf("singleton + dedupe: %d to %d emails per customer, want exactly 1", e.FewestPerCustomer["pgcoord"], e.MostPerCustomer["pgcoord"])
	}
	if e.Killed == "" || e.TookOver == "" || e.Killed == e.TookOver || e.TakeoverAttempt < 2 || e.SentBeforeKill == 0 {
		t.Errorf("the takeover after the kill: killed %q after %d emails, taken over by %q as attempt %d",
			e.Killed, e.SentBeforeKill, e.TookOver, e.TakeoverAttempt)
	}

	q := res.Tenants
	if q.SmallStartedBeforeBigDrained["fifo"] {
		t.Errorf("FIFO: a job of small started before the last of big's; the demo's queue is not FIFO")
	}
	if !q.SmallStartedBeforeBigDrained["fair"] {
		t.Errorf("semaphore + fair admission: small started only after big's last job: starved")
	}
	if n := q.BigMaxConcurrent["fair"]; n > 2 {
		t.Errorf("semaphore: big ran %d jobs at once, limit 2", n)
	}
	if n := q.BigMaxConcurrent["fifo"]; n < 3 {
		t.Errorf("FIFO: big ran at most %d jobs at once, want all 4 workers at some point", n)
	}

	sc := res.Schedules
	if sc.Before < 1 || sc.After < 1 || sc.WhilePaused != 0 || sc.RanTwice != 0 {
		t.Errorf("schedule: %d ticks before the pause, %d while paused, %d after the resume, %d ran twice; want some, none, some, none",
			sc.Before, sc.WhilePaused, sc.After, sc.RanTwice)
	}

	for _, want := range []string{"charges of order 42", "emails per customer", "small's longest wait",
		"$ pgcoord schedules pause digest", "$ pgcoord schedules resume digest", "$ pgcoord schedules list",
		"$ pgcoord leases list", "weekly-report", "$ pgcoord semaphores list"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the report lacks %q", want)
		}
	}
}
