package integration_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgcoord/pgcoord/dedupe"
	"github.com/pgcoord/pgcoord/fenced"
	"github.com/pgcoord/pgcoord/idempotency"
	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/leases"
	"github.com/pgcoord/pgcoord/outbox"
	"github.com/pgcoord/pgcoord/outbox/inbox"
	"github.com/pgcoord/pgcoord/partition"
	"github.com/pgcoord/pgcoord/pgcoord"
	"github.com/pgcoord/pgcoord/semaphore"
	"github.com/pgcoord/pgcoord/singleton"
)

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
		{"outbox.GC", func(ctx context.Context) error {
			_, err := outbox.GC(ctx, standby, nil)
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
		{"partition.Join", func(ctx context.Context) error {
			m, err := partition.Join(ctx, standby, "shards", &partition.Options{Partitions: 8})
			if err == nil {
				_ = m.Leave(ctx)
			}
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
