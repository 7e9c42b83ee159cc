package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/examples/internal/exampletest"
	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/singleton"
)

func TestMain(m *testing.M) { exampletest.Main(m, main) }

const customers = 10 // the demo customers the schema inserts

// mailbox records every email sent, as the customers receive them.
type mailbox struct {
	mu        sync.Mutex
	received  map[string]int             // "to campaign" -> emails
	senders   map[string]map[string]bool // campaign -> replicas that sent it
	campaigns map[string]int             // campaign -> emails
}

func newMailbox() *mailbox {
	return &mailbox{received: map[string]int{}, senders: map[string]map[string]bool{}, campaigns: map[string]int{}}
}

// sender returns the mail provider of one replica.
func (m *mailbox) sender(replica string) sendFunc {
	return func(_ context.Context, to, campaign string) error {
		m.mu.Lock()
		defer m.mu.Unlock()
		m.received[to+" "+campaign]++
		if m.senders[campaign] == nil {
			m.senders[campaign] = map[string]bool{}
		}
		m.senders[campaign][replica] = true
		m.campaigns[campaign]++
		return nil
	}
}

// completeCampaigns counts the campaigns that every customer has received, by the
// email_sends table (0 while the table does not exist yet).
func completeCampaigns(pool *pgxpool.Pool) (int, error) {
	var n int
	err := pool.QueryRow(context.Background(), `SELECT count(*) FROM (SELECT campaign FROM email_sends
		GROUP BY campaign HAVING count(*) = (SELECT count(*) FROM customers)) c`).Scan(&n)
	if err != nil && strings.Contains(err.Error(), "does not exist") {
		return 0, nil
	}
	return n, err
}

// Three replicas, each with its own pool, Locker and scheduler, run the report every second.
// Each tick is run by one replica, and each customer gets exactly one email per campaign.
func TestThreeReplicasSendEachReportOnce(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pool, schemaName := pgtest.Schema(t)
	box := newMailbox()
	errs := make(chan error)
	for _, replica := range []string{"a", "b", "c"} {
		replicaPool := pgtest.NewPool(t, pgtest.URL(t), schemaName)
		setupPool := pgtest.Direct(t, replicaPool) // migrating needs a session
		cfg := config{Every: time.Second, Replica: replica, Send: box.sender(replica), Logger: slog.New(slog.DiscardHandler)}
		go func() {
			err := createTables(ctx, setupPool, "weekly-report", schema) // all three at once, as replicas start
			if err == nil {
				err = run(ctx, replicaPool, cfg)
			}
			errs <- err
		}()
	}
	exampletest.WaitFor(t, "three complete campaigns", func(context.Context) (bool, error) {
		n, err := completeCampaigns(pool)
		return n >= 3, err
	})
	cancel()
	for range 3 {
		if err := <-errs; err != nil {
			t.Fatalf("replica: %v", err)
		}
	}

	box.mu.Lock()
	defer box.mu.Unlock()
	for k, n := range box.received {
		if n != 1 {
			t.Errorf("%s: %d emails, want 1", k, n)
		}
	}
	complete := 0
	for campaign, replicas := range box.senders {
		if len(replicas) != 1 {
			t.Errorf("campaign %s sent by replicas %v, want one: the tick ran on several", campaign, replicas)
		}
		if box.campaigns[campaign] == customers {
			complete++
		}
	}
	if complete < 2 {
		t.Errorf("%d complete campaigns sent, want at least 2 (sent: %v)", complete, box.campaigns)
	}
	// The ledger agrees: every tick that ran is one run there, by the replica that sent it.
	runs, err := singleton.ListRuns(context.Background(), pool, job, nil)
	if err != nil {
		t.Fatal(err)
	}
	ran := map[string]string{}
	for _, r := range runs {
		if r.State == "skipped" {
			continue
		}
		campaign := campaignOf(r.Run, time.Second)
		if _, dup := ran[campaign]; dup {
			t.Errorf("tick %s claimed twice in the ledger", campaign)
		}
		ran[campaign] = r.Holder
	}
	for campaign, replicas := range box.senders {
		if !replicas[ran[campaign]] {
			t.Errorf("campaign %s sent by %v, but the ledger has its tick run by %q", campaign, replicas, ran[campaign])
		}
	}
}

// A tick that runs twice (the lock failed, or a replica woke up late) sends nothing the
// second time; an email that failed to send is not recorded, and the next run sends it.
func TestReportRunTwiceSendsOnlyWhatIsMissing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t)
	if err := createTables(ctx, pgtest.Direct(t, pool), "weekly-report", schema); err != nil {
		t.Fatal(err)
	}
	box := newMailbox()
	flaky := fmt.Sprintf("customer%d@example.com", 4)
	cfg := config{Replica: "a", Logger: slog.New(slog.DiscardHandler), Send: func(ctx context.Context, to, campaign string) error {
		if to == flaky {
			return errors.New("mail provider unavailable")
		}
		return box.sender("a")(ctx, to, campaign)
	}}
	if err := sendReport(ctx, pool, cfg, "w49"); err == nil {
		t.Fatal("the first run succeeded although customer 4's email failed")
	}
	cfg.Replica, cfg.Send = "b", box.sender("b")
	for range 2 {
		if err := sendReport(ctx, pool, cfg, "w49"); err != nil {
			t.Fatal(err)
		}
	}
	if box.campaigns["w49"] != customers {
		t.Errorf("%d emails sent over three runs, want %d", box.campaigns["w49"], customers)
	}
	for c := 1; c <= customers; c++ {
		if n := box.received[fmt.Sprintf("customer%d@example.com w49", c)]; n != 1 {
			t.Errorf("customer %d: %d emails, want 1", c, n)
		}
	}
	if n := exampletest.Count(t, pool, `SELECT count(*) FROM email_sends WHERE campaign = 'w49' AND customer_id = 4 AND replica = 'b'`); n != 1 {
		t.Errorf("customer 4's email recorded %d times by the retry, want 1 (the failed send must not be recorded)", n)
	}
}

// The program itself, as three replica processes with REPORT_EVERY=1s: each campaign is
// sent by one of them, each customer gets it once, and SIGTERM stops them cleanly. Bad
// configuration fails at once with a message.
func TestMainProgram(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	url := exampletest.EnvDatabaseURL + "=" + exampletest.DatabaseURL(t, pool)
	var procs []*exampletest.Process
	for _, r := range []string{"a", "b", "c"} {
		procs = append(procs, exampletest.StartMain(t, url, "REPORT_EVERY=1s", "REPLICA="+r))
	}
	exampletest.WaitFor(t, "two complete campaigns", func(context.Context) (bool, error) {
		n, err := completeCampaigns(pool)
		return n >= 2, err
	})
	for _, p := range procs {
		p.Stop(t)
	}
	if n := exampletest.Count(t, pool, `SELECT count(*) FROM (SELECT campaign FROM email_sends
		GROUP BY campaign HAVING count(DISTINCT replica) > 1) c`); n != 0 {
		t.Errorf("%d campaigns sent by several replicas", n)
	}

	for _, c := range []struct {
		env  []string
		want string
	}{
		{nil, "PGCOORD_DATABASE_URL is not set"},
		{[]string{url, "REPORT_EVERY=10ms"}, "REPORT_EVERY 10ms: want a duration of at least 1s"},
		{[]string{url, "REPORT_EVERY=week"}, "REPORT_EVERY week: want"},
	} {
		if code, out := exampletest.RunMain(t, c.env...); code != 1 || !strings.Contains(out, c.want) {
			t.Errorf("with %q: exit code %d, output %q; want 1 and %q", c.env, code, out, c.want)
		}
	}
}
