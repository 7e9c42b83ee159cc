package cli

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/pgcoord/pgcoord/internal/base"
	"github.com/pgcoord/pgcoord/outbox"
	"github.com/pgcoord/pgcoord/pgcoord"
)

func (a *app) outboxCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "outbox",
		Short: "Operate the transactional outbox: stats, list, show, retry, relay, gc",
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
		a.outboxRelayCommand(), a.outboxGCCommand())
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
	var (
		topic string
		lf    listFlags
	)
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
			if err := lf.checkPrefix(); err != nil {
				return err
			}
			pool, err := a.connect(ctx)
			if err != nil {
				return err
			}
			defer pool.Close()
			return a.show(ctx, cmd, &lf, func() error {
				return a.printOutboxStats(ctx, pool, outbox.StatsOpts{Topic: topic, TopicPrefix: lf.prefix})
			})
		},
	}
	cmd.Flags().StringVar(&topic, "topic", "", "show only this topic")
	addListFlags(cmd, &lf, "only topics that start with this")
	return cmd
}

// printOutboxStats reads the stats of the topics opts selects and prints them.
func (a *app) printOutboxStats(ctx context.Context, pool *pgxpool.Pool, opts outbox.StatsOpts) error {
	stats, err := outbox.Stats(ctx, pool, &opts)
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
		lf           listFlags
	)
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List messages in id order (--dead: the dead ones)",
		Long: `List outbox messages in id order: id, topic, key, state, failed attempts, payload size,
when written, when next due, and the last error. --dead lists the dead messages (those to
retry or delete); --state pending|delivered|dead and --topic filter; --after ID and --limit
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
			if err := lf.checkPrefix(); err != nil {
				return err
			}
			pool, err := a.connect(ctx)
			if err != nil {
				return err
			}
			defer pool.Close()
			return a.show(ctx, cmd, &lf, func() error {
				return a.printOutboxMessages(ctx, pool, outbox.ListOpts{State: outbox.State(state), Topic: topic, TopicPrefix: lf.prefix,
					After: after, Limit: limit, PayloadBytes: payloadBytes})
			})
		},
	}
	f := cmd.Flags()
	f.BoolVar(&dead, "dead", false, "list only dead messages")
	f.StringVar(&state, "state", "", "list only messages in this state: pending, delivered or dead")
	f.StringVar(&topic, "topic", "", "list only this topic")
	f.Int64Var(&after, "after", 0, "list messages with ids above this one (paging)")
	f.IntVar(&limit, "limit", pgcoord.DefaultListLimit, fmt.Sprintf("most messages to list (1 to %d)", pgcoord.MaxListLimit))
	f.IntVar(&payloadBytes, "payload-bytes", 0, fmt.Sprintf("with --json: include the first N bytes of each payload (0 to %d)", outbox.MaxPayload))
	addListFlags(cmd, &lf, "only messages whose topic starts with this")
	return cmd
}

// printOutboxMessages reads the page of messages opts selects and prints it.
func (a *app) printOutboxMessages(ctx context.Context, pool *pgxpool.Pool, opts outbox.ListOpts) error {
	msgs, err := outbox.List(ctx, pool, &opts)
	if err != nil {
		return argError(err)
	}
	if a.json {
		js := make([]outboxMessageJSON, 0, len(msgs))
		for _, m := range msgs {
			js = append(js, toOutboxMessageJSON(m, opts.PayloadBytes > 0))
		}
		return a.printJSON(js)
	}
	tw := a.table()
	fmt.Fprintln(tw, "ID\tTOPIC\tKEY\tSTATE\tATTEMPTS\tSIZE\tCREATED\tAVAILABLE\tLAST ERROR")
	for _, m := range msgs {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%d\t%d\t%s\t%s\t%s\n", m.ID, m.Topic, m.Key, m.State, m.Attempts, m.PayloadSize,
			rfc3339(m.CreatedAt), rfc3339(m.AvailableAt), dash(oneLine(m.LastError, 60)))
	}
	return tw.Flush()
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
			fmt.Fprintf(tw, "last error:\t%s\n", dash(oneLine(m.LastError, 200)))
			fmt.Fprintf(tw, "created:\t%s\n", preciseTime(m.CreatedAt))
			fmt.Fprintf(tw, "available:\t%s\n", preciseTime(m.AvailableAt))
			fmt.Fprintf(tw, "delivered:\t%s\n", preciseTime(m.DeliveredAt))
			fmt.Fprintf(tw, "dead:\t%s\n", preciseTime(m.DeadAt))
			fmt.Fprintf(tw, "claimed by:\t%s\n", dash(m.ClaimedBy))
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
			_, err = fmt.Fprintf(a.out, "\n%s\n", base.PrintableLines(string(body)))
			return err
		},
	}
}
