package cli

import (
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/pgcoord/pgcoord/internal/base"
	"github.com/pgcoord/pgcoord/outbox"
	"github.com/pgcoord/pgcoord/outbox/sink"
)

// outboxSink builds the handler a --sink value names: webhook=URL or stdout.
func (a *app) outboxSink(spec string, timeout time.Duration) (outbox.Handler, error) {
	switch {
	case spec == "stdout":
		return sink.JSONLines(a.out), nil
	case strings.HasPrefix(spec, "webhook="):
		u := strings.TrimPrefix(spec, "webhook=")
		if base.AmbiguousURL(u) {
			return nil, usagef("--sink %s: the URL has an '@' after its host: percent-encode '/', '?', '#' "+
				"in its user or password as %%2F, %%3F, %%23 (else part of the password is taken for the host and path)", sinkName(spec))
		}
		h, err := sink.Webhook(u, &sink.WebhookOpts{Timeout: timeout})
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
			fmt.Fprintf(a.errOut, "pgcoord: outbox relay %s (partition group %s) delivering to %s\n",
				relay.Claimant(), outbox.GroupName(topics), sinkName(sinkSpec))
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

// sinkName names a sink in messages without the webhook URL's credentials or query values
// (base.RedactURL).
func sinkName(spec string) string {
	if u, ok := strings.CutPrefix(spec, "webhook="); ok {
		return "webhook " + base.RedactURL(u)
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
	if !isTerminal(a.errOut) {
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
