package cli

import (
	"encoding/json"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/pgcoord/pgcoord/internal/page"
	"github.com/pgcoord/pgcoord/internal/ui/audit"
	"github.com/pgcoord/pgcoord/pgcoord"
)

func (a *app) auditCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "audit",
		Short: "List the operator actions taken from the dashboard (audit log)",
		Long: `The audit log records every operator action taken from 'pgcoord ui --allow-actions' — who
(the token's identity, or "local"), from which address, when by the database clock, what
action on which target, with its details — written in the same transaction as the action.`,
		Args: noSubcommand,
		RunE: func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	cmd.AddCommand(a.auditListCommand())
	return cmd
}

// auditJSON is one entry in `audit list --json`.
type auditJSON struct {
	ID         int64          `json:"id"`
	At         *string        `json:"at"`
	Actor      string         `json:"actor"`
	RemoteAddr string         `json:"remote_addr"`
	Action     string         `json:"action"`
	Target     string         `json:"target"`
	Details    map[string]any `json:"details"`
}

func (a *app) auditListCommand() *cobra.Command {
	var (
		limit  int
		action string
	)
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List audited operator actions, newest first",
		Long: `List the audit log newest first: ID, time (database clock, UTC), actor, remote address,
action (lease.expire, semaphore.set_limit, ...), target and details. At most --limit
entries are shown (a note on stderr says when there are more); --action keeps one action.

With --json: an array ([] when empty) of objects with the keys id, at, actor, remote_addr,
action, target and details (an object).`,
		Example: `  pgcoord audit list
  pgcoord audit list --action lease.expire --json`,
		Args: exactArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			if limit < 1 {
				return usagef("--limit %d: want at least 1", limit)
			}
			pool, err := a.connect(ctx)
			if err != nil {
				return err
			}
			defer pool.Close()
			opts := audit.ListOpts{Action: action}
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
					js = append(js, auditJSON{ID: e.ID, At: jsonTime(e.At), Actor: e.Actor, RemoteAddr: e.RemoteAddr,
						Action: e.Action, Target: e.Target, Details: e.Details})
				}
				return a.printJSON(js)
			}
			tw := a.table()
			fmt.Fprintln(tw, "ID\tAT\tACTOR\tREMOTE\tACTION\tTARGET\tDETAILS")
			for _, e := range entries {
				details, _ := json.Marshal(e.Details)
				fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\n", e.ID, preciseTime(e.At), e.Actor, dash(e.RemoteAddr),
					e.Action, e.Target, details)
			}
			return tw.Flush()
		},
	}
	cmd.Flags().IntVar(&limit, "limit", defaultListLimit, "show at most this many entries")
	cmd.Flags().StringVar(&action, "action", "", "show only this action (lease.expire, semaphore.set_limit, ...)")
	return cmd
}
