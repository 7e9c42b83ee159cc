package cli

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/spf13/cobra"

	"github.com/pgcoord/pgcoord/outbox"
	"github.com/pgcoord/pgcoord/outbox/sink"
	"github.com/pgcoord/pgcoord/pgcoord"
)

func (a *app) outboxCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "outbox",
		Short: "Operate the transactional outbox: stats, list, show, retry, relay, prune",
		Long: `Operate pgcoord's transactional outbox (package outbox): messages written in the same
transaction as the business change, delivered at least once by relays, in commit order per
(topic, key). A message is pending until a relay delivers it, or dead after failing its
maximum number of attempts. 'outbox relay' is a relay that needs no Go code: it delivers to
a webhook or to standard output. Every subcommand calls the same public API a Go program
calls.`,
		Args: noSubcommand,
		RunE: func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	cmd.AddCommand(a.outboxStatsCommand(), a.outboxListCommand(), a.outboxShowCommand(), a.outboxRetryCommand(),
		a.outboxRelayCommand(), a.outboxPruneCommand())
	return cmd
}

// outboxStatsJSON is one topic in `outbox stats --json`.
type outboxStatsJSON struct {
	Topic            string  `json:"topic"`
	Pending          int64   `json:"pending"`
	Due              int64   `json:"due"`
	InFlight         int64   `json:"in_flight"`
	Dead             int64   `json:"dead"`
	OldestPendingAt  *string `json:"oldest_pending_at"`
	OldestPendingAge *int64  `json:"oldest_pending_age_ms"`
	MaxAttempts      int     `json:"max_attempts"`
	DBNow            *string `json:"db_now"`
}

func (a *app) outboxStatsCommand() *cobra.Command {
	var topic string
	cmd := &cobra.Command{
		Use:   "stats",
		Short: "Per topic: pending, due, in flight, dead, oldest pending age, max attempts",
		Long: `Show, per topic with pending or dead messages, judged by the database clock:

  PENDING         messages not yet delivered (due, delayed, in backoff or in flight)
  DUE             pending messages ready to claim now (a key's later messages wait for
                  its head, so not all of them can be claimed at once)
  IN FLIGHT       messages under a live relay claim
  DEAD            messages that failed their maximum number of attempts
  OLDEST PENDING  how long the oldest pending message has waited ("-": none)
  MAX ATTEMPTS    the most failed attempts of a pending message (a stuck key shows here)

With --json: an array ([] when empty) of objects with the keys topic, pending, due,
in_flight, dead, oldest_pending_at, oldest_pending_age_ms, max_attempts, db_now.`,
		Example: `  pgcoord outbox stats
  pgcoord outbox stats --json | jq '.[] | select(.dead > 0)'`,
		Args: exactArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			pool, err := a.connect(ctx)
			if err != nil {
				return err
			}
			defer pool.Close()
			stats, err := outbox.Stats(ctx, pool, &outbox.StatsOpts{Topic: topic})
			if err != nil {
				return argError(err)
			}
			if a.json {
				js := make([]outboxStatsJSON, 0, len(stats))
				for _, s := range stats {
					var age *int64
					if !s.OldestPending.IsZero() {
						ms := s.OldestPendingAge().Milliseconds()
						age = &ms
					}
					js = append(js, outboxStatsJSON{
						Topic: s.Topic, Pending: s.Pending, Due: s.Due, InFlight: s.InFlight, Dead: s.Dead,
						OldestPendingAt: jsonTime(s.OldestPending), OldestPendingAge: age,
						MaxAttempts: s.MaxAttempts, DBNow: jsonTime(s.DBNow),
					})
				}
				return a.printJSON(js)
			}
			tw := a.table()
			fmt.Fprintln(tw, "TOPIC\tPENDING\tDUE\tIN FLIGHT\tDEAD\tOLDEST PENDING\tMAX ATTEMPTS")
			for _, s := range stats {
				oldest := "-"
				if !s.OldestPending.IsZero() {
					oldest = age(s.OldestPending, s.DBNow)
				}
				fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%s\t%d\n", s.Topic, s.Pending, s.Due, s.InFlight, s.Dead, oldest, s.MaxAttempts)
			}
			return tw.Flush()
		},
	}
	cmd.Flags().StringVar(&topic, "topic", "", "show only this topic")
	return cmd
}

// outboxMessageJSON is one message in `outbox list --json` and `outbox show --json`. A
// whole JSON payload is inline in payload; any other payload, or the part of one that was
// read, in payload_base64; payload_size is its length either way.
type outboxMessageJSON struct {
	ID            int64             `json:"id"`
	Topic         string            `json:"topic"`
	Key           string            `json:"key"`
	State         string            `json:"state"`
	Attempts      int               `json:"attempts"`
	LastError     *string           `json:"last_error"`
	PayloadSize   int               `json:"payload_size"`
	Payload       json.RawMessage   `json:"payload"`
	PayloadBase64 *string           `json:"payload_base64"`
	Headers       map[string]string `json:"headers"`
	CreatedAt     *string           `json:"created_at"`
	AvailableAt   *string           `json:"available_at"`
	DeliveredAt   *string           `json:"delivered_at"`
	DeadAt        *string           `json:"dead_at"`
	ClaimedBy     *string           `json:"claimed_by"`
	ClaimExpires  *string           `json:"claim_expires_at"`
}

// toOutboxMessageJSON converts m; withPayload includes what was read of its payload.
func toOutboxMessageJSON(m outbox.Message, withPayload bool) outboxMessageJSON {
	j := outboxMessageJSON{
		ID: m.ID, Topic: m.Topic, Key: m.Key, State: string(m.State), Attempts: m.Attempts, PayloadSize: m.PayloadSize,
		Headers: m.Headers, CreatedAt: jsonTime(m.CreatedAt), AvailableAt: jsonTime(m.AvailableAt),
		DeliveredAt: jsonTime(m.DeliveredAt), DeadAt: jsonTime(m.DeadAt), ClaimExpires: jsonTime(m.ClaimExpiresAt),
		Payload: json.RawMessage("null"),
	}
	if j.Headers == nil {
		j.Headers = map[string]string{}
	}
	if m.LastError != "" {
		j.LastError = &m.LastError
	}
	if m.ClaimedBy != "" {
		j.ClaimedBy = &m.ClaimedBy
	}
	switch {
	case !withPayload:
	case m.JSON && len(m.Payload) == m.PayloadSize && json.Valid(m.Payload):
		j.Payload = m.Payload
	default:
		s := base64.StdEncoding.EncodeToString(m.Payload)
		j.PayloadBase64 = &s
	}
	return j
}

func (a *app) outboxListCommand() *cobra.Command {
	var (
		dead         bool
		state        string
		topic        string
		after        int64
		limit        int
		payloadBytes int
	)
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List messages in id order (--dead: the dead ones)",
		Long: `List outbox messages in id order: id, topic, key, state, failed attempts, payload size,
when written, when next due, and the last error. --dead lists the dead messages (those to
retry or prune); --state pending|delivered|dead and --topic filter; --after ID and --limit
page. Payloads are not read unless --payload-bytes asks for (the start of) each one, for
--json; 'outbox show ID' shows one whole message.

With --json: an array ([] when empty) of objects with the keys id, topic, key, state,
attempts, last_error, payload_size (bytes), payload (with --payload-bytes covering the
whole payload of a JSON message: the payload as is, else null), payload_base64 (with
--payload-bytes, any other payload or the first --payload-bytes bytes of a longer one,
else null), headers, created_at, available_at, delivered_at, dead_at, claimed_by,
claim_expires_at.`,
		Example: `  pgcoord outbox list --dead
  pgcoord outbox list --topic orders --state pending --limit 20 --json
  pgcoord outbox list --dead --json --payload-bytes 256`,
		Args: exactArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			if dead {
				if state != "" && state != string(outbox.Dead) {
					return usagef("--dead and --state %s contradict each other", state)
				}
				state = string(outbox.Dead)
			}
			if payloadBytes < 0 || payloadBytes > outbox.MaxPayload {
				return usagef("--payload-bytes %d: want 0 to %d", payloadBytes, outbox.MaxPayload)
			}
			if payloadBytes > 0 && !a.json {
				return usagef("--payload-bytes needs --json (the table shows no payloads)")
			}
			pool, err := a.connect(ctx)
			if err != nil {
				return err
			}
			defer pool.Close()
			msgs, err := outbox.List(ctx, pool, &outbox.ListOpts{State: outbox.State(state), Topic: topic, After: after, Limit: limit,
				PayloadBytes: payloadBytes})
			if err != nil {
				return argError(err)
			}
			if a.json {
				js := make([]outboxMessageJSON, 0, len(msgs))
				for _, m := range msgs {
					js = append(js, toOutboxMessageJSON(m, payloadBytes > 0))
				}
				return a.printJSON(js)
			}
			tw := a.table()
			fmt.Fprintln(tw, "ID\tTOPIC\tKEY\tSTATE\tATTEMPTS\tSIZE\tCREATED\tAVAILABLE\tLAST ERROR")
			for _, m := range msgs {
				fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%d\t%d\t%s\t%s\t%s\n", m.ID, m.Topic, m.Key, m.State, m.Attempts, m.PayloadSize,
					rfc3339(m.CreatedAt), rfc3339(m.AvailableAt), orDash(oneLine(m.LastError, 60)))
			}
			return tw.Flush()
		},
	}
	f := cmd.Flags()
	f.BoolVar(&dead, "dead", false, "list only dead messages")
	f.StringVar(&state, "state", "", "list only messages in this state: pending, delivered or dead")
	f.StringVar(&topic, "topic", "", "list only this topic")
	f.Int64Var(&after, "after", 0, "list messages with ids above this one (paging)")
	f.IntVar(&limit, "limit", pgcoord.DefaultListLimit, fmt.Sprintf("most messages to list (1 to %d)", pgcoord.MaxListLimit))
	f.IntVar(&payloadBytes, "payload-bytes", 0, fmt.Sprintf("with --json: include the first N bytes of each payload (0 to %d)", outbox.MaxPayload))
	return cmd
}

// outboxShowText is how much of a text payload `outbox show` prints.
const outboxShowText = 2000

func (a *app) outboxShowCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "show ID",
		Short: "Show one message, payload included (exit 1 if no such message)",
		Long: `Show outbox message ID: topic, key, state, attempts, last error, claim, times, headers, and
its payload (printed when it is text, at most 2000 bytes). A message that does not exist
is an error (exit 1).

With --json: the object of 'outbox list --json' with the whole payload (at most 1 MiB):
in payload for a JSON message, else in payload_base64.`,
		Example: `  pgcoord outbox show 4711
  pgcoord outbox show 4711 --json | jq -r .payload_base64 | base64 -d`,
		Args: exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			id, err := strconv.ParseInt(args[0], 10, 64)
			if err != nil || id < 1 {
				return usagef("message ID %q: want a positive integer", args[0])
			}
			pool, err := a.connect(ctx)
			if err != nil {
				return err
			}
			defer pool.Close()
			m, err := outbox.Get(ctx, pool, id)
			if err != nil {
				return err
			}
			if a.json {
				return a.printJSON(toOutboxMessageJSON(m, true))
			}
			tw := a.table()
			fmt.Fprintf(tw, "id:\t%d\n", m.ID)
			fmt.Fprintf(tw, "topic:\t%s\n", m.Topic)
			fmt.Fprintf(tw, "key:\t%s\n", m.Key)
			fmt.Fprintf(tw, "state:\t%s\n", m.State)
			fmt.Fprintf(tw, "attempts:\t%d\n", m.Attempts)
			fmt.Fprintf(tw, "last error:\t%s\n", orDash(oneLine(m.LastError, 200)))
			fmt.Fprintf(tw, "created:\t%s\n", preciseTime(m.CreatedAt))
			fmt.Fprintf(tw, "available:\t%s\n", preciseTime(m.AvailableAt))
			fmt.Fprintf(tw, "delivered:\t%s\n", preciseTime(m.DeliveredAt))
			fmt.Fprintf(tw, "dead:\t%s\n", preciseTime(m.DeadAt))
			fmt.Fprintf(tw, "claimed by:\t%s\n", orDash(m.ClaimedBy))
			fmt.Fprintf(tw, "claim expires:\t%s\n", preciseTime(m.ClaimExpiresAt))
			names := slices.Sorted(maps.Keys(m.Headers))
			for _, name := range names {
				fmt.Fprintf(tw, "header:\t%s: %s\n", name, oneLine(m.Headers[name], 200))
			}
			kind := "bytes"
			if m.JSON {
				kind = "bytes of JSON"
			}
			fmt.Fprintf(tw, "payload:\t%d %s\n", m.PayloadSize, kind)
			if err := tw.Flush(); err != nil {
				return err
			}
			body := m.Payload
			switch {
			case len(body) == 0:
				return nil
			case !utf8.Valid(body):
				_, err = fmt.Fprintln(a.out, "(binary payload; --json gives it in base64)")
				return err
			case len(body) > outboxShowText:
				body = append(body[:outboxShowText:outboxShowText], "..."...)
			}
			_, err = fmt.Fprintf(a.out, "\n%s\n", body)
			return err
		},
	}
}

// orDash is s, or "-" when it is empty.
func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// outboxRetryJSON is the --json output of `outbox retry`.
type outboxRetryJSON struct {
	Retried int64 `json:"retried"`
	DryRun  bool  `json:"dry_run"`
}

func (a *app) outboxRetryCommand() *cobra.Command {
	var (
		allDead bool
		topic   string
		dryRun  bool
	)
	cmd := &cobra.Command{
		Use:   "retry ID | --all-dead",
		Short: "Make a message (or every dead one) deliverable now",
		Long: `Make message ID deliverable now: a dead message becomes pending again with a fresh count of
attempts, and a pending one waiting out a backoff or delay becomes due. With --all-dead
every dead message (of --topic, if given) is made pending again. A retried dead message is
again the oldest pending message of its key: it is delivered before the key's messages
still pending.

--dry-run changes nothing and says what would be retried. Exit code 1 if no pending or dead
message has that id. With --json: {"retried": N, "dry_run": false}.`,
		Example: `  pgcoord outbox retry 4711
  pgcoord outbox retry --all-dead --topic orders --dry-run`,
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			var id int64
			switch {
			case allDead && len(args) > 0:
				return usagef("give a message ID or --all-dead, not both")
			case allDead:
			case len(args) != 1:
				return usagef("%s takes a message ID (or --all-dead)", cmd.CommandPath())
			default:
				var err error
				if id, err = strconv.ParseInt(args[0], 10, 64); err != nil || id < 1 {
					return usagef("message ID %q: want a positive integer", args[0])
				}
				if topic != "" {
					return usagef("--topic applies to --all-dead only")
				}
			}
			pool, err := a.connect(ctx)
			if err != nil {
				return err
			}
			defer pool.Close()
			var n int64
			switch {
			case allDead:
				if n, err = outbox.RetryDead(ctx, pool, &outbox.RetryDeadOpts{Topic: topic, DryRun: dryRun}); err != nil {
					return argError(err)
				}
			case dryRun:
				m, err := outbox.Get(ctx, pool, id)
				if err != nil {
					return err
				}
				if m.State == outbox.Delivered {
					return fmt.Errorf("%w: message %d was delivered", outbox.ErrNotFound, id)
				}
				n = 1
			default:
				if err := outbox.Retry(ctx, pool, id); err != nil {
					return err
				}
				n = 1
			}
			if a.json {
				return a.printJSON(outboxRetryJSON{Retried: n, DryRun: dryRun})
			}
			what := fmt.Sprintf("message %d", id)
			if allDead {
				what = fmt.Sprintf("%d dead messages", n)
			}
			if dryRun {
				_, err = fmt.Fprintf(a.out, "%s would be retried (--dry-run: nothing changed)\n", what)
			} else {
				_, err = fmt.Fprintf(a.out, "retried %s\n", what)
			}
			return err
		},
	}
	f := cmd.Flags()
	f.BoolVar(&allDead, "all-dead", false, "retry every dead message")
	f.StringVar(&topic, "topic", "", "with --all-dead: only this topic's dead messages")
	f.BoolVar(&dryRun, "dry-run", false, "change nothing; say what would be retried")
	return cmd
}

// outboxSink builds the handler a --sink value names: webhook=URL or stdout.
func (a *app) outboxSink(spec string, timeout time.Duration) (outbox.Handler, error) {
	switch {
	case spec == "stdout":
		return sink.JSONLines(a.out), nil
	case strings.HasPrefix(spec, "webhook="):
		h, err := sink.Webhook(strings.TrimPrefix(spec, "webhook="), &sink.WebhookOpts{Timeout: timeout})
		if err != nil {
			return nil, usageError{err}
		}
		return h, nil
	}
	return nil, usagef("--sink %q: want webhook=URL or stdout", spec)
}

func (a *app) outboxRelayCommand() *cobra.Command {
	var (
		sinkSpec    string
		topics      []string
		cfg         outbox.Config
		httpTimeout time.Duration
	)
	cmd := &cobra.Command{
		Use:   "relay --sink webhook=URL|stdout",
		Short: "Deliver outbox messages to a webhook or standard output until interrupted",
		Long: `Run an outbox relay, as a sidecar needing no Go code, until SIGINT or SIGTERM: it claims
batches of messages, delivers them, and records the outcomes; several relays (this command
or Go programs) share the work. Each key's messages are delivered in commit order; a
failing message is retried with exponential backoff and holds back its key only, and goes
dead after --max-attempts. Delivery is at least once: deduplicate downstream on the
message id.

Sinks:
  webhook=URL  POST each payload to URL (Content-Type application/json for JSON messages),
               with the message id in an Idempotency-Key header and the topic, key and
               attempt in Pgcoord-Topic, Pgcoord-Key, Pgcoord-Attempt; a 2xx answer means
               delivered, anything else or no answer within --http-timeout a failure.
  stdout       one JSON line per message on standard output: id, topic, key, payload (JSON
               payloads inline) or payload_base64, headers, attempt, created_at.

On a terminal, progress goes to stderr every second; when the relay stops, the final
counts go to stderr. The batch in hand when interrupted stops at the next message: outcomes
so far are recorded, and the rest is released for other relays. Behind a transaction-mode
pooler (PgBouncer) set --no-listen: the relay then polls.`,
		Example: `  pgcoord outbox relay --sink webhook=https://hooks.example.com/orders --topic orders
  pgcoord outbox relay --sink stdout | jq -c .payload`,
		Args: exactArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			if sinkSpec == "" {
				return usagef("--sink is required: webhook=URL or stdout")
			}
			h, err := a.outboxSink(sinkSpec, httpTimeout)
			if err != nil {
				return err
			}
			cfg.Handler, cfg.Topics = h, topics
			// The relay needs two connections (the pool's shared LISTEN connection, and
			// one to claim and record outcomes); the sinks use none.
			pool, err := a.connect(ctx)
			if err != nil {
				return err
			}
			defer pool.Close()
			relay, err := outbox.NewRelay(pool, &cfg)
			if err != nil {
				return argError(err)
			}
			fmt.Fprintf(a.errOut, "pgcoord: outbox relay %s delivering to %s\n", relay.Claimant(), sinkName(sinkSpec))
			stop := a.outboxProgress(relay)
			err = relay.Run(ctx)
			stop()
			s := relay.Stats()
			fmt.Fprintf(a.errOut, "pgcoord: relay stopped: %s\n", relayCounts(s))
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&sinkSpec, "sink", "", "where to deliver: webhook=URL or stdout (required)")
	f.StringSliceVar(&topics, "topic", nil, "deliver only these topics (repeat or comma-separate; default: all)")
	f.IntVar(&cfg.BatchSize, "batch", outbox.DefaultBatchSize, fmt.Sprintf("most messages per claim (1 to %d)", outbox.MaxBatchSize))
	f.IntVar(&cfg.KeyBatchSize, "key-batch", outbox.DefaultKeyBatchSize, "most messages of one key per claim")
	f.IntVar(&cfg.BatchBytes, "batch-bytes", outbox.DefaultBatchBytes,
		fmt.Sprintf("most payload bytes per claim (1 to %d; one larger message is claimed alone)", outbox.MaxBatchBytes))
	f.IntVar(&cfg.Concurrency, "concurrency", 8, "keys delivered at once")
	f.DurationVar(&cfg.ClaimTTL, "claim-ttl", outbox.DefaultClaimTTL, "how long a claim holds its batch")
	f.IntVar(&cfg.MaxAttempts, "max-attempts", outbox.DefaultMaxAttempts, "failed attempts that make a message dead")
	f.DurationVar(&cfg.Backoff, "backoff", outbox.DefaultBackoff, "wait before the first retry (doubles per failure)")
	f.DurationVar(&cfg.MaxBackoff, "max-backoff", outbox.DefaultMaxBackoff, "longest wait between retries")
	f.DurationVar(&cfg.PollInterval, "poll-interval", outbox.DefaultPollInterval, "claim at least this often when idle")
	f.BoolVar(&cfg.NoListen, "no-listen", false, "poll only, without LISTEN (behind PgBouncer in transaction mode)")
	f.DurationVar(&httpTimeout, "http-timeout", sink.DefaultWebhookTimeout, "webhook: timeout of each request")
	return cmd
}

// sinkName names a sink in messages without the webhook URL's credentials or query.
func sinkName(spec string) string {
	if u, ok := strings.CutPrefix(spec, "webhook="); ok {
		if i := strings.IndexAny(u, "?#"); i >= 0 {
			u = u[:i]
		}
		if at := strings.LastIndex(u, "@"); at >= 0 {
			if scheme := strings.Index(u, "://"); scheme >= 0 && scheme < at {
				u = u[:scheme+3] + u[at+1:]
			}
		}
		return "webhook " + u
	}
	return spec
}

func relayCounts(s outbox.RelayStats) string {
	return fmt.Sprintf("delivered %d, failed %d, dead %d, released %d, refused %d (claims taken over)",
		s.Delivered, s.Failed, s.Dead, s.Released, s.Fenced)
}

// outboxProgress prints the relay's counts to stderr every second while stderr is a
// terminal, and returns the function that stops it.
func (a *app) outboxProgress(r *outbox.Relay) (stop func()) {
	if !benchTTY(a.errOut) {
		return func() {}
	}
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-done:
				fmt.Fprintln(a.errOut)
				return
			case <-t.C:
				fmt.Fprintf(a.errOut, "\rpgcoord: %s", relayCounts(r.Stats()))
			}
		}
	}()
	return func() { close(done); <-finished }
}

// outboxPruneJSON is the --json output of `outbox prune`.
type outboxPruneJSON struct {
	Deleted     int64  `json:"deleted"`
	WouldDelete *int64 `json:"would_delete"`
	DryRun      bool   `json:"dry_run"`
}

func (a *app) outboxPruneCommand() *cobra.Command {
	var (
		opts   outbox.PruneOpts
		dryRun bool
	)
	cmd := &cobra.Command{
		Use:   "prune",
		Short: "Delete delivered messages older than the retention, in batches",
		Long: `Delete the messages delivered longer ago than --older-than (by the database clock), and with
--dead the dead ones declared dead that long ago, in batches of --batch rows, each its own
short transaction, oldest first. Pending messages are never deleted. Keep the retention
shorter than consumers' inbox retention (see docs/outbox.md).

--dry-run counts what would be deleted and deletes nothing. On a terminal, progress goes to
stderr. With --json: {"deleted": N, "would_delete": null, "dry_run": false}, or with
--dry-run {"deleted": 0, "would_delete": N, "dry_run": true}.`,
		Example: `  pgcoord outbox prune
  pgcoord outbox prune --older-than 72h --dead --dry-run`,
		Args: exactArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			if opts.OlderThan <= 0 {
				return usagef("--older-than %v: want a positive duration", opts.OlderThan)
			}
			if opts.Batch < 1 || opts.Batch > outbox.MaxPruneBatch {
				return usagef("--batch %d: want 1 to %d", opts.Batch, outbox.MaxPruneBatch)
			}
			pool, err := a.connect(ctx)
			if err != nil {
				return err
			}
			defer pool.Close()
			opts.DryRun = dryRun
			if benchTTY(a.errOut) && !dryRun {
				opts.Progress = func(deleted int64) {
					fmt.Fprintf(a.errOut, "\rpgcoord: deleted %d messages...", deleted)
				}
			}
			n, err := outbox.Prune(ctx, pool, &opts)
			if opts.Progress != nil && n > 0 {
				fmt.Fprintln(a.errOut)
			}
			if err != nil {
				if n > 0 {
					fmt.Fprintf(a.errOut, "pgcoord: deleted %d messages before the error\n", n)
				}
				return argError(err)
			}
			if a.json {
				out := outboxPruneJSON{Deleted: n, DryRun: dryRun}
				if dryRun {
					out.Deleted, out.WouldDelete = 0, &n
				}
				return a.printJSON(out)
			}
			if dryRun {
				_, err = fmt.Fprintf(a.out, "%d outbox messages would be deleted (--dry-run: nothing changed)\n", n)
				return err
			}
			_, err = fmt.Fprintf(a.out, "deleted %d outbox messages\n", n)
			return err
		},
	}
	f := cmd.Flags()
	f.DurationVar(&opts.OlderThan, "older-than", outbox.DefaultRetention, "retention: delete what finished longer ago than this")
	f.BoolVar(&opts.Dead, "dead", false, "also delete dead messages past the retention")
	f.IntVar(&opts.Batch, "batch", outbox.DefaultPruneBatch, fmt.Sprintf("messages deleted per statement (1 to %d)", outbox.MaxPruneBatch))
	f.BoolVar(&dryRun, "dry-run", false, "count what would be deleted, delete nothing")
	return cmd
}
