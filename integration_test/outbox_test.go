//go:build unix

package integration_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/internal/workerproc"
	"github.com/pgcoord/pgcoord/outbox"
	"github.com/pgcoord/pgcoord/outbox/inbox"
)

// The transactional outbox with real processes. Producer processes write messages to a
// handful of keys in transactions that stay open for random short times (so they commit
// in an order unrelated to their ids) and roll back one in five. Relay processes deliver
// them to a consumer that applies each message through the inbox, in the consumer's
// transaction, into ob_effects. Meanwhile the test SIGKILLs relays mid-batch (and starts
// replacements) and SIGSTOPs others for longer than their claim TTL (so their claims are
// taken over) before letting them continue. One key starts with a poison message that
// fails every delivery.
//
// At the end, from the database: every committed message but the poison one has exactly
// one effect, despite the redeliveries; no rolled-back message has any; within each key
// the effects were applied in id order (= commit order); the poison message is dead after
// its attempts, has no effect, and the messages of its key behind it were applied only
// after it went dead, while the other keys flowed.

const (
	obProducerRole = "outbox.producer"
	obRelayRole    = "outbox.relay"
	obProducers    = 3
	obRelays       = 3
	obTxPerProd    = 250
	obClaimTTL     = 700 * time.Millisecond
	obMaxAttempts  = 3
	obConsumer     = "ledger"
)

var obKeys = []string{"acct-1", "acct-2", "acct-3", "acct-4", "acct-5", "acct-6"}

func init() {
	workerRoles[obProducerRole] = outboxProducer
	workerRoles[obRelayRole] = outboxRelay
}

const obSchema = `
CREATE TABLE ob_effects (
	seq        bigint      GENERATED ALWAYS AS IDENTITY,
	message_id bigint      NOT NULL,
	key        text        NOT NULL,
	applied_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE TABLE ob_redeliveries (message_id bigint NOT NULL);
`

// obPayload is the body of the integration test's messages.
type obPayload struct {
	Producer string `json:"producer"`
	Tx       int    `json:"tx"`
	Poison   bool   `json:"poison,omitempty"`
}

// outboxProducer writes TXS transactions of 1 to 3 messages each to random keys (in key
// order within a transaction), keeping each open for 0-4ms, and rolls back one in five.
// Parameters: NAME, SEED, TXS. It says "rolledback <id>" for every message of a rolled-back
// transaction, and "done" at the end.
func outboxProducer(ctx context.Context, w *workerproc.Worker) error {
	name := w.Param("NAME")
	seed, _ := strconv.ParseUint(w.Param("SEED"), 10, 64)
	txs, err := strconv.Atoi(w.Param("TXS"))
	if err != nil {
		return err
	}
	rng := rand.New(rand.NewPCG(seed, 11))
	w.Say("ready")
	for i := range txs {
		keys := make([]string, 1+rng.IntN(3))
		for j := range keys {
			keys[j] = obKeys[rng.IntN(len(obKeys))]
		}
		slices.Sort(keys)
		tx, err := w.Pool.Begin(ctx)
		if err != nil {
			return err
		}
		var ids []int64
		for _, k := range keys {
			body, _ := json.Marshal(obPayload{Producer: name, Tx: i})
			m, err := outbox.Enqueue(ctx, tx, outbox.Message{Topic: "ledger", Key: k, Payload: body, JSON: true})
			if err != nil {
				_ = tx.Rollback(ctx)
				return err
			}
			ids = append(ids, m.ID)
		}
		time.Sleep(time.Duration(rng.IntN(4000)) * time.Microsecond) // the transaction's own work
		if rng.IntN(5) == 0 {
			if err := tx.Rollback(ctx); err != nil {
				return err
			}
			for _, id := range ids {
				w.Say("rolledback %d", id)
			}
			continue
		}
		if err := tx.Commit(ctx); err != nil {
			return err
		}
	}
	w.Say("done")
	return nil
}

// outboxRelay runs a relay whose handler applies each message once through the inbox,
// until "quit" on stdin. It says "ready", and "bye <stats>" when it stops.
func outboxRelay(ctx context.Context, w *workerproc.Worker) error {
	handler := outbox.HandlerFunc(func(ctx context.Context, m outbox.Message) error {
		var p obPayload
		if err := json.Unmarshal(m.Payload, &p); err != nil {
			return err
		}
		if p.Poison {
			return fmt.Errorf("poison message %d", m.ID)
		}
		time.Sleep(time.Duration(500+rand.IntN(1500)) * time.Microsecond) // the consumer's work
		return pgx.BeginFunc(ctx, w.Pool, func(tx pgx.Tx) error {
			first, err := inbox.Claim(ctx, tx, obConsumer, m.ID)
			if err != nil {
				return err
			}
			if !first {
				_, err = tx.Exec(ctx, `INSERT INTO ob_redeliveries VALUES ($1)`, m.ID)
				return err
			}
			_, err = tx.Exec(ctx, `INSERT INTO ob_effects (message_id, key) VALUES ($1, $2)`, m.ID, m.Key)
			return err
		})
	})
	relay, err := outbox.NewRelay(w.Pool, &outbox.Config{
		Handler: handler, BatchSize: 20, KeyBatchSize: 5, Concurrency: 2, ClaimTTL: obClaimTTL,
		MaxAttempts: obMaxAttempts, Backoff: 20 * time.Millisecond, MaxBackoff: 100 * time.Millisecond,
		PollInterval: 100 * time.Millisecond, Claimant: w.Param("NAME"),
	})
	if err != nil {
		return err
	}
	rctx, stop := context.WithCancel(ctx)
	go func() {
		defer stop()
		for {
			if cmd, err := w.Next(); err != nil || cmd == "quit" {
				return
			}
		}
	}()
	w.Say("ready")
	if err := relay.Run(rctx); err != nil {
		return err
	}
	s := relay.Stats()
	w.Say("bye delivered=%d failed=%d dead=%d released=%d fenced=%d", s.Delivered, s.Failed, s.Dead, s.Released, s.Fenced)
	return nil
}

func TestOutboxWithRealProcessesKillsAndPauses(t *testing.T) {
	t.Parallel()
	takeChaosTurn(t)
	ctx := t.Context()
	pool, schema := workerDB(t, obSchema)
	url := pgtest.URL(t)
	// The poison message heads its key, with two messages behind it.
	var poisonKey []int64
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		for i, poison := range []bool{true, false, false} {
			body, _ := json.Marshal(obPayload{Producer: "test", Tx: i, Poison: poison})
			m, err := outbox.Enqueue(ctx, tx, outbox.Message{Topic: "ledger", Key: "poisoned", Payload: body, JSON: true})
			if err != nil {
				return err
			}
			poisonKey = append(poisonKey, m.ID)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}

	start := func(name, role string, params map[string]string) *workerproc.Proc {
		t.Helper()
		params["NAME"] = name
		p, err := startWorker(t, name, role, url, schema, params)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := p.Expect(pgtest.WaitLimit, "ready"); err != nil {
			t.Fatal(err)
		}
		return p
	}
	var producers []*workerproc.Proc
	for i := range obProducers {
		producers = append(producers, start(fmt.Sprint("producer-", i), obProducerRole,
			map[string]string{"SEED": fmt.Sprint(i + 1), "TXS": fmt.Sprint(obTxPerProd)}))
	}
	relays := map[string]*workerproc.Proc{}
	nextRelay := 0
	startRelay := func() {
		name := fmt.Sprint("relay-", nextRelay)
		nextRelay++
		relays[name] = start(name, obRelayRole, map[string]string{})
	}
	for range obRelays {
		startRelay()
	}
	// A failure explains itself: the relays' stderr first, the database's state last.
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		for _, p := range relays {
			logStderrTail(t, p)
		}
		logRows(t, pool, "pending messages by key (key, bucket, pending, claimed now, due, first id, claimed by, most attempts)", `
			SELECT key, min(bucket), count(*), count(*) FILTER (WHERE claim_expires_at > clock_timestamp()),
			       count(*) FILTER (WHERE available_at <= clock_timestamp()), min(id), min(claimed_by), max(attempts)
			  FROM pgcoord_outbox WHERE state = 'pending' GROUP BY key ORDER BY key LIMIT 40`)
		logGroup(t, pool, outbox.GroupName(nil))
		logSessions(t, pool)
	})

	// Collect the producers' rolled-back ids as they go.
	rolledBack := map[int64]bool{}
	producing := make(chan struct{})
	type line struct {
		s   string
		err error
	}
	lines := make(chan line)
	for _, p := range producers {
		go func() {
			for {
				l, err := p.Expect(2*time.Minute, "rolledback ", "done")
				lines <- line{l, err}
				if err != nil || l == "done" {
					return
				}
			}
		}()
	}
	go func() {
		defer close(producing)
		for done := 0; done < len(producers); {
			l := <-lines
			switch {
			case l.err != nil:
				t.Error(l.err)
				done++
			case l.s == "done":
				done++
			default:
				id, _ := strconv.ParseInt(strings.TrimPrefix(l.s, "rolledback "), 10, 64)
				rolledBack[id] = true
			}
		}
	}()

	// Chaos while the producers run, and a little after: every 150-400ms, in turn, SIGKILL a
	// relay (and start another) or SIGSTOP one for twice its claim TTL.
	rng := rand.New(rand.NewPCG(3, 4))
	var kills, pauses int
	chaosEnd := time.Time{}
	for {
		select {
		case <-producing:
			if chaosEnd.IsZero() {
				chaosEnd = time.Now().Add(time.Second)
			}
		default:
		}
		if !chaosEnd.IsZero() && time.Now().After(chaosEnd) {
			break
		}
		time.Sleep(time.Duration(150+rng.IntN(250)) * time.Millisecond) // the scenario's pace
		names := slices.Sorted(func(yield func(string) bool) {
			for n := range relays {
				if !yield(n) {
					return
				}
			}
		})
		victim := relays[names[rng.IntN(len(names))]]
		if (kills+pauses)%2 == 0 {
			if err := victim.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			if err := victim.Wait(pgtest.WaitLimit); err == nil {
				t.Fatalf("relay %s exited cleanly after SIGKILL", victim.Name())
			}
			delete(relays, victim.Name())
			kills++
			startRelay()
			continue
		}
		if err := victim.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * obClaimTTL) // paused past its claim
		if err := victim.Signal(syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
		pauses++
	}
	<-producing
	for _, p := range producers {
		if err := p.Wait(pgtest.WaitLimit); err != nil {
			t.Fatalf("producer %s: %v; stderr %s", p.Name(), err, p.Stderr())
		}
	}

	// The surviving relays drain the outbox: nothing pending, and never WaitLimit without
	// a delivery (a busy machine slows them down: CI's PG17 leg beside two CPU hogs had 514
	// pending 15 s after the producers finished; a stall fails as before).
	pgtest.UntilProgress(t, "the surviving relays deliver every pending message", func() (bool, int64) {
		var pending, delivered int64
		if err := pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE state = 'pending'), count(*) FILTER (WHERE state = 'delivered')
			FROM pgcoord_outbox`).Scan(&pending, &delivered); err != nil {
			t.Fatal(err)
		}
		return pending == 0, delivered
	})
	for _, p := range relays {
		if err := p.Send("quit"); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range relays {
		l, err := p.Expect(pgtest.WaitLimit, "bye")
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: %s", p.Name(), l)
		if err := p.Wait(pgtest.WaitLimit); err != nil {
			t.Fatalf("relay %s: %v; stderr %s", p.Name(), err, p.Stderr())
		}
	}

	// Every committed message, except the poison one, applied exactly once; nothing else.
	var committed, missing, duplicated, unknown, redelivered int
	err = pool.QueryRow(ctx, `SELECT
		(SELECT count(*) FROM pgcoord_outbox),
		(SELECT count(*) FROM pgcoord_outbox o WHERE o.id <> $1 AND NOT EXISTS (SELECT FROM ob_effects e WHERE e.message_id = o.id)),
		(SELECT count(*) - count(DISTINCT message_id) FROM ob_effects),
		(SELECT count(*) FROM ob_effects e WHERE NOT EXISTS (SELECT FROM pgcoord_outbox o WHERE o.id = e.message_id)),
		(SELECT count(*) FROM ob_redeliveries)`, poisonKey[0]).Scan(&committed, &missing, &duplicated, &unknown, &redelivered)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d messages committed, %d rolled back; %d relay kills, %d pauses past the claim; %d redeliveries turned away by the inbox",
		committed, len(rolledBack), kills, pauses, redelivered)
	if missing != 0 || duplicated != 0 || unknown != 0 {
		t.Fatalf("%d committed messages never applied, %d applied twice, %d effects of messages not in the outbox", missing, duplicated, unknown)
	}
	if committed < obProducers*obTxPerProd/2 || len(rolledBack) == 0 || kills == 0 || pauses == 0 {
		t.Fatalf("the run was too tame: %d committed, %d rolled back, %d kills, %d pauses", committed, len(rolledBack), kills, pauses)
	}
	rows, err := pool.Query(ctx, `SELECT message_id FROM ob_effects`)
	if err != nil {
		t.Fatal(err)
	}
	applied, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range applied {
		if rolledBack[id] {
			t.Fatalf("rolled-back message %d was applied", id)
		}
	}

	// Per key, effects in id order (ids of a key are in commit order).
	var disorders int
	err = pool.QueryRow(ctx, `SELECT count(*) FROM (
		SELECT message_id < lag(message_id) OVER (PARTITION BY key ORDER BY seq) AS back FROM ob_effects) x WHERE back`).Scan(&disorders)
	if err != nil || disorders != 0 {
		t.Fatalf("%d effects applied before an earlier message of their key (err %v)", disorders, err)
	}

	// The poison message: dead after its attempts, never applied, and its key resumed
	// only after it went dead.
	poison, err := outbox.Get(ctx, pool, poisonKey[0])
	if err != nil {
		t.Fatal(err)
	}
	if poison.State != outbox.Dead || poison.Attempts != obMaxAttempts {
		t.Fatalf("poison message %+v: want dead after %d attempts", poison, obMaxAttempts)
	}
	var behindFirst time.Time
	if err := pool.QueryRow(ctx, `SELECT min(applied_at) FROM ob_effects WHERE key = 'poisoned'`).Scan(&behindFirst); err != nil {
		t.Fatal(err)
	}
	if behindFirst.Before(poison.DeadAt) {
		t.Fatalf("a message behind the poison one was applied at %v, before it went dead at %v", behindFirst, poison.DeadAt)
	}
}
