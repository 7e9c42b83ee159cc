package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/pgcoord/pgcoord/internal/httpsec"
	"github.com/pgcoord/pgcoord/internal/ui"
	"github.com/pgcoord/pgcoord/pgcoord"
)

// EnvUIToken is the variable read when `pgcoord ui --auth-token` is not given.
const EnvUIToken = "PGCOORD_UI_TOKEN"

func (a *app) uiCommand() *cobra.Command {
	var (
		listen, token, tokenFile               string
		allowActions, showPayloads, trustProxy bool
		refresh, maxStaleness                  time.Duration
	)
	cmd := &cobra.Command{
		Use:   "ui",
		Short: "Serve the operator dashboard (leases, jobs, semaphores, outbox, idempotency) and /metrics over HTTP",
		Long: `Serve a web dashboard from this binary: an overview with health findings and counts,
and pages for leases (holder, metadata, fence token, time left), jobs (last success and
failure, overdue flag, a strip of recent ticks), semaphores (permits against the limit,
waiters, admitted share against weight), the outbox (per topic pending, due, in flight,
dead and oldest pending age, deliveries per minute, dead messages) and idempotency keys
(in flight and stuck, completed count, a key's stored response). Pages refresh themselves
every --refresh while the browser tab is visible. /metrics serves the Prometheus metrics
of 'pgcoord metrics'.

It listens on loopback (127.0.0.1:8080) by default. Any other --listen address needs a
token (--auth-token-file or --auth-token, else $` + EnvUIToken + `): then every request
needs "Authorization: Bearer <token>", or a browser signs in once with the token (a
cookie). Without a token the dashboard refuses to start on a non-loopback address (exit
2), with --allow-actions or not. --auth-token works but warns: a flag shows in ps.

Without a token it answers only requests addressed to localhost, 127.0.0.1 or [::1] at
its port, so a web page cannot reach it through a rebound DNS name. A weak token (one
character or string repeated, or under 128 bits: fewer than 32 hex digits) is refused: make
one with 'openssl rand -hex 32'. A browser's sign-in lasts 12 hours, until it signs out, and records
the name the operator gives, for the audit log; sign-ins are limited to 5 failures per
client address, then one every 10 seconds (there is no limit shared by all
addresses: failures elsewhere never refuse the operator's token).

Operator actions — expire a lease, set a semaphore limit, retry a dead outbox message — are
off unless --allow-actions:
then each is a confirmed POST with a CSRF token from the dashboard's own origin, and is
recorded in the audit table in the same transaction ('pgcoord audit list'), naming the
signed-in operator (without a token, --actor). Payloads and stored response bodies are never
shown unless --show-payloads. Reachable only through a TLS reverse proxy, --trust-proxy
lets its X-Forwarded-Proto mark cookies Secure and the sign-in limiter count the client
address it appends to X-Forwarded-For.

It runs until interrupted (Ctrl-C, SIGTERM).`,
		Example: `  pgcoord ui
  pgcoord ui --allow-actions
  openssl rand -hex 32 > ui-token && chmod 600 ui-token
  pgcoord ui --listen 0.0.0.0:8080 --auth-token-file ui-token`,
		Args: exactArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			token, err := a.authToken(token, tokenFile, EnvUIToken) // the flag's variable, resolved
			if err != nil {
				return err
			}
			if err := checkListen(listen, token, EnvUIToken); err != nil {
				return err
			}
			if refresh < time.Second {
				return usagef("--refresh %s: want at least 1s", refresh)
			}
			if maxStaleness < 0 {
				return usagef("--max-staleness %s: want 0 or more", maxStaleness)
			}
			pool, err := a.connect(ctx)
			if err != nil {
				return err
			}
			defer pool.Close()
			srv, err := ui.New(ui.Config{Pool: pool, Addr: listen, Token: token, Actor: a.actorName(), AllowActions: allowActions, ShowPayloads: showPayloads,
				TrustProxy: trustProxy, Refresh: refresh, MaxStaleness: maxStaleness, Logger: a.logger()})
			if err != nil {
				return err
			}
			a.warnPendingMigrations(ctx, pool)
			actions := "actions disabled (read-only; --allow-actions enables them)"
			if allowActions {
				actions = "actions ENABLED (audited: 'pgcoord audit list')"
			}
			auth := "no token (loopback only)"
			if token != "" {
				auth = "token required"
			}
			return a.serve(ctx, listen, srv, "dashboard", actions+"; "+auth)
		},
	}
	f := cmd.Flags()
	f.StringVar(&listen, "listen", "127.0.0.1:8080", "address to listen on (host:port); beyond loopback needs a token")
	f.StringVar(&token, "auth-token", "", "token every request must carry (shows in ps: prefer --auth-token-file or $"+EnvUIToken+")")
	f.StringVar(&tokenFile, "auth-token-file", "", "file whose first line is the token (default $"+EnvUIToken+")")
	f.BoolVar(&trustProxy, "trust-proxy", false, "reachable only through a TLS reverse proxy: trust its X-Forwarded-Proto and X-Forwarded-For")
	f.BoolVar(&allowActions, "allow-actions", false, "enable operator actions (expire a lease, set a semaphore limit, retry a dead message, pause a schedule, drain a partition member, ...)")
	f.BoolVar(&showPayloads, "show-payloads", false, "show message payloads and stored response bodies")
	f.DurationVar(&refresh, "refresh", ui.DefaultRefresh, "how often pages refresh themselves")
	f.DurationVar(&maxStaleness, "max-staleness", defaultMaxStaleness, "how long past its period a job may go without success before it is overdue")
	return cmd
}

// checkListen checks --listen before anything starts: a usage error for a bad address, or
// for one beyond loopback without a token (saying where the token may come from).
func checkListen(addr, token, env string) error {
	err := ui.CheckListen(addr, token != "")
	if errors.Is(err, ui.ErrNeedsToken) {
		return usagef("%v (--auth-token, or $%s)", err, env)
	}
	if err != nil {
		return usageError{err}
	}
	return nil
}

// tokenFrom returns flag, else the value of the variable env.
func (a *app) tokenFrom(flag, env string) string {
	if flag != "" {
		return flag
	}
	v, _ := a.lookupEnv(env)
	return v
}

// maxTokenFile bounds what --auth-token-file reads.
const maxTokenFile = 4 << 10

// authToken returns a server command's token: --auth-token (with a warning: a flag shows
// in ps and in the shell's history), else the first line of --auth-token-file, else the
// variable env. Both flags at once, an unreadable or empty file, or a weak token
// (httpsec.CheckToken) are usage errors, said before anything connects.
func (a *app) authToken(flag, file, env string) (string, error) {
	var token string
	switch {
	case flag != "" && file != "":
		return "", usagef("--auth-token and --auth-token-file: give one")
	case flag != "":
		fmt.Fprintf(a.errOut, "pgcoord: warning: --auth-token shows in `ps` and the shell's history; prefer --auth-token-file or $%s\n", env)
		token = flag
	case file != "":
		f, err := os.Open(file)
		if err != nil {
			return "", usagef("--auth-token-file: %v", err)
		}
		defer f.Close()
		if st, err := f.Stat(); err == nil && st.Mode().Perm()&0o077 != 0 {
			fmt.Fprintf(a.errOut, "pgcoord: warning: --auth-token-file %s can be read by other users (mode %v): chmod 600 it\n", file, st.Mode().Perm())
		}
		b, err := io.ReadAll(io.LimitReader(f, maxTokenFile+1))
		if err != nil {
			return "", usagef("--auth-token-file: %v", err)
		}
		if len(b) > maxTokenFile {
			return "", usagef("--auth-token-file %s: over %d bytes: want the token alone", file, maxTokenFile)
		}
		token, _, _ = strings.Cut(string(b), "\n")
		if token = strings.TrimSpace(token); token == "" {
			return "", usagef("--auth-token-file %s: empty: %s > %s", file, "openssl rand -hex 32", file)
		}
	default:
		token, _ = a.lookupEnv(env)
	}
	if token == "" {
		return "", nil
	}
	if err := httpsec.CheckToken(token); err != nil {
		return "", usagef("auth token: %v", err)
	}
	return token, nil
}

// logger writes the server's logs to the error stream.
func (a *app) logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(a.errOut, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

// warnPendingMigrations says on stderr when the schema lacks migrations this build ships
// (without the audit table, actions fail).
func (a *app) warnPendingMigrations(ctx context.Context, pool *pgxpool.Pool) {
	if _, err := pgcoord.CheckSchema(ctx, pool); errors.Is(err, pgcoord.ErrSchemaOutdated) {
		fmt.Fprintln(a.errOut, "pgcoord: warning: the schema has pending migrations ('pgcoord migrate up'); pages of missing features fail")
	}
}

// serve serves h on addr until ctx is done, saying on stderr where it listens.
func (a *app) serve(ctx context.Context, addr string, h http.Handler, what, mode string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", addr, err)
	}
	srv := httpsec.NewServer(h) // bounded reads: a slow client cannot hold a connection
	fmt.Fprintf(a.errOut, "pgcoord: %s listening on http://%s/ — %s\n", what, ln.Addr(), mode)
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
		stop, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := srv.Shutdown(stop); err != nil {
			return err
		}
		fmt.Fprintf(a.errOut, "pgcoord: %s stopped\n", what)
		return nil
	}
}
