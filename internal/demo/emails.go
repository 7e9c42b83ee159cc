//go:build unix

package demo

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgcoord/pgcoord/dedupe"
	"github.com/pgcoord/pgcoord/internal/workerproc"
	"github.com/pgcoord/pgcoord/outbox"
	"github.com/pgcoord/pgcoord/outbox/inbox"
	"github.com/pgcoord/pgcoord/singleton"
)

// Incident 2, three weekly emails. The app runs in three replicas, and each has the
// weekly-report job.
//
//   - naive: an in-process cron in every replica. At the scheduled moment each one sends
//     the report to every customer: three emails each.
//   - pgcoord: singleton.Schedule claims each tick once in the job ledger, and each email
//     is claimed in a dedupe table in the transaction that writes it to the outbox; a
//     relay hands the outbox's emails to the mail provider, which applies each message
//     once (an inbox). The replica that runs the tick is killed (SIGKILL) a third of the
//     way through: its run stops heartbeating, another replica takes the tick over once
//     the run's lease expires, and the dedupe table skips the customers already served.

const (
	emailRole      = "emails"
	emailCustomers = 30
	emailReplicas  = 3
	// emailEvery is the demo's "week": the slot of a tick. Its first tick falls on the
	// moment every replica's timer fires (fireAt), so the replicas all watch that tick; the
	// slot is long enough for the takeover of a killed runner, which must come within it,
	// even on a loaded machine.
	emailEvery = 10 * time.Second
	// emailStartup is how long after every replica said it is ready the first tick falls:
	// each one must watch it, or it would wait for the next tick. (Their timer was set at
	// their start once, and a loaded machine started the last one after it: the tick then
	// had one replica, and nobody took it over.)
	emailStartup = 2 * time.Second
	// emailTTL is the lease of a running tick: a runner silent for that long is taken over.
	emailTTL = time.Second
	// emailPace is the time one email takes to send.
	emailPace = 10 * time.Millisecond
	// emailTopic is the outbox topic of the emails.
	emailTopic = "emails"
)

// Email modes.
const (
	mailNaive   = "naive"
	mailPgcoord = "pgcoord"
)

// EmailResult is incident 2's outcome per mode: emails per customer (most and fewest), and
// in pgcoord mode who was killed and who took the tick over.
type EmailResult struct {
	MostPerCustomer, FewestPerCustomer map[string]int
	Killed, TookOver                   string
	SentBeforeKill                     int
	TakeoverAttempt                    int
}

func (d *demo) emails(ctx context.Context) (EmailResult, error) {
	res := EmailResult{MostPerCustomer: map[string]int{}, FewestPerCustomer: map[string]int{}}
	for _, mode := range []string{mailNaive, mailPgcoord} {
		d.step("incident 2, %s: three replicas of the app run the weekly report", mode)
		campaign, err := d.emailRound(ctx, mode, &res)
		if err != nil {
			return res, fmt.Errorf("%s: %w", mode, err)
		}
		var most, fewest int
		err = d.pool.QueryRow(ctx, `SELECT coalesce(max(n), 0), coalesce(min(n), 0) FROM (
				SELECT c, (SELECT count(*) FROM demo_emails e WHERE e.mode = $1 AND e.campaign = $2 AND e.customer = c) AS n
				FROM generate_series(1, $3::int) AS c) per_customer`, mode, campaign, emailCustomers).Scan(&most, &fewest)
		if err != nil {
			return res, err
		}
		res.MostPerCustomer[mode], res.FewestPerCustomer[mode] = most, fewest
	}
	return res, nil
}

// emailRound runs the three replicas in one mode and returns the campaign they sent.
func (d *demo) emailRound(ctx context.Context, mode string, res *EmailResult) (string, error) {
	if mode == mailPgcoord { // the mail provider, fed by the outbox
		relay, err := outbox.NewRelay(d.pool, &outbox.Config{Handler: outbox.HandlerFunc(d.sendEmail),
			Topics: []string{emailTopic}, PollInterval: 100 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			return "", err
		}
		rctx, stop := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { _ = relay.Run(rctx); close(done) }()
		defer func() { stop(); <-done }()
	}
	var procs []*workerproc.Proc
	for i := 1; i <= emailReplicas; i++ {
		name := "replica-" + strconv.Itoa(i)
		p, err := d.start(name, emailRole, map[string]string{"MODE": mode, "NAME": name})
		if err != nil {
			return "", err
		}
		defer p.Stop(5 * time.Second)
		procs = append(procs, p)
	}
	g := workerproc.NewGroup(procs...)
	for range procs {
		if _, err := g.Next(stepTimeout, "ready"); err != nil {
			return "", err
		}
	}
	fireAt := time.Now().Add(emailStartup) // every replica's own timer says: now
	g.Send("fire " + strconv.FormatInt(fireAt.UnixMilli(), 10))
	if mode == mailNaive {
		var campaign string
		for range procs {
			l, err := g.Next(stepTimeout, "sent")
			if err != nil {
				return "", err
			}
			campaign = strings.Fields(l.Text)[2]
		}
		return campaign, nil
	}
	stalled, err := g.Next(stepTimeout, "stalled") // the runner of the tick, a third of the way through
	if err != nil {
		return "", err
	}
	if err := stalled.Proc.Signal(syscall.SIGKILL); err != nil {
		return "", err
	}
	res.Killed = stalled.Proc.Name()
	res.SentBeforeKill, _ = strconv.Atoi(strings.Fields(stalled.Text)[2])
	ran, err := g.Next(stepTimeout, "ran") // the tick, taken over and finished by another replica
	if err != nil {
		return "", err
	}
	f := strings.Fields(ran.Text) // ran <campaign> <attempt>
	res.TookOver = ran.Proc.Name()
	res.TakeoverAttempt, _ = strconv.Atoi(f[2])
	g.Send("stop")
	return f[1], d.drainOutbox(ctx)
}

// drainOutbox waits until the relay has delivered every email of the outbox.
func (d *demo) drainOutbox(ctx context.Context) error {
	deadline := time.Now().Add(stepTimeout)
	for {
		topics, err := outbox.Stats(ctx, d.pool, &outbox.StatsOpts{Topic: emailTopic})
		if err != nil {
			return err
		}
		if len(topics) == 0 || topics[0].Pending == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d emails still in the outbox after %v", topics[0].Pending, stepTimeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// email is an outbox message of the weekly report.
type email struct {
	Campaign string `json:"campaign"`
	Customer int    `json:"customer"`
	Replica  string `json:"replica"`
}

// sendEmail is the mail provider: it sends each outbox message once, however often the
// relay delivers it (the inbox remembers the message ids it applied).
func (d *demo) sendEmail(ctx context.Context, m outbox.Message) error {
	var e email
	if err := json.Unmarshal(m.Payload, &e); err != nil {
		return err
	}
	return pgx.BeginFunc(ctx, d.pool, func(tx pgx.Tx) error {
		first, err := inbox.Claim(ctx, tx, "mail-provider", m.ID)
		if err != nil || !first {
			return err
		}
		_, err = tx.Exec(ctx, `INSERT INTO demo_emails (mode, campaign, customer, replica) VALUES ($1, $2, $3, $4)`,
			mailPgcoord, e.Campaign, e.Customer, e.Replica)
		return err
	})
}

// emailWorker is one replica. It says "ready", then waits for "fire <unix ms>": the moment
// its timer goes off, the same for every replica. Naive: then its own timer sends the
// report to every customer, and it says "sent <n> <campaign>". pgcoord: it runs the job
// with singleton.Schedule, whose first tick falls on that moment; the first attempt of a tick stops
// a third of the way through and says "stalled <campaign> <n>" (the demo kills it), a run
// that completes says "ran <campaign> <attempt>". It stops on "stop".
func emailWorker(ctx context.Context, w *workerproc.Worker) error {
	mode, name := w.Param("MODE"), w.Param("NAME")
	w.Say("ready")
	fire, err := w.Next() // fire <unix ms>: when its timer goes off, as every replica's
	if err != nil {
		return err
	}
	fireAt, err := strconv.ParseInt(strings.TrimPrefix(fire, "fire "), 10, 64)
	if err != nil {
		return fmt.Errorf("want fire <unix ms>, got %q: %w", fire, err)
	}
	if mode == mailNaive {
		time.Sleep(time.Until(time.UnixMilli(fireAt)))
		campaign := time.UnixMilli(fireAt).UTC().Format("2006-01-02")
		for c := 1; c <= emailCustomers; c++ {
			if _, err := w.Pool.Exec(ctx, `INSERT INTO demo_emails (mode, campaign, customer, replica) VALUES ($1, $2, $3, $4)`,
				mode, campaign, c, name); err != nil {
				return err
			}
			time.Sleep(emailPace)
		}
		w.Say("sent %d %s", emailCustomers, campaign)
		return w.Await("stop")
	}

	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		_ = w.Await("stop")
		cancel()
	}()
	job := singleton.Job{Name: "weekly-report", Every: emailEvery, TTL: emailTTL, Origin: time.UnixMilli(fireAt)}
	err = singleton.Schedule(sctx, w.Pool, job, func(ctx context.Context, run singleton.Run) error {
		campaign := run.ScheduledFor.UTC().Format(time.RFC3339)
		stallAfter := emailCustomers + 1
		if run.Attempt == 1 {
			stallAfter = emailCustomers / 3
		}
		sent := 0
		for c := 1; c <= emailCustomers; c++ {
			if sent == stallAfter {
				w.Say("stalled %s %d", campaign, sent)
				<-ctx.Done() // the demo kills this process
				return ctx.Err()
			}
			// The email goes to the outbox in the transaction of its dedupe claim: a
			// customer already served by an earlier attempt is skipped, and an email is
			// sent only if its claim committed.
			err := pgx.BeginFunc(ctx, w.Pool, func(tx pgx.Tx) error {
				first, err := dedupe.Claim(ctx, tx, "weekly-report:"+campaign, strconv.Itoa(c), nil)
				if err != nil || !first {
					return err
				}
				sent++
				payload, err := json.Marshal(email{Campaign: campaign, Customer: c, Replica: name})
				if err != nil {
					return err
				}
				_, err = outbox.Enqueue(ctx, tx, outbox.Message{Topic: emailTopic, Key: strconv.Itoa(c), Payload: payload, JSON: true})
				return err
			})
			if err != nil {
				return err
			}
			time.Sleep(emailPace)
		}
		w.Say("ran %s %d", campaign, run.Attempt)
		return nil
	}, &singleton.ScheduleOpts{Holder: name})
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

func (r EmailResult) print(out io.Writer) {
	fmt.Fprintf(out, `
2. Three weekly emails: the app runs in %d replicas; the report goes to %d customers.
   With pgcoord, %s was killed (SIGKILL) after %d emails; %s took the tick over (attempt %d).

                              cron in every replica    singleton + dedupe + outbox
   emails per customer        %-24s %s
`, emailReplicas, emailCustomers, r.Killed, r.SentBeforeKill, r.TookOver, r.TakeoverAttempt,
		perCustomer(r.FewestPerCustomer[mailNaive], r.MostPerCustomer[mailNaive]),
		perCustomer(r.FewestPerCustomer[mailPgcoord], r.MostPerCustomer[mailPgcoord]))
}

func perCustomer(fewest, most int) string {
	if fewest == most {
		return strconv.Itoa(most)
	}
	return fmt.Sprintf("%d to %d", fewest, most)
}
