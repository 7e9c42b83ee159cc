package cli

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/pgcoord/pgcoord/internal/httpsec"
	"github.com/pgcoord/pgcoord/internal/ui"
	"github.com/pgcoord/pgcoord/metrics"
	"github.com/pgcoord/pgcoord/pgcoord"
)

// EnvMetricsToken is the variable read when `pgcoord metrics --auth-token` is not given.
const EnvMetricsToken = "PGCOORD_METRICS_TOKEN"

func (a *app) metricsCommand() *cobra.Command {
	var (
		listen, token, tokenFile string
		maxStaleness             time.Duration
		maxRows                  int
	)
	cmd := &cobra.Command{
		Use:   "metrics",
		Short: "Serve pgcoord's Prometheus metrics (leases, semaphores, jobs, outbox, idempotency) at /metrics",
		Long: `Serve pgcoord's state as Prometheus metrics at /metrics, read from the database at every
scrape with one bounded query per primitive (at most --max-rows rows each;
pgcoord_rows_truncated says when there were more). 'pgcoord ui' serves the same at its
/metrics. docs/ui.md lists every metric with its labels and meaning.

It listens on loopback by default. Any other --listen address needs a token
(--auth-token-file or --auth-token, else $` + EnvMetricsToken + `), which every scrape must
send as "Authorization: Bearer <token>" (Prometheus: authorization.credentials_file).
--auth-token works but warns: a flag shows in ps. A weak token (one character or string
repeated, or under 128 bits) is refused: make one with 'openssl rand -hex 32'. Without a
token it answers only requests addressed to localhost, 127.0.0.1 or [::1] at its port (421
otherwise), so a web page cannot read it through a rebound DNS name. It runs until
interrupted.`,
		Example: `  pgcoord metrics
  openssl rand -hex 32 > metrics-token && chmod 600 metrics-token
  pgcoord metrics --listen 0.0.0.0:9190 --auth-token-file metrics-token`,
		Args: exactArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			token, err := a.authToken(token, tokenFile, EnvMetricsToken) // the flag's variable, resolved
			if err != nil {
				return err
			}
			if err := checkListen(listen, token, EnvMetricsToken); err != nil {
				// The listen rule is the dashboard's (package ui): name this command instead.
				return usageError{errors.New("metrics: " + strings.TrimPrefix(err.Error(), "ui: "))}
			}
			if _, err := check.ListLimit(maxRows); err != nil || maxRows < 1 {
				return usagef("--max-rows %d: want 1 to %d", maxRows, pgcoord.MaxListLimit)
			}
			if maxStaleness < 0 {
				return usagef("--max-staleness %s: want 0 or more", maxStaleness)
			}
			pool, err := a.connect(ctx)
			if err != nil {
				return err
			}
			defer pool.Close()
			coll, err := metrics.New(pool, &metrics.Opts{MaxRows: maxRows, MaxStaleness: maxStaleness, Logger: a.logger()})
			if err != nil {
				return argError(err)
			}
			a.warnPendingMigrations(ctx, pool)
			mux := http.NewServeMux()
			mux.Handle("GET /metrics", metrics.Handler(coll))
			mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, _ *http.Request) {
				fmt.Fprintln(w, "pgcoord metrics: see /metrics")
			})
			auth := "no token (loopback only)"
			if token != "" {
				auth = "token required"
			}
			// The dashboard's Host rule: without a token, only loopback names (DNS rebinding).
			h := httpsec.GuardHost(listen, token != "", ui.RequireToken(token, mux))
			return a.serve(ctx, listen, h, "metrics", "scrape /metrics; "+auth)
		},
	}
	f := cmd.Flags()
	f.StringVar(&listen, "listen", "127.0.0.1:9190", "address to listen on (host:port); beyond loopback needs a token")
	f.StringVar(&token, "auth-token", "", "token every scrape must carry (shows in ps: prefer --auth-token-file or $"+EnvMetricsToken+")")
	f.StringVar(&tokenFile, "auth-token-file", "", "file whose first line is the token (default $"+EnvMetricsToken+")")
	f.DurationVar(&maxStaleness, "max-staleness", defaultMaxStaleness, "how long past its period a job may go without success before it is overdue")
	f.IntVar(&maxRows, "max-rows", metrics.DefaultMaxRows, "rows read per primitive per scrape")
	return cmd
}
