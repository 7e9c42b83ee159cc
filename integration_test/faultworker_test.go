//go:build unix

package integration_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/dedupe"
	"github.com/pgcoord/pgcoord/fenced"
	"github.com/pgcoord/pgcoord/idempotency"
	"github.com/pgcoord/pgcoord/internal/workerproc"
	"github.com/pgcoord/pgcoord/leases"
	"github.com/pgcoord/pgcoord/outbox"
	"github.com/pgcoord/pgcoord/outbox/inbox"
	"github.com/pgcoord/pgcoord/pgcoord"
	"github.com/pgcoord/pgcoord/ratelimit"
	"github.com/pgcoord/pgcoord/semaphore"
	"github.com/pgcoord/pgcoord/singleton"
)

// The fault worker: one process of the fault-injection suite (faults_test.go). It runs its
// workloads at once until it is told to stop (or killed), and says what it did, line by
// line, with timestamps from the host's clock (shared by every process of the machine):
//
//	op <id> call <ns> write <register> <token> <value>   then   op <id> ret <ns> ok|stale
//	op <id> call <ns> read <register>                    then   op <id> ret <ns> <token> <value> <server> <timeline>
//	acq <id> call <ns> <register>                        then   acq <id> ret <ns> <token>|held
//	trust <register> <token> <from ns> <until ns>        a grant, trusted from its reply until its deadline
//	untrust <register> <token> <ns>                      ... or until its release
//	permit <token> start <db ns> <expires db ns>         then   permit <token> end <db ns>
//	tick <unix µs> <token> <attempt>                     a cron run that recorded its effect
//	rl <id>                                              a rate-limited call admitted, committed with its record
//	pw <id> ok|stale                                     a partition write committed, or refused by its fence
//
//	err <ns> <class>                                     a grant attempt failed (errorClass)
//
// An op or acq without "ret" had an unknown outcome (the process died, the connection was
// cut): a write or a grant may have committed.

const faultRole = "fault"

// The workloads' parameters.
const (
	faultRegisters = 2                      // fenced registers, each guarded by a lease of its name
	faultLeaseTTL  = 400 * time.Millisecond // short, so that pauses outlast it
	faultSemKey    = "fault-sem"
	faultSemLimit  = 2
	faultSemTTL    = 400 * time.Millisecond
	faultCronJob   = "fault-cron"
	// A run must heartbeat within its TTL or lose its tick. With a TTL of 500 ms every run of
	// a loaded machine (-race beside CPU hogs) lost its trust deadline; with 1 s, every run
	// of one CI machine four times slower than that did. 2 s leaves the first heartbeat
	// 1.1 s, and a slot of 3 s leaves room for another replica to take over the tick of a
	// killed runner.
	faultCronEvery  = 3 * time.Second
	faultCronTTL    = 2 * time.Second
	faultTopic      = "fault-orders"
	faultOutboxKeys = 20
	faultConsumer   = "fault-consumer"
	faultPayScope   = "faults"
	faultPayKeys    = 1500
	faultOpTimeout  = 3 * time.Second // bounds every statement, so a cut link cannot hang a loop
	// The workers together call the rate limit faster than it admits, so it is always spent.
	faultRatePolicy = "fault-rl"
	faultRate       = 20 // per second
	faultRateBurst  = 5
)

func init() { workerRoles[faultRole] = faultWorker }

// faultWorker runs the register, semaphore, cron, idempotency, outbox, rate limit and
// partition workloads until "stop". Parameters:
// NAME, SEED, and FENCING=off to write the registers and the partitions without the fence (a
// broken workload the checks must catch).
func faultWorker(ctx context.Context, w *workerproc.Worker) error {
	name := w.Param("NAME")
	seed, err := strconv.ParseUint(w.Param("SEED"), 10, 64)
	if err != nil {
		return err
	}
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	go func() {
		_ = w.Await("stop")
		stop()
	}()
	w.Say("started")
	loops := []func(context.Context, *workerproc.Worker, string, *rand.Rand){faultRegisterLoop, faultSemaphoreLoop, faultCronLoop,
		faultIdempotencyLoop, faultProducerLoop, faultRelayLoop, faultRatelimitLoop, faultPartitionLoop}
	done := make(chan struct{})
	for i, loop := range loops {
		go func() {
			loop(ctx, w, name, rand.New(rand.NewPCG(seed, uint64(i))))
			done <- struct{}{}
		}()
	}
	for range loops {
		<-done
	}
	return nil
}

// faultReadQuery reads a register, with the address of the server that answered and the
// timeline it writes on (0 on a standby), read from the token floor, as tokens carry theirs.
const faultReadQuery = `SELECT token, value, coalesce(host(inet_server_addr()), 'socket'),
       CASE WHEN pg_is_in_recovery() THEN 0 ELSE (pgcoord_token_floor() >> 44) + 1 END
  FROM fault_register WHERE name = $1`

// faultRegisterLoop takes the lease of a random register and writes the register under the
// grant's fence token a few times, with pauses in between; or reads a register. It never
// checks that it still holds the lease: stale writes are what the fence must refuse.
func faultRegisterLoop(ctx context.Context, w *workerproc.Worker, name string, rng *rand.Rand) {
	unfenced := w.Param("FENCING") == "off"
	var seq int64
	opID := func() string { seq++; return fmt.Sprintf("%s-%d", name, seq) }
	for ctx.Err() == nil {
		reg := fmt.Sprintf("reg-%d", rng.IntN(faultRegisters))
		if rng.IntN(4) == 0 {
			id := opID()
			w.Say("op %s call %d read %s", id, time.Now().UnixNano(), reg)
			var token, value int64
			// Which server answered, and its timeline: a primary that a failover deposed
			// answers reads on its open connections until it steps down (faultReadQuery).
			var server string
			var timeline int64
			err := withTimeout(ctx, func(ctx context.Context) error {
				return w.Pool.QueryRow(ctx, faultReadQuery, reg).Scan(&token, &value, &server, &timeline)
			})
			if err == nil {
				w.Say("op %s ret %d %d %d %s %d", id, time.Now().UnixNano(), token, value, server, timeline)
			}
			continue
		}
		// A grant matters to the fence even before its holder writes: the register then
		// refuses every lower token.
		var l leases.Lease
		acq := opID()
		w.Say("acq %s call %d %s", acq, time.Now().UnixNano(), reg)
		err := withTimeout(ctx, func(ctx context.Context) (err error) {
			l, err = leases.TryAcquire(ctx, w.Pool, reg, faultLeaseTTL, &leases.AcquireOpts{Holder: name})
			return err
		})
		switch {
		case err == nil:
			w.Say("acq %s ret %d %d", acq, time.Now().UnixNano(), l.Token)
		case errors.Is(err, leases.ErrHeld):
			w.Say("acq %s ret %d held", acq, time.Now().UnixNano())
		case ctx.Err() == nil:
			w.Say("err %d %s", time.Now().UnixNano(), errorClass(err))
		}
		if err != nil {
			sleepRand(ctx, rng, 20*time.Millisecond)
			continue
		}
		// Trusted from the reply's arrival until its trust deadline.
		w.Say("trust %s %d %d %d", reg, l.Token, time.Now().UnixNano(), l.TrustUntil.UnixNano())
		for range 1 + rng.IntN(3) {
			sleepRand(ctx, rng, 150*time.Millisecond) // work; a pause here outlasts the lease
			id := opID()
			value := rng.Int64N(1 << 40)
			w.Say("op %s call %d write %s %d %d", id, time.Now().UnixNano(), reg, l.Token, value)
			err := withTimeout(ctx, func(ctx context.Context) error {
				return pgx.BeginFunc(ctx, w.Pool, func(tx pgx.Tx) error {
					const write = `UPDATE fault_register SET token = $2, value = $3 WHERE name = $1`
					if unfenced {
						_, err := tx.Exec(ctx, write, reg, l.Token, value)
						return err
					}
					_, err := fenced.Write(ctx, tx, reg, l.Token, write, reg, l.Token, value)
					return err
				})
			})
			switch {
			case errors.Is(err, fenced.ErrStale):
				w.Say("op %s ret %d stale", id, time.Now().UnixNano())
			case err == nil:
				w.Say("op %s ret %d ok", id, time.Now().UnixNano())
			}
			// Any other error: the outcome is unknown (the commit may have happened).
		}
		w.Say("untrust %s %d %d", reg, l.Token, time.Now().UnixNano()) // it stops trusting as it releases
		_ = withTimeout(ctx, func(ctx context.Context) error { return leases.Release(ctx, w.Pool, l, nil) })
	}
}

// faultSemaphoreLoop takes permits of one key and holds each for a while. Each permit's
// life is said by the database clock: from after the admission to before the release, or
// to its expiry if it was not released.
func faultSemaphoreLoop(ctx context.Context, w *workerproc.Worker, name string, rng *rand.Rand) {
	for ctx.Err() == nil {
		var p semaphore.Permit
		err := withTimeout(ctx, func(ctx context.Context) (err error) {
			p, err = semaphore.TryAcquire(ctx, w.Pool, faultSemKey, faultSemLimit, faultSemTTL, &semaphore.AcquireOpts{Holder: name})
			return err
		})
		if err != nil {
			sleepRand(ctx, rng, 30*time.Millisecond)
			continue
		}
		start, err := dbNow(ctx, w.Pool)
		if err != nil {
			// Its start is unknown: let it expire unused, as a dead worker's would.
			continue
		}
		w.Say("permit %d start %d %d", p.Token, start.UnixNano(), p.ExpiresAt.UnixNano())
		sleepRand(ctx, rng, 120*time.Millisecond) // the job
		end, err := dbNow(ctx, w.Pool)
		if err != nil {
			continue // not released: it ends at its expiry, which the start line says
		}
		// Live until end at least (and not past its expiry), whatever the release's outcome:
		// a release whose reply is lost may have committed.
		w.Say("permit %d end %d", p.Token, min(end.UnixNano(), p.ExpiresAt.UnixNano()))
		_ = withTimeout(ctx, func(ctx context.Context) error { return semaphore.Release(ctx, w.Pool, p) })
	}
}

// faultCronLoop runs the cron job on this replica. Each run records its tick's effect once,
// in the dedupe table, in the transaction that inserts the effect row.
func faultCronLoop(ctx context.Context, w *workerproc.Worker, name string, rng *rand.Rand) {
	job := singleton.Job{Name: faultCronJob, Every: faultCronEvery, TTL: faultCronTTL}
	_ = singleton.Schedule(ctx, w.Pool, job, func(ctx context.Context, run singleton.Run) error {
		sleepRand(ctx, rng, 200*time.Millisecond) // the run's work
		tick := run.ScheduledFor.UnixMicro()
		err := withTimeout(ctx, func(ctx context.Context) error {
			return pgx.BeginFunc(ctx, w.Pool, func(tx pgx.Tx) error {
				first, err := dedupe.Claim(ctx, tx, faultCronJob, strconv.FormatInt(tick, 10), nil)
				if err != nil || !first {
					return err
				}
				_, err = tx.Exec(ctx, `INSERT INTO fault_effects (tick, worker, token) VALUES ($1, $2, $3)`, tick, name, run.Token)
				return err
			})
		})
		if err == nil {
			w.Say("tick %d %d %d", tick, run.Token, run.Attempt)
		}
		return err
	}, &singleton.ScheduleOpts{Holder: name, Logger: slog.New(slog.DiscardHandler)})
}

// faultIdempotencyLoop charges payments by idempotency key, in Atomic mode: the charge row
// commits with the stored response, or not at all. The keys come from a space shared by
// every worker, so the same key is often tried by several at once, and by the next worker
// after one died holding it.
func faultIdempotencyLoop(ctx context.Context, w *workerproc.Worker, name string, rng *rand.Rand) {
	fp := idempotency.Fingerprint("POST", "/charges", nil, nil)
	for ctx.Err() == nil {
		key := fmt.Sprintf("pay-%d", rng.IntN(faultPayKeys))
		_ = withTimeout(ctx, func(ctx context.Context) error {
			a, err := idempotency.Begin(ctx, w.Pool, faultPayScope, key, fp, &idempotency.BeginOpts{Atomic: true})
			if err != nil {
				return err
			}
			defer a.Close(context.WithoutCancel(ctx))
			if a.Replay() != nil {
				return nil
			}
			sleepRand(ctx, rng, 100*time.Millisecond) // the handler's work; a pause here
			if _, err := a.Tx().Exec(ctx, `INSERT INTO fault_charges (key, worker) VALUES ($1, $2)`, key, name); err != nil {
				return err
			}
			return a.Complete(ctx, idempotency.Response{Status: 201, Body: []byte(name)})
		})
		sleepRand(ctx, rng, 30*time.Millisecond)
	}
}

// faultRatelimitLoop calls one rate limit in a loop; an admitted call inserts its record
// (with the database clock before and after the call) in the call's transaction, and says
// "rl <id>" once that committed: an acknowledged admission.
func faultRatelimitLoop(ctx context.Context, w *workerproc.Worker, name string, rng *rand.Rand) {
	limit := []ratelimit.Limit{{Policy: faultRatePolicy, Key: "hot"}}
	for n := 1; ctx.Err() == nil; n++ {
		id := fmt.Sprintf("%s-%d", name, n)
		var admitted bool
		err := withTimeout(ctx, func(ctx context.Context) error {
			return pgx.BeginFunc(ctx, w.Pool, func(tx pgx.Tx) error {
				var before time.Time
				if err := tx.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&before); err != nil {
					return err
				}
				d, err := ratelimit.Allow(ctx, tx, 1, limit, nil)
				if err != nil || !d.Allowed {
					return err
				}
				admitted = true
				_, err = tx.Exec(ctx, `INSERT INTO fault_rl_calls (id, worker, before_at, after_at) VALUES ($1, $2, $3, clock_timestamp())`,
					id, name, before)
				return err
			})
		})
		if err == nil && admitted {
			w.Say("rl %s", id)
		}
		// A few calls a second per worker keep the limit spent without loading the cluster.
		sleepRand(ctx, rng, 150*time.Millisecond)
	}
}

// faultProducerLoop enqueues messages for keys shared by every worker, a few per
// transaction, and rolls back about one transaction in five: those messages must never
// be applied.
func faultProducerLoop(ctx context.Context, w *workerproc.Worker, name string, rng *rand.Rand) {
	for ctx.Err() == nil {
		rollback := rng.IntN(5) == 0
		_ = withTimeout(ctx, func(ctx context.Context) error {
			tx, err := w.Pool.Begin(ctx)
			if err != nil {
				return err
			}
			defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }() // after Commit: a no-op
			for range 1 + rng.IntN(3) {
				msg := outbox.Message{Topic: faultTopic, Key: fmt.Sprintf("acct-%d", rng.IntN(faultOutboxKeys)), Payload: []byte(name)}
				if _, err := outbox.Enqueue(ctx, tx, msg); err != nil {
					return err
				}
			}
			sleepRand(ctx, rng, 30*time.Millisecond) // the business transaction's work
			if rollback {
				return nil
			}
			return tx.Commit(ctx)
		})
		sleepRand(ctx, rng, 50*time.Millisecond)
	}
}

// faultRelayLoop runs a relay of the fault topic (see newFaultRelay).
func faultRelayLoop(ctx context.Context, w *workerproc.Worker, name string, _ *rand.Rand) {
	relay, err := newFaultRelay(w.Pool, name)
	if err != nil {
		w.Say("error %v", err)
		return
	}
	_ = relay.Run(ctx) // it retries database errors itself, until ctx ends
}

// newFaultRelay returns a relay whose handler applies each message through the inbox, in
// the consumer's transaction, recording the application in fault_applied.
func newFaultRelay(pool *pgxpool.Pool, name string) (*outbox.Relay, error) {
	apply := func(ctx context.Context, msg outbox.Message) error {
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			first, err := inbox.Claim(ctx, tx, faultConsumer, msg.ID)
			if err != nil || !first {
				return err
			}
			_, err = tx.Exec(ctx, `INSERT INTO fault_applied (message_id, key, worker) VALUES ($1, $2, $3)`, msg.ID, msg.Key, name)
			return err
		})
	}
	return outbox.NewRelay(pool, &outbox.Config{Handler: outbox.HandlerFunc(apply), Topics: []string{faultTopic},
		ClaimTTL: time.Second, PollInterval: 200 * time.Millisecond, Backoff: 50 * time.Millisecond, MaxBackoff: time.Second,
		Claimant: name, Logger: slog.New(slog.DiscardHandler)})
}

// withTimeout runs f with a context bounded by faultOpTimeout.
func withTimeout(ctx context.Context, f func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, faultOpTimeout)
	defer cancel()
	return f(ctx)
}

func dbNow(ctx context.Context, pool *pgxpool.Pool) (t time.Time, err error) {
	err = withTimeout(ctx, func(ctx context.Context) error {
		return pool.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&t)
	})
	return t, err
}

func sleepRand(ctx context.Context, rng *rand.Rand, most time.Duration) {
	select {
	case <-time.After(time.Duration(rng.Int64N(int64(most)))):
	case <-ctx.Done():
	}
}

// errorClass names what a client saw when a call failed: the server refused to write
// (read-only: a standby, or a primary being demoted), the call ran out of time, the server
// answered with another error (its SQLSTATE), or the connection failed.
func errorClass(err error) string {
	var pgErr *pgconn.PgError
	switch {
	case errors.Is(err, pgcoord.ErrReadOnly):
		return "read-only"
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	case errors.As(err, &pgErr):
		return "sqlstate-" + pgErr.Code
	default:
		return "connection"
	}
}
