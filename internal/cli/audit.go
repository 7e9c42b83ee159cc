package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"os"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/pgcoord/pgcoord/internal/page"
	"github.com/pgcoord/pgcoord/internal/ui/audit"
	"github.com/pgcoord/pgcoord/pgcoord"
)

func (a *app) auditCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "audit",
		Short: "List the operator actions taken from the CLI and the dashboard (audit log)",
		Long: `The audit log records every state-changing operator action — from the CLI (leases expire,
semaphores set-limit and drain, outbox retry, the collectors, fence guard, migrate down)
and from 'pgcoord ui --allow-actions' — who (the CLI's --actor, by default the OS user and
host; the name given at the dashboard's login with its token's identity), from which
client address, when by the database clock, what action on which target, with its
details, and the database role the session logged in as (session_user, which --actor
cannot change). An action's row is written in the same transaction as the action; a
collection, which runs in many short transactions, and a migration are recorded once they
finished. The log is append-only for every role but the table's owner: only the owner can
prune it (DELETE FROM pgcoord_audit WHERE at < ...); pgcoord gc never does.`,
		Args: noSubcommand,
		RunE: func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	cmd.AddCommand(a.auditListCommand())
	return cmd
}

// auditJSON is one entry in `audit list --json`.
type auditJSON struct {
	ID          int64          `json:"id"`
	At          *string        `json:"at"`
	Actor       string         `json:"actor"`
	SessionRole string         `json:"session_role"`
	RemoteAddr  string         `json:"remote_addr"`
	Action      string         `json:"action"`
	Target      string         `json:"target"`
	Details     map[string]any `json:"details"`
}

func (a *app) auditListCommand() *cobra.Command {
	var (
		limit  int
		action string
		lf     listFlags
	)
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List audited operator actions, newest first",
		Long: `List the audit log newest first: ID, time (database clock, UTC), actor (as claimed: --actor
or the dashboard's sign-in), login (the database role the writing session logged in as,
set by the database; - for entries older than pgcoord's audit migration 9), remote
address, action (lease.expire, semaphore.set_limit, ...), target and details. At most
--limit entries are shown (a note on stderr says when there are more); --action keeps one
action.

With --json: an array ([] when empty) of objects with the keys id, at, actor,
session_role, remote_addr, action, target and details (an object).`,
		Example: `  pgcoord audit list
  pgcoord audit list --action lease.expire --json`,
		Args: exactArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			if limit < 1 {
				return usagef("--limit %d: want at least 1", limit)
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
				return a.printAudit(ctx, pool, audit.ListOpts{Action: action, TargetPrefix: lf.prefix}, limit)
			})
		},
	}
	cmd.Flags().IntVar(&limit, "limit", defaultListLimit, "show at most this many entries")
	cmd.Flags().StringVar(&action, "action", "", "show only this action (lease.expire, semaphore.set_limit, ...)")
	addListFlags(cmd, &lf, "only entries whose target starts with this")
	return cmd
}

// printAudit reads the newest limit entries opts selects and prints them.
func (a *app) printAudit(ctx context.Context, pool *pgxpool.Pool, opts audit.ListOpts, limit int) error {
	entries, more, err := page.Collect(limit, pgcoord.MaxListLimit, func(last *audit.Entry, n int) ([]audit.Entry, error) {
		if last != nil {
			opts.Before = last.ID
		}
		opts.Limit = n
		return audit.List(ctx, pool, &opts)
	})
	if err != nil {
		return argError(err)
	}
	if more {
		fmt.Fprintf(a.errOut, "pgcoord: showing the newest %d audit entries; there are more (raise --limit)\n", limit)
	}
	if a.json {
		js := make([]auditJSON, 0, len(entries))
		for _, e := range entries {
			js = append(js, auditJSON{ID: e.ID, At: jsonTime(e.At), Actor: e.Actor, SessionRole: e.SessionRole, RemoteAddr: e.RemoteAddr,
				Action: e.Action, Target: e.Target, Details: e.Details})
		}
		return a.printJSON(js)
	}
	tw := a.table()
	fmt.Fprintln(tw, "ID\tAT\tACTOR\tLOGIN\tREMOTE\tACTION\tTARGET\tDETAILS")
	for _, e := range entries {
		details, _ := json.Marshal(e.Details)
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", e.ID, preciseTime(e.At), e.Actor, dash(e.SessionRole), dash(e.RemoteAddr),
			e.Action, e.Target, details)
	}
	return tw.Flush()
}

// actorName is who runs this command, for the audit log: --actor, else the OS user and host.
func (a *app) actorName() string {
	if a.actor != "" {
		return a.actor
	}
	host, _ := os.Hostname()
	return dash(a.osUser()) + "@" + dash(host)
}

// record writes the audit row of a state-changing command in db — the transaction that
// made the change, where there is one — with the client address the server sees.
func (a *app) record(ctx context.Context, db pgcoord.DBTX, action, target string, details map[string]any) error {
	var addr string
	if err := db.QueryRow(ctx, `SELECT coalesce(host(inet_client_addr()), 'local socket')`).Scan(&addr); err != nil {
		return err
	}
	_, err := audit.Record(ctx, db, audit.Entry{Actor: a.actorName(), RemoteAddr: addr, Action: action, Target: target, Details: details})
	if err != nil {
		return fmt.Errorf("audit: %w", err)
	}
	return nil
}

// audited runs change and its audit row in one transaction of pool.
func (a *app) audited(ctx context.Context, pool *pgxpool.Pool, action, target string, change func(tx pgx.Tx) (map[string]any, error)) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		details, err := change(tx)
		if err != nil {
			return err
		}
		return a.record(ctx, tx, action, target, details)
	})
}
