package integration_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/dedupe"
	"github.com/pgcoord/pgcoord/fenced"
	"github.com/pgcoord/pgcoord/idempotency"
	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/leases"
	"github.com/pgcoord/pgcoord/outbox"
	"github.com/pgcoord/pgcoord/outbox/inbox"
	"github.com/pgcoord/pgcoord/pgcoord"
	"github.com/pgcoord/pgcoord/semaphore"
	"github.com/pgcoord/pgcoord/singleton"
)

// Failover: a primary and a streaming standby (replicapair_test.go); the primary crashes
// (immediate stop) and the standby is promoted. See docs/failover.md.

// timeline2Floor is pgcoord_token_floor() on timeline 2, the first after a promotion.
const timeline2Floor = int64(1) << 44

// hourlyJob is the singleton job the failover tests claim; its tick is the hour of the
// database clock.
var hourlyJob = singleton.Job{Name: "hourly-report", Every: time.Hour, TTL: time.Minute}

// TestFailoverStandbyRefusesGrants shows that every grant on a standby fails with
// pgcoord.ErrReadOnly — also where a primary would refuse without writing (a full
// semaphore) — and that renewals and releases of grants made on the primary fail the same
// way, changing nothing. The writes of the other packages (fenced, outbox, inbox,
// idempotency, dedupe) answer ErrReadOnly on a standby too, so a caller can test for it
// uniformly.
func TestFailoverStandbyRefusesGrants(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pair := startReplicaPair(t, replicaPairOpts{})
	primary := pair.primary.pool("pgcoord-failover-primary")
	lease, err := leases.TryAcquire(ctx, primary, "report", time.Hour, nil)
	if err != nil {
		t.Fatal(err)
	}
	permit, err := semaphore.TryAcquire(ctx, primary, "tenant", 1, time.Hour, nil) // the key is now full
	if err != nil {
		t.Fatal(err)
	}
	standby := pair.standby.pool("pgcoord-failover-standby")
	pair.waitReplayed(primary, standby)
	// inTx runs f in a transaction begun on the standby: BEGIN works there, the write in f
	// fails.
	inTx := func(ctx context.Context, f func(tx pgx.Tx) error) error {
		return pgx.BeginFunc(ctx, standby, f)
	}
	msg := outbox.Message{Topic: "orders", Key: "42", Payload: []byte("created")}

	calls := []struct {
		name string
		call func(ctx context.Context) error
	}{
		{"leases.TryAcquire", func(ctx context.Context) error {
			_, err := leases.TryAcquire(ctx, standby, "other", time.Hour, nil)
			return err
		}},
		{"leases.TryAcquire of a held lease", func(ctx context.Context) error {
			_, err := leases.TryAcquire(ctx, standby, "report", time.Hour, nil)
			return err
		}},
		{"leases.Acquire", func(ctx context.Context) error {
			_, err := leases.Acquire(ctx, standby, "other", time.Hour, nil)
			return err
		}},
		{"leases.Acquire without LISTEN", func(ctx context.Context) error {
			_, err := leases.Acquire(ctx, standby, "other", time.Hour, &leases.AcquireOpts{NoListen: true})
			return err
		}},
		{"leases.Renew", func(ctx context.Context) error {
			_, err := leases.Renew(ctx, standby, lease, time.Hour, nil)
			return err
		}},
		{"leases.Release", func(ctx context.Context) error { return leases.Release(ctx, standby, lease, nil) }},
		{"semaphore.TryAcquire of a full key", func(ctx context.Context) error {
			_, err := semaphore.TryAcquire(ctx, standby, "tenant", 1, time.Hour, nil)
			return err
		}},
		{"semaphore.Acquire", func(ctx context.Context) error {
			_, err := semaphore.Acquire(ctx, standby, "other", 1, time.Hour, nil)
			return err
		}},
		{"semaphore.Next", func(ctx context.Context) error {
			_, err := semaphore.Next(ctx, standby, time.Hour, nil)
			return err
		}},
		{"semaphore.Renew", func(ctx context.Context) error {
			_, err := semaphore.Renew(ctx, standby, permit, time.Hour, nil)
			return err
		}},
		{"semaphore.Release", func(ctx context.Context) error { return semaphore.Release(ctx, standby, permit) }},
		{"singleton.ClaimTick", func(ctx context.Context) error {
			_, err := singleton.ClaimTick(ctx, standby, hourlyJob, nil)
			return err
		}},
		// Advisory locks would work on a standby, excluding nobody on the primary.
		{"singleton.RunOnce", func(ctx context.Context) error {
			_, err := singleton.RunOnce(ctx, standby, "nightly", func(context.Context, pgx.Tx) error {
				return errors.New("ran on a standby")
			})
			return err
		}},
		{"singleton.RunSession", func(ctx context.Context) error {
			_, err := singleton.RunSession(ctx, standby, "nightly", func(context.Context) error {
				return errors.New("ran on a standby")
			}, nil)
			return err
		}},
		{"fenced.Check", func(ctx context.Context) error {
			return inTx(ctx, func(tx pgx.Tx) error { return fenced.Check(ctx, tx, "report", lease.Token) })
		}},
		{"fenced.Write", func(ctx context.Context) error {
			return inTx(ctx, func(tx pgx.Tx) error {
				_, err := fenced.Write(ctx, tx, "report", lease.Token, "SELECT 1")
				return err
			})
		}},
		{"outbox.Enqueue", func(ctx context.Context) error {
			return inTx(ctx, func(tx pgx.Tx) error {
				_, err := outbox.Enqueue(ctx, tx, msg)
				return err
			})
		}},
		{"outbox.EnqueueBatch", func(ctx context.Context) error {
			return inTx(ctx, func(tx pgx.Tx) error {
				_, err := outbox.EnqueueBatch(ctx, tx, []outbox.Message{msg, msg})
				return err
			})
		}},
		{"outbox.Relay.RunBatch", func(ctx context.Context) error {
			relay, err := outbox.NewRelay(standby, &outbox.Config{
				Handler: outbox.HandlerFunc(func(context.Context, outbox.Message) error {
					return errors.New("delivered from a standby")
				}),
			})
			if err != nil {
				return err
			}
			_, err = relay.RunBatch(ctx)
			return err
		}},
		{"outbox.Retry", func(ctx context.Context) error { return outbox.Retry(ctx, standby, 1) }},
		{"outbox.Prune", func(ctx context.Context) error {
			_, err := outbox.Prune(ctx, standby, nil)
			return err
		}},
		{"inbox.Claim", func(ctx context.Context) error {
			return inTx(ctx, func(tx pgx.Tx) error {
				_, err := inbox.Claim(ctx, tx, "billing", 1)
				return err
			})
		}},
		{"idempotency.Begin", func(ctx context.Context) error {
			a, err := idempotency.Begin(ctx, standby, "payments", "key-1", []byte("fingerprint"), nil)
			if err == nil {
				a.Close(ctx)
			}
			return err
		}},
		{"idempotency.GC", func(ctx context.Context) error {
			_, err := idempotency.GC(ctx, standby, nil)
			return err
		}},
		{"dedupe.Claim", func(ctx context.Context) error {
			return inTx(ctx, func(tx pgx.Tx) error {
				_, err := dedupe.Claim(ctx, tx, "emails", "welcome/7", nil)
				return err
			})
		}},
		{"dedupe.GC", func(ctx context.Context) error {
			_, err := dedupe.GC(ctx, standby, nil)
			return err
		}},
	}
	for _, c := range calls {
		// A waiting call must fail at once, not wait: bound it well below its TTL.
		cctx, cancel := context.WithTimeout(ctx, pgtest.WaitLimit)
		err := c.call(cctx)
		cancel()
		if !errors.Is(err, pgcoord.ErrReadOnly) {
			t.Errorf("%s on the standby: got %v, want pgcoord.ErrReadOnly", c.name, err)
			continue
		}
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "25006" {
			t.Errorf("%s on the standby: the server's error (SQLSTATE 25006) is not reachable: %v", c.name, err)
		}
	}

	// Plain SQL callers get the same refusal, with a message that says why.
	_, err = standby.Exec(ctx, `SELECT * FROM pgcoord_lease_acquire('sql', 'psql', '1 hour')`)
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "25006" || !strings.Contains(pgErr.Message, "standby") {
		t.Errorf("pgcoord_lease_acquire on the standby: got %v, want SQLSTATE 25006 naming the standby", err)
	}

	// Nothing the standby refused changed the primary's grants.
	if _, err := leases.Renew(ctx, primary, lease, time.Hour, nil); err != nil {
		t.Errorf("the lease granted on the primary is no longer current: %v", err)
	}
	if _, err := semaphore.Renew(ctx, primary, permit, time.Hour, nil); err != nil {
		t.Errorf("the permit granted on the primary is no longer current: %v", err)
	}
}

// TestFailoverSyncGrantsSurvive runs the primary with synchronous_commit = local (ordinary
// traffic does not wait for the standby) and a synchronous standby, and grants with
// SyncCommit "on". It shows that such a grant waits for the standby while an ordinary one
// does not, and that after the primary crashes and the standby is promoted every
// acknowledged grant is still there: the holders keep their leases, permits and run, a
// newcomer is refused, and the next grant's token is higher than every token the old
// primary acknowledged.
func TestFailoverSyncGrantsSurvive(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pair := startReplicaPair(t, replicaPairOpts{sync: true, syncCommit: "local"})
	primary := pair.primary.pool("pgcoord-failover-primary")

	// With the standby down, an ordinary grant commits at once; a durable one waits for it.
	pair.standby.stop("fast")
	if _, err := leases.TryAcquire(ctx, primary, "ordinary", time.Hour, nil); err != nil {
		t.Fatalf("an ordinary grant with synchronous_commit = local and no standby: %v", err)
	}
	durableLease := pgtest.Go(func() (leases.Lease, error) {
		return leases.Acquire(ctx, primary, "durable", time.Hour, &leases.AcquireOpts{SyncCommit: "on"})
	})
	durablePermit := pgtest.Go(func() (semaphore.Permit, error) {
		return semaphore.Acquire(ctx, primary, "durable", 1, time.Hour, &semaphore.AcquireOpts{SyncCommit: "on"})
	})
	monitor := pair.primary.monitor()
	pollUntil(t, "both durable grants to wait for the synchronous standby", func() (bool, error) {
		var n int
		err := monitor.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'`).Scan(&n)
		return n == 2, err
	})
	if durableLease.Returned() || durablePermit.Returned() {
		t.Fatal("a durable grant returned before the synchronous standby confirmed it")
	}
	pair.standby.start()
	if _, err := durableLease.Wait(t); err != nil {
		t.Fatalf("the durable lease, once the standby is back: %v", err)
	}
	if _, err := durablePermit.Wait(t); err != nil {
		t.Fatalf("the durable permit, once the standby is back: %v", err)
	}
	pair.waitStreaming(true)

	// A history of grants, each acknowledged to its caller; the last of each stays held.
	var acked int64
	var last leases.Lease
	for i := range 10 {
		l, err := leases.TryAcquire(ctx, primary, "report", time.Hour, &leases.AcquireOpts{Holder: "worker-a", SyncCommit: "on"})
		if err != nil {
			t.Fatal(err)
		}
		acked, last = max(acked, l.Token), l
		if i < 9 {
			if err := leases.Release(ctx, primary, l, nil); err != nil {
				t.Fatal(err)
			}
		}
	}
	permit, err := semaphore.TryAcquire(ctx, primary, "tenant", 1, time.Hour, &semaphore.AcquireOpts{SyncCommit: "on"})
	if err != nil {
		t.Fatal(err)
	}
	job := hourlyJob
	job.SyncCommit = "on"
	run, err := singleton.ClaimTick(ctx, primary, job, nil)
	if err != nil {
		t.Fatal(err)
	}

	pair.primary.stop("immediate")
	pair.standby.promote()
	promoted := pair.standby.pool("pgcoord-failover-promoted")

	info, err := leases.Get(ctx, promoted, "report")
	if err != nil {
		t.Fatal(err)
	}
	if !info.Held() || info.Holder != last.Holder || info.Token != last.Token {
		t.Fatalf("after the failover the lease is %+v, want the acknowledged grant %+v still held", info, last)
	}
	if _, err := leases.TryAcquire(ctx, promoted, "report", time.Hour, nil); !errors.Is(err, leases.ErrHeld) {
		t.Fatalf("a newcomer after the failover: got %v, want ErrHeld (the durable grant survived)", err)
	}
	if _, err := semaphore.TryAcquire(ctx, promoted, "tenant", 1, time.Hour, nil); !errors.Is(err, semaphore.ErrFull) {
		t.Fatalf("a second permit after the failover: got %v, want ErrFull (the durable permit survived)", err)
	}
	if _, err := singleton.ClaimTick(ctx, promoted, hourlyJob, nil); !errors.Is(err, singleton.ErrNoTick) {
		t.Fatalf("claiming the tick again after the failover: got %v, want ErrNoTick (the durable claim survived)", err)
	}

	// Once the grant ends (an operator expires it), the next one has a higher token than
	// every acknowledged one.
	if _, err := leases.Expire(ctx, promoted, "report", "failover-test"); err != nil {
		t.Fatal(err)
	}
	next, err := leases.TryAcquire(ctx, promoted, "report", time.Hour, nil)
	if err != nil {
		t.Fatal(err)
	}
	if next.Token <= acked {
		t.Fatalf("the promoted standby granted token %d; the old primary had acknowledged %d", next.Token, acked)
	}
	t.Logf("tokens acknowledged by the old primary: lease %d, permit %d, run %d; first after promotion: %d",
		acked, permit.Token, run.Token, next.Token)
}

// TestFailoverAsyncLostGrant shows the hazard of asynchronous replication and the timeline
// floor that defuses it: grants the old primary acknowledged but never sent to the standby
// are lost in the failover, so the promoted standby's counters are behind the tokens their
// holders carry — its next grants would repeat them — yet the tokens it issues are higher,
// because they start at the new timeline's floor.
func TestFailoverAsyncLostGrant(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pair := startReplicaPair(t, replicaPairOpts{})
	primary := pair.primary.pool("pgcoord-failover-primary")
	if floor := tokenFloor(t, primary); floor != 0 {
		t.Fatalf("pgcoord_token_floor() on timeline 1 is %d, want 0 (tokens unchanged)", floor)
	}

	// Grants the standby receives.
	l, err := leases.TryAcquire(ctx, primary, "report", time.Hour, &leases.AcquireOpts{Holder: "worker-a"})
	if err != nil {
		t.Fatal(err)
	}
	if err := leases.Release(ctx, primary, l, nil); err != nil {
		t.Fatal(err)
	}
	p, err := semaphore.TryAcquire(ctx, primary, "tenant", 1, time.Hour, &semaphore.AcquireOpts{Holder: "worker-a"})
	if err != nil {
		t.Fatal(err)
	}
	if err := semaphore.Release(ctx, primary, p); err != nil {
		t.Fatal(err)
	}
	standby := pair.standby.pool("pgcoord-failover-standby")
	pair.waitReplayed(primary, standby)
	standby.Close()

	// Grants it never receives: they commit on the primary and are acknowledged to their
	// holders, and then the primary crashes.
	pair.standby.stop("fast")
	lostLease, err := leases.TryAcquire(ctx, primary, "report", time.Hour, &leases.AcquireOpts{Holder: "worker-b"})
	if err != nil {
		t.Fatal(err)
	}
	lostPermit, err := semaphore.TryAcquire(ctx, primary, "tenant", 1, time.Hour, &semaphore.AcquireOpts{Holder: "worker-b"})
	if err != nil {
		t.Fatal(err)
	}
	lostRun, err := singleton.ClaimTick(ctx, primary, hourlyJob, &singleton.ClaimOpts{Holder: "worker-b"})
	if err != nil {
		t.Fatal(err)
	}
	pair.primary.stop("immediate")
	pair.standby.start()
	pair.standby.promote()
	promoted := pair.standby.pool("pgcoord-failover-promoted")

	// The hazard: the promoted standby never saw those grants. Its rows still carry the
	// older grants' tokens, below the ones worker-b holds, and the token sequence's own
	// state is only as recent as the last of its WAL records the standby replayed: counting
	// on from what the standby knows could issue worker-b's tokens again.
	info, err := leases.Get(ctx, promoted, "report")
	if err != nil {
		t.Fatal(err)
	}
	if info.Held() || info.Token != l.Token || info.Token >= lostLease.Token {
		t.Fatalf("the promoted standby's lease is %+v; want it free, with worker-a's token %d below the lost token %d", info, l.Token, lostLease.Token)
	}
	var semToken int64
	if err := promoted.QueryRow(ctx, `SELECT fence_token FROM pgcoord_semaphores WHERE key = 'tenant'`).Scan(&semToken); err != nil {
		t.Fatal(err)
	}
	if semToken != p.Token || semToken >= lostPermit.Token {
		t.Fatalf("the promoted standby's semaphore token is %d; want worker-a's %d, below the lost permit's token %d", semToken, p.Token, lostPermit.Token)
	}
	runs, err := singleton.ListRuns(ctx, promoted, hourlyJob.Name, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(runs) != 0 {
		t.Fatalf("the promoted standby knows runs %+v; the claim should have been lost", runs)
	}

	// The floor: the promoted standby is on timeline 2, and every token it issues is higher
	// than every token timeline 1 issued, lost ones included.
	if floor := tokenFloor(t, promoted); floor != timeline2Floor {
		t.Fatalf("pgcoord_token_floor() after promotion is %d, want %d (timeline 2)", floor, timeline2Floor)
	}
	newLease, err := leases.TryAcquire(ctx, promoted, "report", time.Hour, &leases.AcquireOpts{Holder: "worker-c"})
	if err != nil {
		t.Fatal(err)
	}
	newPermit, err := semaphore.TryAcquire(ctx, promoted, "tenant", 1, time.Hour, &semaphore.AcquireOpts{Holder: "worker-c"})
	if err != nil {
		t.Fatal(err)
	}
	newRun, err := singleton.ClaimTick(ctx, promoted, hourlyJob, &singleton.ClaimOpts{Holder: "worker-c"})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		what      string
		lost, got int64
	}{
		{"lease", lostLease.Token, newLease.Token},
		{"permit", lostPermit.Token, newPermit.Token},
		{"run", lostRun.Token, newRun.Token},
	} {
		if c.got <= c.lost || c.got <= timeline2Floor || c.got >= 2*timeline2Floor {
			t.Errorf("%s: the promoted standby issued token %d after the lost %d; want one above the floor %d of timeline 2",
				c.what, c.got, c.lost, timeline2Floor)
		}
	}
	if !(newLease.Token < newPermit.Token && newPermit.Token < newRun.Token) {
		t.Errorf("tokens issued in turn after the promotion: %d, %d, %d; want increasing", newLease.Token, newPermit.Token, newRun.Token)
	}

	// Counting goes on above the floor.
	if err := leases.Release(ctx, promoted, newLease, nil); err != nil {
		t.Fatal(err)
	}
	again, err := leases.TryAcquire(ctx, promoted, "report", time.Hour, nil)
	if err != nil || again.Token <= newRun.Token {
		t.Fatalf("the grant after %d: token %d (%v), want a higher one", newRun.Token, again.Token, err)
	}
}

// TestFailoverSyncCommitOption shows that a grant's SyncCommit option becomes the
// synchronous_commit of the transaction that grants, for every kind of grant, and that
// without it the server's setting stays. (TestFailoverSyncGrantsSurvive shows what the
// setting does with a synchronous standby.)
func TestFailoverSyncCommitOption(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pgtest.Pool(t)
	grants := []struct {
		name  string
		grant func(tx pgx.Tx, level string) error
	}{
		{"leases.TryAcquire", func(tx pgx.Tx, level string) error {
			_, err := leases.TryAcquire(ctx, tx, "report", time.Minute, &leases.AcquireOpts{SyncCommit: level})
			return err
		}},
		{"semaphore.TryAcquire", func(tx pgx.Tx, level string) error {
			_, err := semaphore.TryAcquire(ctx, tx, "tenant", 1, time.Minute, &semaphore.AcquireOpts{SyncCommit: level})
			return err
		}},
		{"semaphore.Next", func(tx pgx.Tx, level string) error {
			if err := semaphore.AddDemand(ctx, tx, "tenant", 1, nil); err != nil {
				return err
			}
			_, err := semaphore.Next(ctx, tx, time.Minute, &semaphore.NextOpts{SyncCommit: level})
			return err
		}},
		{"singleton.ClaimTick", func(tx pgx.Tx, level string) error {
			job := hourlyJob
			job.SyncCommit = level
			_, err := singleton.ClaimTick(ctx, tx, job, nil)
			return err
		}},
	}
	var server string
	if err := pool.QueryRow(ctx, `SHOW synchronous_commit`).Scan(&server); err != nil {
		t.Fatal(err)
	}
	for _, g := range grants {
		for _, level := range []string{"", "remote_write", "remote_apply"} {
			want := level
			if level == "" {
				want = server
			}
			func() {
				tx, err := pool.Begin(ctx)
				if err != nil {
					t.Fatal(err)
				}
				defer tx.Rollback(ctx) // each round grants afresh
				if err := g.grant(tx, level); err != nil {
					t.Fatalf("%s with SyncCommit %q: %v", g.name, level, err)
				}
				var got string
				if err := tx.QueryRow(ctx, `SHOW synchronous_commit`).Scan(&got); err != nil {
					t.Fatal(err)
				}
				if got != want {
					t.Errorf("%s with SyncCommit %q: the granting transaction commits with synchronous_commit %q, want %q", g.name, level, got, want)
				}
			}()
		}
	}
}

// tokenFloor returns pgcoord_token_floor() on db.
func tokenFloor(t *testing.T, db *pgxpool.Pool) int64 {
	t.Helper()
	var floor int64
	if err := db.QueryRow(t.Context(), `SELECT pgcoord_token_floor()`).Scan(&floor); err != nil {
		t.Fatal(err)
	}
	return floor
}
